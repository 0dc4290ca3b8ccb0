#!/usr/bin/env python3
"""The second reference of tests/chat/run: Python's jinja2 configured as transformers'
apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson, raise_exception and strftime_now), rendering the conversations that
reference.mjs wrote with the same variables. Rewrites each case's expected (or error) with
jinja2's output and keeps @huggingface/jinja's corrected output as expected_raw, so that
chat_compare counts both; the python_only conversations, which the npm package renders
differently, are compared here.

    reference_jinja2.py TEMPLATE_NAME=CONFIG... < cases.jsonl > cases-jinja2.jsonl
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """transformers' {% generation %} tags (AssistantTracker), here rendering their body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def transformers_env():
    """jinja2 as transformers' apply_chat_template configures it (compile_errors_jinja2.py too)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = transformers_env()
    templates = {}
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        with open(path, encoding="utf-8") as f:
            templates[name] = env.from_string(json.load(f)["chat_template"])
    for line in sys.stdin:
        case = json.loads(line)
        raw = case.get("expected")
        case.pop("expected", None)
        case.pop("error", None)
        try:
            case["expected"] = templates[case["template"]].render(**case["vars"])
        except Exception as e:  # the template refused: any error counts as one
            case["error"] = f"{type(e).__name__}: {e}"
        case["expected_raw"] = raw
        case.pop("python_only", None)  # compared here, where Python is the reference
        sys.stdout.write(json.dumps(case, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
