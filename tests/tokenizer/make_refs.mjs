// The references: what Hugging Face `tokenizers` (the npm binding of the Rust library) makes of
// each string of a corpus (gen_corpus.mjs), and of random id sequences.
//
//   node make_refs.mjs --tokenizer TOKENIZER_JSON --corpus CORPUS_JSONL [--seed N] [--random N]
//
// Needs the cache's node_modules on NODE_PATH (tests/tokenizer/fetch-references prints it).
// Writes JSON lines on stdout:
//   {"header": {...}}                                   first: versions, file, counts
//   {"kind": K, "text": S, "ids": [...], "ids_plain": [...], "dec": [4 strings]}
//       ids = encode(S, add_special_tokens=true), ids_plain = encode(S, false),
//       dec = [decode(ids, skip=false), decode(ids, skip=true),
//              decode(ids_plain, skip=false), decode(ids_plain, skip=true)]
//   {"kind": "vocab", "vocab_size": N, "tokens": [id_to_token(id)...], "to_id": [...]}
//       second: getVocabSize(with added tokens), each id's string, token_to_id of that string
//   {"kind": "ids:SUB", "ids": [...], "dec": [decode(ids, false), decode(ids, true)]}
//       --random sequences (default 1500) not from encode: uniform ids, byte tokens that are
//       partial UTF-8 (byte-level pieces, <0x80>-style byte fallback), broken encodings,
//       special tokens; decode must match HF's lossy conversion.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.cwd(), 'x.js'));
const { Tokenizer } = require('tokenizers');

const args = { seed: 1616, random: 1500, tokenizer: null, corpus: null };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i];
  const v = process.argv[i + 1];
  if (v === undefined) throw new Error(`${k} needs a value`);
  if (k === '--seed') args.seed = Number(v);
  else if (k === '--random') args.random = Number(v);
  else if (k === '--tokenizer') args.tokenizer = v;
  else if (k === '--corpus') args.corpus = v;
  else throw new Error(`unknown argument ${k}`);
}
if (!args.tokenizer || !args.corpus) throw new Error('usage: make_refs.mjs --tokenizer TOKENIZER_JSON --corpus CORPUS_JSONL [--seed N] [--random N]');

let state = (args.seed >>> 0) ^ 0x85ebca6b;
function next() {
  state = (state + 0x9e3779b9) >>> 0;
  let z = state;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}
const int = (n) => next() % n;
const range = (lo, hi) => lo + int(hi - lo + 1);
const pick = (a) => a[int(a.length)];
const chance = (p) => next() / 4294967296 < p;

const tok = Tokenizer.fromFile(args.tokenizer);
const json = JSON.parse(fs.readFileSync(args.tokenizer, 'utf8'));
const corpus = fs.readFileSync(args.corpus, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));

const CONCURRENCY = 32; // encodes in flight (the binding runs them on libuv's thread pool)

async function encodeEntry(e) {
  const a = await tok.encode(e.text, null, { addSpecialTokens: true });
  const b = await tok.encode(e.text, null, { addSpecialTokens: false });
  const ids = a.getIds();
  const plain = b.getIds();
  const dec = await Promise.all([
    tok.decode(ids, false), tok.decode(ids, true), tok.decode(plain, false), tok.decode(plain, true),
  ]);
  return { kind: e.kind, text: e.text, ids, ids_plain: plain, dec };
}

async function decodeEntry(sub, ids) {
  const dec = await Promise.all([tok.decode(ids, false), tok.decode(ids, true)]);
  return { kind: `ids:${sub}`, ids, dec };
}

async function mapConcurrent(items, f) {
  const out = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const i = next++;
      out[i] = await f(items[i]);
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return out;
}

// ---- the vocabulary's kinds of ids ---------------------------------------------------------
const vocabSize = tok.getVocabSize(true);
const allIds = [];
for (let id = 0; id < vocabSize; id++) if (tok.idToToken(id) !== null) allIds.push(id);
const specialIds = json.added_tokens.filter((t) => t.special).map((t) => t.id);
const addedIds = json.added_tokens.map((t) => t.id);

