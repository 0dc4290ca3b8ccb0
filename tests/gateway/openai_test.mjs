// The OpenAI-compatible gateway driven by the real `openai` npm client (tests/gateway/run).
//
//   node openai_test.mjs NODE_MODULES BASE_URL MODEL KEY OTHER_KEY SMALL_TENANT_KEY [abort]
//
// With "abort" it only starts one long stream (2000 tokens) and aborts it after three chunks:
// the caller checks with the router's Stats that the request stopped long before its end.
// Prints "ok ..." / "FAIL ..." lines and "N passed, M failed" last; exits 1 on any failure.
// Finishes it made are counted and printed as "finished N" for the caller's /metrics check.
import { createRequire } from 'node:module';
const [nodeModules, baseURL, model, key, badKey, smallKey, mode] = process.argv.slice(2);
const require = createRequire(nodeModules + '/');
const OpenAI = require('openai').default ?? require('openai');

let passed = 0, failed = 0, finished = 0;
function check(cond, what) {
  if (cond) { passed++; console.log('ok   ' + what); }
  else { failed++; console.log('FAIL ' + what); }
}
const client = new OpenAI({ apiKey: key, baseURL, maxRetries: 0, timeout: 120000 });

async function completion(params) {
  const r = await client.completions.create({ model, ...params });
  finished++;
  return r;
}
async function completionStream(params) {
  const s = await client.completions.create({ model, ...params, stream: true,
                                               stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  const tokens = [], offsets = [];
  for await (const c of s) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
      if (ch.logprobs) { tokens.push(...ch.logprobs.tokens); offsets.push(...ch.logprobs.text_offset); }
    }
  }
  finished++;
  return { text, finish, usage, chunks, tokens, offsets };
}
async function chat(params) {
  const r = await client.chat.completions.create({ model, ...params });
  finished++;
  return r;
}
async function chatStream(params) {
  const s = await client.chat.completions.create({ model, ...params, stream: true });
  let text = '', finish = null, role = null;
  const deltas = []; // each chunk's choices: { index, delta, finish }
  for await (const c of s) {
    for (const ch of c.choices) {
      if (ch.delta.role) role = ch.delta.role;
      text += ch.delta.content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
      deltas.push({ index: ch.index, delta: ch.delta, finish: ch.finish_reason });
    }
  }
  finished++;
  return { text, finish, role, deltas };
}
// A chat stream of n choices begins as OpenAI's and vLLM's do: each choice's role alone
// (delta {"role": "assistant", "content": ""}), in index order, then the content without it.
function rolesFirst(deltas, n) {
  const head = deltas.slice(0, n), rest = deltas.slice(n);
  return head.every((d, i) => d.index === i && Object.keys(d.delta).length === 2 &&
                              d.delta.role === 'assistant' && d.delta.content === '' &&
                              d.finish === null) &&
    rest.length > 0 && rest.every((d) => d.delta.role === undefined);
}
async function status(promise) {
  try { await promise; return 200; } catch (e) { return e.status ?? String(e); }
}
// The router's text jobs so far (/metrics, the gateway's --stats-key being an admin key): the
// prompts it rendered and tokenized.
async function textJobs() {
  const m = await (await fetch(baseURL.replace(/\/v1$/, '') + '/metrics')).text();
  const line = m.split('\n').find((l) => l.startsWith('pagoda_router_text_jobs_total '));
  return line ? Number(line.split(' ')[1]) : NaN;
}

const prompt = 'The router accepts client requests and the scheduler forms batches.';

