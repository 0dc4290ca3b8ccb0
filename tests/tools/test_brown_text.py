#!/usr/bin/env python3
"""tools/train/brown_text.py on a made-up corpus in the Brown corpus' Form C: tags dropped, ``
and '' as straight quotes, no space before closing punctuation or after opening, doubled ";"
once, a tab opening a paragraph and the lines after it continuing it, documents in file-name
order; and a corpus that is not 500 documents refused. Prints "N passed, M failed".
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "train", "brown_text.py")
FIRST = ("\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc (/( it/pps "
         "was/bedz )/) over/rb ;/. ;/.\nHe/pps left/vbd ./.\n\n\n\tA/at new/jj one/cd ?/. ?/.\n")
WANT = 'The jury said "no evidence", and (it was) over; He left.\nA new one?'


def main():
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus")
        os.mkdir(corpus)
        names = [f"c{g}{i:02d}" for g in "abcdefghjk" for i in range(1, 51)]
        for n in names:
            with open(os.path.join(corpus, n), "w") as f:
                f.write(FIRST if n == "ca01" else f"\n\n\tDocument/nn {n}/np ./.\n")
        for extra in ("README", "cats.txt", "CONTENTS"):
            open(os.path.join(corpus, extra), "w").write("not a document\n")
        out = os.path.join(tmp, "brown.jsonl")
        subprocess.run([sys.executable, SCRIPT, corpus, out], check=True, timeout=60)
        docs = [json.loads(line) for line in open(out)]
        check(len(docs) == 500 and [d["id"] for d in docs] == sorted(names),
              "500 documents in file-name order, the other files left out")
        check(docs[0]["text"] == WANT, f"plain text: {docs[0]['text']!r}")
        check(docs[1]["text"] == "Document ca02.", f"a one-line document: {docs[1]['text']!r}")
        os.remove(os.path.join(corpus, "ca02"))
        res = subprocess.run([sys.executable, SCRIPT, corpus, out], capture_output=True,
                             text=True, timeout=60)
        check(res.returncode != 0 and "499 documents, 500 expected" in res.stderr,
              f"499 documents refused: {res.stderr.strip()!r}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