function hasDecoder(d, type) {
  if (!d) return false;
  if (d.type === type) return true;
  return (d.decoders || []).some((x) => hasDecoder(x, type));
}
// GPT-2's byte map: the printable bytes stand for themselves, the others are shifted to 256+.
const byteOfChar = new Map();
{
  const printable = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (printable.includes(b)) byteOfChar.set(String.fromCodePoint(b), b);
    else byteOfChar.set(String.fromCodePoint(256 + n++), b);
  }
}
const fatal = new TextDecoder('utf-8', { fatal: true });
function isValidUtf8(bytes) {
  try {
    fatal.decode(Uint8Array.from(bytes));
    return true;
  } catch {
    return false;
  }
}
// Ids whose bytes alone are not valid UTF-8: the pieces of multi-byte characters.
const partialIds = [];
const addedSet = new Set(addedIds);
if (hasDecoder(json.decoder, 'ByteLevel')) {
  for (const id of allIds) {
    if (addedSet.has(id)) continue;
    const bytes = [];
    let ok = true;
    for (const ch of tok.idToToken(id)) {
      const b = byteOfChar.get(ch);
      if (b === undefined) { ok = false; break; }
      bytes.push(b);
    }
    if (ok && !isValidUtf8(bytes)) partialIds.push(id);
  }
}
const byteFallbackIds = []; // <0x00> .. <0xFF>, index = byte
if (hasDecoder(json.decoder, 'ByteFallback')) {
  for (let b = 0; b < 256; b++) {
    const id = tok.tokenToId(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
    if (id !== null) byteFallbackIds[b] = id;
  }
  for (let b = 0x80; b < 256; b++) if (byteFallbackIds[b] !== undefined) partialIds.push(byteFallbackIds[b]);
}

// ---- random sequences ----------------------------------------------------------------------
function utf8Of(cpNum) {
  return [...Buffer.from(String.fromCodePoint(cpNum), 'utf8')];
}
function randomSequence(i, encoded) {
  const subs = ['uniform', 'partial', 'broken', 'special', 'mixed', 'bytes'];
  const sub = subs[i % subs.length];
  const n = range(1, 30);
  const ids = [];
  switch (sub) {
    case 'uniform':
      for (let k = 0; k < n; k++) ids.push(pick(allIds));
      break;
    case 'partial':
      for (let k = 0; k < n; k++) ids.push(partialIds.length > 0 && chance(0.8) ? pick(partialIds) : pick(allIds));
      break;
    case 'broken': { // an encoding cut, with one id dropped or moved: characters split apart
      const src = pick(encoded).ids_plain;
      const from = range(0, Math.max(0, src.length - 1));
      ids.push(...src.slice(from, from + range(1, 40)));
      if (ids.length > 1 && chance(0.5)) ids.splice(int(ids.length), 1);
      if (ids.length > 1 && chance(0.5)) {
        const [x] = ids.splice(int(ids.length), 1);
        ids.splice(int(ids.length + 1), 0, x);
      }
      if (ids.length === 0) ids.push(pick(allIds));
      break;
    }
    case 'special':
      for (let k = 0; k < n; k++) ids.push(chance(0.5) ? pick(specialIds.length > 0 ? specialIds : allIds) : chance(0.5) ? pick(addedIds) : pick(allIds));
      break;
    case 'mixed':
      for (let k = 0; k < n; k++) {
        const r = int(4);
        ids.push(r === 0 && specialIds.length > 0 ? pick(specialIds) : r === 1 && partialIds.length > 0 ? pick(partialIds) : pick(allIds));
      }
      break;
    default: { // byte tokens spelling whole characters, some cut short
      if (byteFallbackIds.length === 0) {
        for (let k = 0; k < n; k++) ids.push(partialIds.length > 0 ? pick(partialIds) : pick(allIds));
        break;
      }
      const chars = range(1, 8);
      for (let k = 0; k < chars; k++) {
        const c = pick([0xe9, 0x4e2d, 0x1f600, 0x10ffff, 0xfffd, range(0x80, 0x10ffff)]);
        let bytes = (c >= 0xd800 && c < 0xe000) ? utf8Of(0xfffd) : utf8Of(c);
        if (chance(0.3)) bytes = bytes.slice(0, range(1, bytes.length));
        for (const b of bytes) ids.push(byteFallbackIds[b]);
        if (chance(0.3)) ids.push(pick(allIds));
      }
    }
  }
  return [sub, ids];
}

const encoded = await mapConcurrent(corpus, encodeEntry);
const seqs = [];
for (let i = 0; i < args.random; i++) seqs.push(randomSequence(i, encoded));
const decoded = await mapConcurrent(seqs, ([sub, ids]) => decodeEntry(sub, ids));

const pkg = JSON.parse(fs.readFileSync(require.resolve('tokenizers/package.json'), 'utf8'));
const header = {
  tokenizers_version: pkg.version,
  tokenizer: args.tokenizer,
  vocab_size: vocabSize,
  strings: encoded.length,
  random_sequences: decoded.length,
  partial_ids: partialIds.length,
  byte_fallback_ids: byteFallbackIds.filter((x) => x !== undefined).length,
};
fs.writeSync(1, JSON.stringify({ header }) + '\n');
// The vocabulary as HF sees it: every id's string (null where none) and the id HF gives back
// for that string.
const tokens = [];
const toId = [];
for (let id = 0; id < vocabSize; id++) {
  const t = tok.idToToken(id);
  tokens.push(t);
  toId.push(t === null ? null : tok.tokenToId(t));
}
fs.writeSync(1, JSON.stringify({ kind: 'vocab', vocab_size: vocabSize, tokens, to_id: toId }) + '\n');
for (const r of encoded.concat(decoded)) fs.writeSync(1, JSON.stringify(r) + '\n');
