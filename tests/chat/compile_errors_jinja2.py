#!/usr/bin/env python3
"""Templates that are and are not Jinja, for chat_compare --compile (tests/chat/run runs it where
jinja2 is installed): the chat templates of the configs given, each cut, with characters left
out, added or copied from elsewhere in it (seeded), compiled by Python's jinja2 as transformers
configures it. Writes one JSON object a line: {id, source, compiles, error}.

chat_compare --compile checks that pagoda refuses as not Jinja (PAGODA_EINVAL, which fails a
model's start: text/text_model.h) only templates that jinja2 refuses too; those that jinja2
compiles and pagoda cannot are PAGODA_EUNSUPPORTED (chats refused, the model served).

    compile_errors_jinja2.py COUNT SEED NAME=CONFIG... > compile.jsonl
"""
import json
import random
import sys

from reference_jinja2 import transformers_env

PIECES = ["{", "}", "%", "(", ")", "[", "]", "'", '"', "|", "-", "=", ",", ".", " ", "if ",
          "end", "x", "{{", "}}", "{%", "%}", "{#", "#}", " is ", " in ", " not "]


def templates(configs):
    out = []
    for arg in configs:
        with open(arg.split("=", 1)[1], encoding="utf-8") as f:
            t = json.load(f).get("chat_template")
        if isinstance(t, str):
            out.append(t)
        elif isinstance(t, list):
            out += [x["template"] for x in t if isinstance(x.get("template"), str)]
    return out


def mutate(rng, t):
    k = rng.randrange(len(t))
    op = rng.randrange(4)
    if op == 0:
        return t[:k]
    if op == 1:
        return t[:k] + t[k + rng.randint(1, 5):]
    if op == 2:
        return t[:k] + rng.choice(PIECES) + t[k:]
    j = rng.randrange(len(t))
    return t[:k] + t[j:j + rng.randint(1, 12)] + t[k:]


def main():
    count, seed = int(sys.argv[1]), int(sys.argv[2])
    tpls = templates(sys.argv[3:])
    env = transformers_env()
    rng = random.Random(seed)
    for i in range(count):
        source = mutate(rng, rng.choice(tpls))
        try:
            env.from_string(source)
            case = {"id": i, "source": source, "compiles": True}
        except Exception as e:  # noqa: BLE001 (any refusal: syntax, assertion, Python's compile)
            case = {"id": i, "source": source, "compiles": False, "error": str(e)[:200]}
        sys.stdout.write(json.dumps(case, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
