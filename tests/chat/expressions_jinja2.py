#!/usr/bin/env python3
"""Expressions and statements beyond what the chat templates use, rendered by Python's jinja2
as transformers configures it, for chat_compare --jinja (tests/chat/run runs it where jinja2 is
installed). Writes one JSON object a line: {id, source, vars, expected | error}.

    expressions_jinja2.py > expressions.jsonl
"""
import json
import sys

import jinja2

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[loopcontrols])
env.filters["tojson"] = tojson


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env.globals["raise_exception"] = raise_exception

V = {"s": " Hello World ", "l": [3, 1, 2], "d": {"b": 1, "a": [1, 2.5, None]}, "f": 2.0, "n": None, "t": True,
     "ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "u": "héllo wörld", "e": ""}
T = [
 "{{ nothing|length }}|{{ nothing|default('d') }}|{{ nothing|trim }}|{{ nothing|list }}|{{ nothing is undefined }}",
 "{{ 'tab\\there' }}|{{ \"q'uote\" }}|{{ 'a\\u00e9b' }}|{{ 'x' 'y' }}|{{ '\\x41' }}",
 "{{ [1,2,3]|join }}|{{ ['a',none,1]|join('-') }}|{{ d|length }}|{{ d|list }}|{{ d.a|length }}",
 "{% for x in 'ab' %}{{ x }}{{ loop.first }}{% endfor %}|{% for c in d %}{{ c }}{% endfor %}",
 "{{ [3,'a']|sort if false else 'skip' }}|{{ ['b','A','a']|sort }}|{{ ['b','A','a']|sort(case_sensitive=true) }}",
 "{{ [{'a': 2}, {'a': 1}]|sort(attribute='a') }}|{{ ms|map(attribute='content')|list }}|{{ ms|map(attribute='zz', default='D')|list }}",
 "{{ 5 is odd }}|{{ 4 is even }}|{{ 'A' is upper }}|{{ none is sameas none }}|{{ 1 is eq 1 }}|{{ 1 is ne 1 }}|{{ 2 is gt 1 }}|{{ 2 is le 1 }}",
 "{{ 1 in [1.0] }}|{{ 'a' not in 'xyz' }}|{{ 'k' in {'k': 0} }}|{{ none in [none] }}|{{ [] in [[]] }}",
 "{{ 'AbC'.lower() }}{{ 'abc'.upper() }}|{{ 'hello world'.title() }}|{{ 'ÉCOLE'|lower }}|{{ 'straße'|upper }}",
 "{{ d['b'] + 1 }}|{{ (d.b * 2.5)|string }}|{{ 3 / 2 }}|{{ 4 / 2 }}|{{ 10 % 3 }}|{{ -10 % 3 }}|{{ 10.5 % 3 }}",
 "{{ s|replace(' ', '_') }}|{{ s|replace('l', 'L', 2) }}",
 "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}|{% for i in [1] %}{% set x = 3 %}{% endfor %}{{ x }}",
 "{{ ms[0].role }}|{{ ms[-1]['content'] }}|{{ ms[5] is defined }}|{{ ms|length > 1 }}|{{ (ms|first).role }}",
 "{{ t and 'y' or 'n' }}|{{ n and 'y' or 'n' }}|{{ not n }}|{{ not not t }}|{{ true and false or true }}",
 "{{ '  x  '|trim('x ') }}|{{ 'xxhixx'|trim('x') }}|{{ '\u3000a\u00a0'|trim }}|{{ '\ufeffa'|trim|length }}|{{ '\x85a'|trim|length }}",
 "{{ {'a': 1, 'b': {'c': [1, 2]}}|tojson(indent=4) }}|{{ []|tojson(indent=2) }}|{{ {}|tojson }}|{{ [[]]|tojson(indent=1) }}",
 "{{ 0.1 + 0.2 }}|{{ 1/3 }}|{{ 100000000000000000.0 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ -0.0 }}",
 "{{ ms|selectattr('role')|list|length }}|{{ ms|selectattr('content', 'in', ['a', 'z'])|map(attribute='role')|first }}",
  "{{ l[0:1] + l[2:] }}|{{ l[-1:-3:-1] }}|{{ l[10:] }}|{{ l[:-10] }}",
 "{%- for m in ms -%}\n  {{ m.role }}\n{%- endfor -%}\n|{#- c -#}\n  x",
 "{{ s|trim|lower }}|{{ s.split() }}|{{ s.strip().split(' ') }}",
 "{{ l|sort }}|{{ l|sort(reverse=true) }}|{{ l|max }}|{{ l|min }}|{{ l|sum }}|{{ l|length }}",
 "{{ d }}|{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d.items()|list }}|{{ d|dictsort }}",
 "{{ f }}|{{ f|int }}|{{ f|string }}|{{ 7/2 }}|{{ 7//2 }}|{{ -7//2 }}|{{ 7%-3 }}|{{ 2**-1 }}|{{ 1e100 }}|{{ 1.5e-7 }}",
 "{{ n }}|{{ t }}|{{ n is none }}|{{ t is true }}|{{ undefined_x is defined }}|{{ n|default('x') }}|{{ n|default('x', true) }}",
 "{% for m in ms %}{{ loop.index }}{{ m.role }}{{ loop.revindex0 }}{{ loop.previtem.role if loop.previtem }}{% endfor %}",
 "{{ ms|map(attribute='role')|join(',') }}|{{ ms|selectattr('role','equalto','user')|list }}|{{ ms|rejectattr('content','in','b')|list|length }}",
 "{{ u|upper }}|{{ u|title }}|{{ u|capitalize }}|{{ u[1] }}|{{ u[-3:] }}|{{ u[::2] }}|{{ u|length }}|{{ u|reverse }}",
 "{{ 'a' ~ 1 ~ 2.5 ~ none ~ true }}|{{ [1,2] + [3] }}|{{ 'ab' * 3 }}|{{ (1, 2) }}|{{ {'k': (1,)} }}",
 "{{ e|length }}|{{ e is string }}|{{ not e }}|{{ e or 'z' }}|{{ e and 'z' }}|{{ 0 or [] }}",
 "{% set ns = namespace(a=1, b=[]) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}|{{ ns.b }}",
 "{% macro m(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }}|{{ m(1, b=3) }}|{{ m(a=5) }}",
 "{{ 'x' if t else 'y' }}|{{ 'x' if n else 'y' }}|{{ [1,2,3][1:] }}|{{ [1,2,3][::-1] }}|{{ 'abc'[5:] }}",
 "{{ 'a,b,,c'.split(',', 2) }}|{{ 'a  b'.split(' ') }}|{{ ' x '.lstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'aXbX'.replace('X','') }}",
 "{{ 1 == 1.0 }}|{{ true == 1 }}|{{ 'a' == 'a' }}|{{ [1] == [1] }}|{{ none == false }}|{{ '' == false }}|{{ 1 < 2.5 }}|{{ 'a' < 'b' }}",
 "{{ d.b }}|{{ d['a'][1] }}|{{ d.a.1 }}|{{ d.get('z', 'dz') }}|{{ d.keys()|list }}|{{ 'b' in d }}|{{ 2.5 in d.a }}",
 "{{ range(5)|list }}|{{ range(1, 10, 3)|list }}|{{ range(5, 0, -2)|list }}|{{ range(0)|list }}",
 "{{ [1, 'a', none, true, 2.0]|tojson }}|{{ 'é\"\\\\\\n'|tojson }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ {'b':1,'a':2}|tojson(sort_keys=true) }}",
 "{{ l|first }}|{{ l|last }}|{{ l|unique|list }}|{{ l|reverse|list }}|{{ l|select('odd')|list }}|{{ l|reject('even')|list }}|{{ l|map('string')|join }}",
 "{{ '0x1A'|int }}|{{ '1_000'|int }}|{{ ' 2 '|float }}|{{ '1_0'|float }}|{{ '1e3'|int }}|{{ ' -7\\n'|int }}|{{ 'nan'|int(5) }}|{{ '.5'|float }}|{{ '1__0'|int(9) }}|{{ '5.'|float }}|{{ '1e5_0'|float }}|{{ '12abc'|int(3) }}|{{ -2.9|int }}|{{ '+4.5e-1'|float }}|{{ 'e5'|float(1) }}|{{ '1e'|float(2) }}|{{ '_1'|int(8) }}|{{ '0x10'|float(6) }}",
 "{{ 5|round }}|{{ true|round }}|{{ 1250|round(-2) }}|{{ 1350|round(-2) }}|{{ -1250|round(-2) }}|{{ -1351|round(-2) }}|{{ 123|round(-30) }}|{{ 5|round(2) }}|{{ 5|round(0, 'floor') }}|{{ 2.5|round }}|{{ 'héllo wörld x_y 3.4 a-b'|wordcount }}|{{ 'e\u0301t\u00e9 ²3 ⅷ'|wordcount }}|{{ ''|wordcount }}|{{ \"it's o'neil x.y 3rd ﬁne ǆ (a[b{c<d -e\"|title }}|{{ 'hello WORLD'|title }}|{{ 'ß x'|title }}|{{ \"it's o'neil\".title() }}",
 "{{ 'a\u2028b\u0085c\u000bd\u001ce\\r\\nf\\rg\\n'|indent(2) }}|{{ 'a\\r\\n\\nb'|indent(1, true, true) }}|{{ 'x\u2029'|indent(3, blank=true) }}",
 "{{ true is number }}|{{ false is integer }}|{{ 1 is number }}|{{ 'x' is number }}|{{ none is number }}",
 "{{ 'a\\r'|indent }}|{{ 'a\\r'|indent(2, blank=true) }}|{{ 'a\\r\\r'|indent(1, blank=true) }}|{{ '\\r'|indent(1, true) }}|{{ 'a\\rb\\r'|indent(1) }}",
 "{{ '0x1A'|int(base=16) }}|{{ 'ff'|int(0, 16) }}|{{ '0o17'|int(base=0) }}|{{ '-0b1_01'|int(base=2) }}|{{ ' z '|int(0, 36) }}|{{ '010'|int(7, 0) }}|{{ '0'|int(7, 0) }}|{{ '1.5'|int(base=16) }}|{{ '0x_1f'|int(base=16) }}|{{ '12'|int(base=8) }}|{{ '19'|int(3, 8) }}|{{ '\u00a042\u3000'|int }}|{{ '\u2003 2.5 '|float }}|{{ 5|int(base=16) }}|{{ '00'|int(9, 0) }}|{{ '1__0'|int(4, 16) }}|{{ '_1'|int(4, 16) }}|{{ 'g'|int(4, 16) }}",
 "{{ '%d' if false }}|{{ 3|abs }}|{{ -3.5|abs }}|{{ 2.675|round(2) }}|{{ 3.7|int }}|{{ '42'|int }}|{{ 'x'|int(7) }}|{{ '3.5'|float }}",
 "{{ 'ab\ncd'|indent(2) }}|{{ 'ab\ncd'|indent(2, true) }}|{{ 'one two  three'|wordcount }}|{{ '<&>'|e }}",
 "  {% if true %}\n    a\n  {% endif %}\n  b\n{%- if true %} c {% endif -%}\n d",
 "{% for i in range(3) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% else %}none{% endfor %}|{% for i in [] %}x{% else %}empty{% endfor %}",
 "{% for k, v in d.items() if k != 'b' %}{{ k }}={{ v }}{{ loop.length }}{% endfor %}",
 "{{ 'abc'.startswith(('x', 'a')) }}|{{ 'abc'.endswith('bc') }}|{{ 'abcabc'.find('c') }}|{{ 'abcabc'.count('bc') }}|{{ '-'.join(['a','b']) }}",
 "{{ l is sequence }}|{{ d is mapping }}|{{ s is iterable }}|{{ 3 is divisibleby 3 }}|{{ 2.0 is integer }}|{{ 2.0 is float }}|{{ 'ab' is lower }}|{{ range is callable }}",
 "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}[{{ a }}]{% endset %}{{ c }}{{ c|length }}",
 "{{ 10 // 3 * 2 + 1 - 4 % 3 ** 2 }}|{{ -2 ** 2 }}|{{ (1 + 2) * 3 }}|{{ 1 ~ 2 * 3 }}|{{ not 1 == 2 }}",
]
# Refused by both: errors of the template, not of the data.
T += [
    "{{ 'a' + 1 }}", "{{ 1 + 2 ~ 3 }}", "{{ missing.attr }}", "{{ 1 // 0 }}", "{{ [1, 2] < 'a' }}",
    "{% for a, b in [1] %}{% endfor %}", "{{ none.x }}", "{{ raise_exception('stop') }}",
]

for i, t in enumerate(T):
    case = {"id": i, "source": t, "vars": V}
    try:
        case["expected"] = env.from_string(t).render(**V)
    except Exception as e:  # noqa: BLE001 - any refusal counts as one
        case.pop("expected", None)
        case["error"] = f"{type(e).__name__}: {e}"
    sys.stdout.write(json.dumps(case, ensure_ascii=False) + "\n")
