// The other half of tests/tokenizer/unicode-deltas: which code points HF's regexes (Oniguruma,
// through npm `tokenizers`) put in each class, against PCRE2's (pcre2_classes' lines on stdin).
//
//   pcre2_classes L Lu ... | NODE_PATH=... node unicode_deltas.mjs
//
// HF's set of a class: a tokenizer with a Split pre-tokenizer on \p{CLASS}, behavior Removed,
// encodes every scalar value; the pieces left (their offsets are code point offsets) are the
// code points outside the class. Prints each class's additions (in HF's, not in PCRE2's) as a
// C string of \x{..} ranges, an entry of HF_CLASSES in tokenizer/pretokenize.c; a class where
// PCRE2 has a code point HF does not gets HF's whole set instead (whole: true).
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.cwd(), 'x.js'));
const { Tokenizer } = require('tokenizers');

function hfSet(cls) {
  const json = {
    version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: `\\p{${cls}}` }, behavior: 'Removed', invert: false },
    post_processor: null, decoder: null,
    model: { type: 'WordLevel', vocab: { '[UNK]': 0 }, unk_token: '[UNK]' },
  };
  return Tokenizer.fromString(JSON.stringify(json));
}

async function hfMembers(cls) {
  const tok = hfSet(cls);
  const inClass = new Uint8Array(0x110000);
  const CHUNK = 0x10000;
  for (let lo = 0; lo < 0x110000; lo += CHUNK) {
    const cps = [];
    for (let cp = lo; cp < lo + CHUNK; cp++) if (cp < 0xd800 || cp > 0xdfff) cps.push(cp);
    const enc = await tok.encode(String.fromCodePoint(...cps), null, { addSpecialTokens: false });
    const kept = new Uint8Array(cps.length);
    for (const [s, e] of enc.getOffsets()) for (let i = s; i < e; i++) kept[i] = 1;
    cps.forEach((cp, i) => { if (!kept[i]) inClass[cp] = 1; });
  }
  return inClass;
}

function ranges(set) {
  const out = [];
  for (let cp = 0; cp < 0x110000; cp++) {
    if (!set[cp]) continue;
    let end = cp;
    while (end + 1 < 0x110000 && set[end + 1]) end++;
    out.push([cp, end]);
    cp = end;
  }
  return out;
}

const hex = (cp) => `\\\\x{${cp.toString(16)}}`;
for (const line of fs.readFileSync(0, 'utf8').split('\n').filter(Boolean)) {
  const [cls, ...rs] = line.split(' ');
  const pcre = new Uint8Array(0x110000);
  for (const r of rs) {
    const [a, b] = r.split('-').map((x) => parseInt(x, 16));
    for (let cp = a; cp <= b; cp++) pcre[cp] = 1;
  }
  const hf = await hfMembers(cls);
  const add = new Uint8Array(0x110000);
  const lack = new Uint8Array(0x110000);
  for (let cp = 0; cp < 0x110000; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    if (hf[cp] && !pcre[cp]) add[cp] = 1;
    if (!hf[cp] && pcre[cp]) lack[cp] = 1;
  }
  // A class PCRE2 gives a code point HF's lacks (U+1171E left Mn for Mc in Unicode 16) is
  // spelled out whole: an addition cannot take one away, and PCRE2 10.42 has no class
  // subtraction.
  const whole = lack.some((x) => x);
  const set = whole ? hf : add;
  const rs2 = ranges(set);
  const n = set.reduce((s, x) => s + x, 0);
  if (rs2.length === 0) continue;
  const parts = rs2.map(([a, b]) => (a === b ? hex(a) : `${hex(a)}-${hex(b)}`));
  const lines = [];
  let cur = '';
  for (const part of parts) {
    if (cur.length + part.length > 80) lines.push(cur), (cur = '');
    cur += part;
  }
  lines.push(cur);
  const what = whole ? `HF's whole set, ${n} code points in ${rs2.length} ranges`
    : `${n} code points in ${rs2.length} ranges`;
  console.log(`    /* ${what} */`);
  console.log(`    {"${cls}", ${whole}, ${lines.map((l) => `"${l}"`).join('\n     ')}},`);
}