if (mode === 'abort') {
  // A client that aborts mid-stream: its request is cancelled.
  const ac = new AbortController();
  let got = 0;
  try {
    const s = await client.completions.create({ model, prompt, max_tokens: 2000, ignore_eos: true,
                                                stream: true }, { signal: ac.signal });
    for await (const c of s) { if (++got === 3) ac.abort(); }
  } catch (e) { /* the abort */ }
  check(got >= 3, `aborted a stream after ${got} chunks`);
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

const base = { prompt, max_tokens: 24, temperature: 0.8, seed: 1234, ignore_eos: true };

// Completions, whole and streamed: the same text for the same seed.
const whole = await completion(base);
check(whole.object === 'text_completion' && whole.choices[0].finish_reason === 'length' &&
      whole.usage.completion_tokens === 24 && whole.usage.total_tokens ===
      whole.usage.prompt_tokens + 24, `completion: 24 tokens, usage ${JSON.stringify(whole.usage)}`);
check('cached_tokens' in (whole.usage.prompt_tokens_details ?? {}),
      'completion: usage.prompt_tokens_details.cached_tokens');
const streamed = await completionStream(base);
check(streamed.text === whole.choices[0].text && streamed.finish === 'length',
      `completion streamed in ${streamed.chunks} chunks: the same text as whole`);
check(streamed.usage && streamed.usage.completion_tokens === 24,
      'completion streamed: include_usage gives the usage chunk');
const again = await completion(base);
check(again.choices[0].text === whole.choices[0].text, 'the same seed gives the same text');

// n choices: choice i is the request with seed + i (vLLM's), streamed as whole; the prompt's
// tokens counted once, the completions' summed.
const jobs0 = await textJobs();
const three = await completion({ ...base, n: 3 });
finished += 2; // each choice is a request of the router's: /metrics counts three
const jobs1 = await textJobs();
check(jobs1 - jobs0 === 1, `n 3: the prompt tokenized once (${jobs1 - jobs0} text jobs)`);
const plus1 = await completion({ ...base, seed: base.seed + 1 });
const plus2 = await completion({ ...base, seed: base.seed + 2 });
check(three.choices.length === 3 && three.choices.every((c, i) => c.index === i) &&
      three.choices[0].text === whole.choices[0].text &&
      three.choices[1].text === plus1.choices[0].text &&
      three.choices[2].text === plus2.choices[0].text && plus1.choices[0].text !== whole.choices[0].text,
      'n 3: choice i is seed + i\'s text');
check(three.usage.prompt_tokens === whole.usage.prompt_tokens &&
      three.usage.completion_tokens === 72, `n 3: usage ${JSON.stringify(three.usage)}`);
{
  const s = await client.completions.create({ model, ...base, n: 3, stream: true,
                                              stream_options: { include_usage: true } });
  const texts = ['', '', ''], finishes = [null, null, null];
  let usage = null, bad = 0;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (!(ch.index >= 0 && ch.index < 3)) { bad++; continue; }
      texts[ch.index] += ch.text;
      if (ch.finish_reason) finishes[ch.index] = ch.finish_reason;
    }
  }
  finished += 3;
  check(bad === 0 && texts.every((t, i) => t === three.choices[i].text) &&
        finishes.every((f) => f === 'length') && usage && usage.completion_tokens === 72,
        'n 3 streamed: each index\'s text as whole, one usage chunk of all three');
}
// A list of prompts (vLLM's batch): prompt p's choice j at index p * n + j, as the prompt alone
// with seed + j; each prompt's tokens counted once; streamed, each index's text as whole.
{
  const other = 'Hello there, how are';
  const jobs2 = await textJobs();
  const listed = await completion({ ...base, prompt: [prompt, other], n: 2 });
  finished += 3;
  const jobs3 = await textJobs();
  check(jobs3 - jobs2 === 2, `two prompts, n 2: each tokenized once (${jobs3 - jobs2} text jobs)`);
  const other0 = await completion({ ...base, prompt: other });
  const other1 = await completion({ ...base, prompt: other, seed: base.seed + 1 });
  const want = [whole, plus1, other0, other1].map((r) => r.choices[0].text);
  check(listed.choices.length === 4 && listed.choices.every((c, i) => c.index === i &&
        c.text === want[i]) && want[2] !== want[0] && want[3] !== want[2],
        'two prompts, n 2: index p * 2 + j is prompt p alone with seed + j');
  check(listed.usage.prompt_tokens === whole.usage.prompt_tokens + other0.usage.prompt_tokens &&
        listed.usage.completion_tokens === 96, `two prompts, n 2: usage ${JSON.stringify(listed.usage)}`);
  const s = await client.completions.create({ model, ...base, prompt: [prompt, other], n: 2,
                                              stream: true, stream_options: { include_usage: true } });
  const texts = ['', '', '', ''];
  let usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) texts[ch.index] += ch.text;
  }
  finished += 4;
  check(texts.every((t, i) => t === want[i]) && usage &&
        usage.prompt_tokens === listed.usage.prompt_tokens && usage.completion_tokens === 96,
        'two prompts, n 2, streamed: each index\'s text as whole, the same usage');
  // Ten prompts of three choices: ten Tokenize calls, at most 8 at once, each prompt's choices
  // sent as its ids come; the first and the last as each alone.
  const ten = Array.from({ length: 10 }, (_, i) => `${other} ${i} of ten`);
  const short = { ...base, max_tokens: 6 };
  const jobs4 = await textJobs();
  const tens = await completion({ ...short, prompt: ten, n: 3 });
  finished += 29;
  const jobs5 = await textJobs();
  const first = await completion({ ...short, prompt: ten[0] });
  const last = await completion({ ...short, prompt: ten[9], seed: short.seed + 2 });
  check(jobs5 - jobs4 === 10 && tens.choices.length === 30 &&
        tens.choices.every((c, i) => c.index === i) && tens.choices[0].text === first.choices[0].text &&
        tens.choices[29].text === last.choices[0].text && tens.usage.completion_tokens === 180,
        `ten prompts, n 3: ${jobs5 - jobs4} text jobs, 30 choices, the first and last as alone`);
  // Three such requests at once (n 2): the gateway's 8 Tokenize calls shared (a request finding
  // them taken by another sends its prompts' text), every choice as the ten x 3's of its prompt
  // and draw.
  const jobs6 = await textJobs();
  const together = await Promise.all([0, 1, 2].map(() => completion({ ...short, prompt: ten,
                                                                       n: 2 })));
  finished += 3 * 19;
  const jobs7 = await textJobs();
  const same = (r) => r.choices.length === 20 && r.choices.every((c, i) =>
    c.index === i && c.text === tens.choices[Math.floor(i / 2) * 3 + (i % 2)].text);
  check(together.every(same) && jobs7 - jobs6 >= 30 && jobs7 - jobs6 <= 60,
        `three lists of ten x n 2 at once: every choice as its prompt's (${jobs7 - jobs6} text ` +
        'jobs, 30 to 60)');
  const ids = await completion({ ...base, prompt: [[11, 12, 13], [14, 15]] });
  finished++;
  const ids0 = await completion({ ...base, prompt: [11, 12, 13] });
  const ids1 = await completion({ ...base, prompt: [14, 15] });
  check(ids.choices.length === 2 && ids.choices[0].text === ids0.choices[0].text &&
        ids.choices[1].text === ids1.choices[0].text && ids.usage.prompt_tokens === 5,
        'two prompts of token ids: each as alone');
  check(await status(completion({ ...base, prompt: [prompt, [1, 2]] })) === 400,
        'a list of a string and token ids: 400');
  // A stream of several prompts whose last is too long once tokenized (after the others' first
  // tokens): a 400 as a whole answer, not a stream that opens and then ends with an error (the
  // stream opens once every choice has had its first answer).
  const many = Array.from({ length: 120 }, (_, i) =>
    Array.from({ length: 250 }, (_, k) => `w${(i * 7 + k) % 89}`).join(' '));
  const r = await fetch(`${baseURL}/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model, prompt: ['Hi', ...many, 'word '.repeat(3000)], max_tokens: 2,
                           stream: true }),
  });
  const body = await r.text();
  check(r.status === 400 && /limit/.test(body),
        `a stream of 122 prompts, the last too long: ${r.status} ${body.slice(0, 160)}`);
}
{
  const s = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Say something.' }], max_tokens: 8, n: 2,
    temperature: 0.9, seed: 5, stream: true });
  const roles = [null, null], texts = ['', ''], deltas = [];
  for await (const c of s)
    for (const ch of c.choices) {
      if (ch.delta.role) roles[ch.index] = ch.delta.role;
      texts[ch.index] += ch.delta.content ?? '';
      deltas.push({ index: ch.index, delta: ch.delta, finish: ch.finish_reason });
    }
  finished += 2;
  const w = await chat({ messages: [{ role: 'user', content: 'Say something.' }], max_tokens: 8,
                         n: 2, temperature: 0.9, seed: 5 });
  finished++; // chat() counts one of its two
  // (several choices submit the ids of a chat tokenized once: the same as the chat alone)
  const alone = await chat({ messages: [{ role: 'user', content: 'Say something.' }],
                             max_tokens: 8, temperature: 0.9, seed: 6 });
  check(roles.every((r) => r === 'assistant') && w.choices.length === 2 &&
        texts.every((t, i) => t === w.choices[i].message.content) &&
        w.choices[1].message.content === alone.choices[0].message.content &&
        w.usage.prompt_tokens === alone.usage.prompt_tokens,
        'chat n 2 streamed: a role for each index, the texts of the whole answer, choice 1 ' +
        'the chat alone with seed + 1');
  check(rolesFirst(deltas, 2), 'chat n 2 streamed: the role chunks of index 0 and 1 first, ' +
        `then the content (${JSON.stringify(deltas.slice(0, 3))})`);
}
check(await status(completion({ ...base, n: 129 })) === 400, 'n 129: 400');
// Choices whose whole answer could not hold n x max_tokens tokens (256 bytes a token with
// log-probabilities: 64 MiB) are refused before any work; streamed, they are not.
{
  let st = 0, msg = '';
  try { await completion({ ...base, n: 128, max_tokens: 3000, logprobs: 0 }); } catch (e) {
    st = e.status; msg = e.message;
  }
  check(st === 400 && /whole answer holds/.test(msg),
        `n 128 of 3000 tokens with logprobs, whole: ${st} (${msg})`);
}
// A whole answer past 64 KiB of text and tokens (its JSON built off the gateway's loop): the same
// as one built on it.
const big = await completion({ ...base, n: 3, max_tokens: 2000 });
finished += 2;
const big0 = await completion({ ...base, max_tokens: 2000 });
check(big.usage.completion_tokens === 6000 && big.choices[0].text === big0.choices[0].text &&
      big.choices[0].text.length > 2000, `n 3 of 2000 tokens: ${big.choices.map((c) =>
        c.text.length).join(', ')} characters, choice 0 as alone`);

// A stop string: the text ends before it.
const full = whole.choices[0].text;
const cp = [...full];
const stop = cp.slice(Math.floor(cp.length / 3), Math.floor(cp.length / 3) + 2).join('');
const stopped = await completion({ ...base, stop: [stop] });
const want = full.slice(0, full.indexOf(stop));
check(stopped.choices[0].finish_reason === 'stop' && stopped.choices[0].text === want,
      `stop ${JSON.stringify(stop)}: text ends before it (${want.length} chars)`);
const stoppedStream = await completionStream({ ...base, stop: [stop] });
check(stoppedStream.text === want && stoppedStream.finish === 'stop',
      'stop, streamed: nothing past the stop string');

// Log-probabilities of the sampled tokens.
const lp = await completion({ ...base, logprobs: 0 });
const l = lp.choices[0].logprobs;
check(l && l.token_logprobs.length === 24 && l.tokens.length === 24 &&
      l.token_logprobs.every((x) => typeof x === 'number' && x <= 0),
      'completion logprobs: one per token, each <= 0');
// top_logprobs: for each token a map of its name to its log-probability (vLLM's with logprobs 0:
// the sampled token's), which clients index (top_logprobs[i]).
check(Array.isArray(l.top_logprobs) && l.top_logprobs.length === 24 &&
      l.top_logprobs.every((t, i) => Object.keys(t).length === 1 &&
                           t[l.tokens[i]] === l.token_logprobs[i]),
      `completion top_logprobs: the sampled token's each (${JSON.stringify(l.top_logprobs[0])})`);
// One alternative is the sampled token where decoding is greedy; sampled, it is not computed.
{
  const g = await completion({ ...base, temperature: 0, logprobs: 1, max_tokens: 4 });
  const gl = g.choices[0].logprobs;
  const st = await status(client.completions.create({ model, ...base, logprobs: 1 }));
  check(gl.top_logprobs.length === 4 && gl.top_logprobs.every((t, i) => i in gl.tokens &&
        t[gl.tokens[i]] === gl.token_logprobs[i]) && st === 400,
        `logprobs 1: greedy gives the sampled token as the top one, sampled is refused (${st})`);
}
// Numbers as vLLM's pydantic models take them: 5.0 for an integer, "0" for a number.
{
  const r = await fetch(`${baseURL}/completions`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}`,
                               'Content-Type': 'application/json' },
    body: `{"model": "${model}", "prompt": "Hello", "max_tokens": 5.0, "temperature": "0"}` });
  const j = await r.json();
  finished += r.status === 200;
  check(r.status === 200 && j.usage.completion_tokens <= 5,
        `max_tokens 5.0 and temperature "0": ${r.status} (${j.usage?.completion_tokens} tokens)`);
}
// Each token named by its piece of the text (the pieces join to it), text_offset in characters.
const offsetsOf = (toks) => toks.map((_, i) => [...toks.slice(0, i).join('')].length);
check(l.tokens.join('') === lp.choices[0].text && l.tokens.some((t) => t.length > 0) &&
      JSON.stringify(l.text_offset) === JSON.stringify(offsetsOf(l.tokens)),
      `completion logprobs: tokens are the text's pieces ${JSON.stringify(l.tokens.slice(0, 4))}, ` +
      `text_offset ${JSON.stringify(l.text_offset.slice(0, 4))}`);
// Streamed with a stop string (text held back, then cut): the pieces still join to the text and
// the offsets run on across chunks.
const lps = await completionStream({ ...base, logprobs: 0, stop: [stop] });
check(lps.finish === 'stop' && lps.text === want && lps.tokens.join('') === want &&
      JSON.stringify(lps.offsets) === JSON.stringify(offsetsOf(lps.tokens)),
      `completion logprobs streamed with a stop string: ${lps.tokens.length} pieces join to ` +
      `the text, offsets across ${lps.chunks} chunks`);

// Chat completions, whole and streamed.
const messages = [{ role: 'system', content: 'You are terse.' },
                  { role: 'user', content: 'Name the parts of pagoda.' }];
const cw = await chat({ messages, max_tokens: 16, temperature: 0.7, seed: 99, logprobs: true });
check(cw.object === 'chat.completion' && cw.choices[0].message.role === 'assistant' &&
      typeof cw.choices[0].message.content === 'string', 'chat: an assistant message');
check(cw.choices[0].logprobs && cw.choices[0].logprobs.content.length ===
      cw.usage.completion_tokens, 'chat logprobs: one per token');
const cl = cw.choices[0].logprobs.content;
check(cl.map((c) => c.token).join('') === cw.choices[0].message.content &&
      cl.every((c) => Buffer.from(c.bytes).toString('utf8') === c.token),
      'chat logprobs: tokens are the message\'s pieces, bytes their UTF-8');
const cs = await chatStream({ messages, max_tokens: 16, temperature: 0.7, seed: 99 });
check(cs.role === 'assistant' && cs.text === cw.choices[0].message.content &&
      cs.finish === cw.choices[0].finish_reason, 'chat streamed: the same text as whole');
check(rolesFirst(cs.deltas, 1), 'chat streamed: the role alone first, then the content ' +
      `(${JSON.stringify(cs.deltas.slice(0, 2))})`);

// vLLM's /tokenize and /detokenize (at the server's root): a prompt's ids are as many as its
// completion's prompt_tokens and give its text back; a chat's as many as its chat's.
const root = baseURL.replace(/\/v1\/?$/, '');
async function post(path, body) {
  const r = await fetch(`${root}${path}`, {
    method: 'POST', body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
  });
  return [r.status, await r.json()];
}
const [ts, tj] = await post('/tokenize', { model, prompt });
check(ts === 200 && tj.count === tj.tokens.length && tj.count === whole.usage.prompt_tokens &&
      tj.max_model_len === 2048 && tj.token_strs === null,
      `/tokenize: ${tj.count} ids, the completion's ${whole.usage.prompt_tokens} prompt tokens`);
// (vLLM's /detokenize keeps special tokens: the BOS /tokenize added comes back in front)
const [ds, dj] = await post('/detokenize', { model, tokens: tj.tokens });
const [ds1, dj1] = await post('/detokenize', { model, tokens: tj.tokens.slice(1) });
check(ds === 200 && dj.prompt.endsWith(prompt) && dj.prompt.length > prompt.length &&
      ds1 === 200 && dj1.prompt === prompt,
      `/detokenize gives the prompt back, after its BOS: ${JSON.stringify(dj)}`);
const [es, ej] = await post('/tokenize', { model, prompt: '' });
check(es === 200 && ej.count === 1, `/tokenize of an empty prompt: its BOS (${JSON.stringify(ej)})`);
const [cs2, cj] = await post('/tokenize', { model, messages });
check(cs2 === 200 && cj.count === cw.usage.prompt_tokens,
      `/tokenize of a chat: ${cj.count} ids, the chat's ${cw.usage.prompt_tokens} prompt tokens`);
// A long text (its ids' JSON past 64 KiB, built off the gateway's loop) and back.
const longText = Array.from({ length: 2500 }, (_, i) => `w${i % 97}`).join(' ');
const [ls, lj] = await post('/tokenize', { model, prompt: longText });
const [lds, ldj] = ls === 200 ? await post('/detokenize', { model, tokens: lj.tokens.slice(1) })
  : [0, {}];
check(ls === 200 && lj.count === lj.tokens.length && lj.count > 5000 && lds === 200 &&
      ldj.prompt === longText, `/tokenize of ${longText.length} bytes: ${lj.count} ids, and back`);
const [bs] = await post('/detokenize', { model, tokens: ['x'] });
const getTok = await fetch(`${root}/tokenize`);
check(bs === 400 && getTok.status === 405, `/detokenize of a non-id: ${bs}; GET /tokenize: ${getTok.status}`);

// Errors in OpenAI's shape with their statuses.
const bad = new OpenAI({ apiKey: badKey, baseURL, maxRetries: 0 });
check(await status(bad.completions.create({ model, prompt: 'x', max_tokens: 2 })) === 401,
      'a wrong key: 401');
const listed = await client.models.list();
check(await status(bad.models.list()) === 401 && listed.data[0]?.id === model,
      'models.list: 401 for a wrong key, the model for a tenant\'s');
const long = 'word '.repeat(3000);
check(await status(client.completions.create({ model, prompt: long, max_tokens: 2 })) === 400,
      'an over-long prompt: 400');
// An explicit max_tokens that the prompt plus it pass the context is refused, as OpenAI and vLLM
// refuse it (the tiny model's context is 2048 tokens); a defaulted one ends by length instead
// (tests/integration/front_test.c checks both sides on token ids).
try {
  await client.completions.create({ model, prompt, max_tokens: 2040 });
  check(false, 'max_tokens past the context: answered');
} catch (e) {
  check(e.status === 400 && /context is 2048 tokens/.test(e.message),
        `max_tokens past the context: ${e.status} ${e.message}`);
}
check(await status(client.completions.create({ model: 'nope', prompt: 'x' })) === 404,
      'an unknown model: 404');
check(await status(client.completions.create({ model, prompt: 'x', n: 2, best_of: 3 })) === 400,
      'best_of 3 with n 2: 400');
check(await status(client.chat.completions.create({ model, messages: [{ role: 'tool',
      content: 'x' }] })) === 400, 'a template error (raise_exception): 400');
// A chat of two choices is tokenized once (the router's Tokenize call); where that call fails
// each choice submits the chat as it came, so that the answer is the one choice's refusal.
const refusal = async (n) => {
  try {
    await client.chat.completions.create({ model, messages: [{ role: 'tool', content: 'x' }], n });
    return 'answered';
  } catch (e) {
    return `${e.status} ${e.message}`;
  }
};
const [ref1, ref2] = [await refusal(1), await refusal(2)];
check(ref1.startsWith('400 ') && ref2 === ref1,
      `a template error with n 2: the refusal of n 1 (${ref2} | ${ref1})`);

// An overfull tenant (max_running 1, max_waiting 0): the extra requests get 429.
const small = new OpenAI({ apiKey: smallKey, baseURL, maxRetries: 0, timeout: 120000 });
// One request of more choices than the tenant holds at once is refused (429) with why: its
// own choices fill the tenant (the gateway does not queue past the tenant's limits).
{
  const params = { model, ...base, prompt: [prompt, 'Hello there, how are'], n: 2, max_tokens: 8 };
  let st = 0, msg = '';
  try { await small.completions.create(params); } catch (e) { st = e.status; msg = e.message; }
  check(st === 429 && /own choices count against/.test(msg),
        `two prompts x n 2 for a tenant of one request at a time: ${st} (${msg})`);
  // The 429 comes once the router has let go of the choices it took: a request sent on it
  // finds the tenant's place free, each of several times.
  const after = [];
  for (let i = 0; i < 6; i++) {
    try { await small.completions.create(params); } catch (e) { st = e.status; }
    after.push(`${st}:${await status(small.completions.create({ model, prompt, max_tokens: 1 }))}`);
  }
  const freed = after.filter((s) => s === '429:200').length;
  finished += freed;
  check(freed === after.length, `a request sent on each of 6 such 429s is served (${after})`);
  // While another request holds the tenant's one place, none of the choices can start: 429 at
  // once, and the running request goes on.
  const a = await small.completions.create({ model, prompt, max_tokens: 300, ignore_eos: true,
                                             stream: true });
  const it = a[Symbol.asyncIterator]();
  await it.next(); // the first chunk: the tenant's place is taken
  const t0 = Date.now();
  const st2 = await status(small.completions.create({ ...params, n: 2 }));
  const waited = Date.now() - t0;
  let rest = 0;
  while (!(await it.next()).done) rest++;
  finished++;
  check(st2 === 429 && rest > 0, `n 2 while the tenant's place is taken: ${st2} after ${waited} ms, ` +
        `the running request went on (${rest} more chunks)`);
}
const many = await Promise.all([0, 1, 2, 3].map(() => status(small.completions.create(
  { model, prompt, max_tokens: 64, ignore_eos: true }))));
finished += many.filter((s) => s === 200).length;
check(many.includes(429) && many.includes(200), `an overfull tenant: ${many.join(', ')}`);
// Its 429s say when to retry (Retry-After: 1, as the gateway's and the HTTP server's 503s do).
const raw = await Promise.all([0, 1, 2, 3].map(async () => {
  const r = await fetch(`${baseURL}/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${smallKey}` },
    body: JSON.stringify({ model, prompt, max_tokens: 64, ignore_eos: true }),
  });
  await r.text();
  return [r.status, r.headers.get('retry-after')];
}));
finished += raw.filter(([s]) => s === 200).length;
check(raw.some(([s]) => s === 429) && raw.every(([s, h]) => s !== 429 || h === '1'),
      `an overfull tenant's 429s carry Retry-After: 1: ${JSON.stringify(raw)}`);

console.log(`finished ${finished}`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
