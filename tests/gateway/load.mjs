// The gateway under load (issue 18's must-show), driven with Node's own HTTP client and raw
// sockets, no npm package:
//
//   node tests/gateway/load.mjs BASE_URL MODEL STREAMS IDLE MAX_TOKENS TIMEOUT_S
//
//   1. IDLE connections are opened and never send a byte; with them open, a request (and
//      /health) is still answered, within TIMEOUT_S.
//   2. With them still open, STREAMS streaming completions start at once, each on a connection
//      of its own (no keep-alive pool: STREAMS sockets at the same time). Their prompts are token
//      ids: the router tokenizes at most 32 text prompts of one tenant at a time and answers a
//      Submit beyond that with 429 (ROUTER_MAX_TENANT_TEXT_JOBS, by design, which an SDK
//      retries); this test is about connections and streams, not the tokenizer's queue. Every stream must
//      deliver exactly MAX_TOKENS tokens (counted from the chunks' logprobs, one entry per
//      token), end with finish_reason "length" and then "data: [DONE]", with HTTP 200.
//   3. Afterwards a request is still answered and the idle sockets were not the gateway's
//      undoing (they are closed by the test, or were closed by the gateway's idle timeout; either
//      way the service answers).
//
// Every wait is bounded by TIMEOUT_S (a stream that has not ended by then fails). Prints one
// "ok"/"FAIL" line per check and "N passed, M failed"; exit status 1 when a check failed.
import http from 'node:http';
import net from 'node:net';

const [base, model, streamsArg, idleArg, maxTokensArg, timeoutArg] = process.argv.slice(2);
if (!timeoutArg) {
    console.error('usage: load.mjs BASE_URL MODEL STREAMS IDLE MAX_TOKENS TIMEOUT_S');
    process.exit(2);
}
const url = new URL(base);
const numStreams = Number(streamsArg), numIdle = Number(idleArg);
const maxTokens = Number(maxTokensArg), timeoutMs = Number(timeoutArg) * 1000;
let passes = 0, fails = 0;
function check(what, cond) {
    if (cond) {
        passes++;
        console.log(`ok   ${what}`);
    } else {
        fails++;
        console.log(`FAIL ${what}`);
    }
}

// One connection per request, never pooled: the point is the number of sockets.
const agent = new http.Agent({keepAlive: false, maxSockets: Infinity});

function request(method, path, body) {
    return new Promise((resolve) => {
        const data = body === undefined ? undefined : JSON.stringify(body);
        const req = http.request({
            host: url.hostname, port: url.port, method, path, agent,
            headers: data === undefined ? {} : {'Content-Type': 'application/json',
                                                 'Content-Length': Buffer.byteLength(data)},
        }, (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (c) => { text += c; });
            res.on('end', () => resolve({status: res.statusCode, text}));
            res.on('error', (e) => resolve({status: 0, text: String(e)}));
        });
        req.setTimeout(timeoutMs, () => req.destroy(new Error('timed out')));
        req.on('error', (e) => resolve({status: 0, text: String(e)}));
        req.end(data);
    });
}

// One streamed completion: what its chunks said. SSE events are split on blank lines; each
// "data: " line holds a JSON chunk or [DONE].
function stream(i) {
    return new Promise((resolve) => {
        const out = {status: 0, tokens: 0, finish: null, done: false, afterDone: false,
                     error: null};
        const body = JSON.stringify({
            model, prompt: [10 + (i % 50), 11, 12, 13 + (i % 7)], max_tokens: maxTokens, stream: true,
            ignore_eos: true, logprobs: 0, temperature: 0.8, seed: i,
        });
        const req = http.request({
            host: url.hostname, port: url.port, method: 'POST', path: '/v1/completions', agent,
            headers: {'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body)},
        }, (res) => {
            out.status = res.statusCode;
            let buf = '';
            res.setEncoding('utf8');
            res.on('data', (c) => {
                if (out.status !== 200) {
                    out.error = (out.error || '') + c; // the error's body
                    return;
                }
                buf += c;
                let k;
                while ((k = buf.indexOf('\n\n')) >= 0) {
                    const event = buf.slice(0, k);
                    buf = buf.slice(k + 2);
                    for (const line of event.split('\n')) {
                        if (!line.startsWith('data: '))
                            continue;
                        const data = line.slice(6);
                        if (out.done) {
                            out.afterDone = true;
                        } else if (data === '[DONE]') {
                            out.done = true;
                        } else {
                            try {
                                const chunk = JSON.parse(data);
                                if (chunk.error) {
                                    out.error = chunk.error.message;
                                    continue;
                                }
                                const choice = chunk.choices[0];
                                if (choice.logprobs)
                                    out.tokens += choice.logprobs.tokens.length;
                                if (choice.finish_reason)
                                    out.finish = choice.finish_reason;
                            } catch (e) {
                                out.error = `a bad chunk: ${data.slice(0, 80)}`;
                            }
                        }
                    }
                }
            });
            res.on('end', () => resolve(out));
            res.on('error', (e) => { out.error = String(e); resolve(out); });
        });
        req.setTimeout(timeoutMs, () => req.destroy(new Error('timed out')));
        req.on('error', (e) => { out.error = out.error || String(e); resolve(out); });
        req.end(body);
    });
}

function finishOf(r) {
    try {
        return JSON.parse(r.text).choices[0].finish_reason;
    } catch (e) {
        return null;
    }
}

function small(i) {
    return request('POST', '/v1/completions',
                   {model, prompt: [20, 21, 22 + (i & 7)], max_tokens: 2, ignore_eos: true});
}

// 1. Idle sockets that never send a request.
const idle = [];
await Promise.all(Array.from({length: numIdle}, () => new Promise((resolve) => {
    const s = net.connect({host: url.hostname, port: Number(url.port)});
    s.on('connect', () => { idle.push(s); resolve(); });
    s.on('error', () => resolve());
    s.on('close', () => { s.closedEarly = true; });
    s.setTimeout(timeoutMs, () => { s.destroy(); resolve(); });
})));
check(`${idle.length} of ${numIdle} idle connections are open`, idle.length === numIdle);
let t = Date.now();
let r = await request('GET', '/health');
check(`/health answers 200 beside the idle connections (${r.status}, ${Date.now() - t} ms)`,
      r.status === 200);
t = Date.now();
r = await small(-1);
check(`a completion is served beside the idle connections (${r.status}, ${Date.now() - t} ms)`,
      r.status === 200 && finishOf(r) === 'length');

// 2. The streams, all at once.
t = Date.now();
const results = await Promise.all(Array.from({length: numStreams}, (_, i) => stream(i)));
const wall = Date.now() - t;
const ok = results.filter((o) => o.status === 200 && o.tokens === maxTokens &&
                                 o.finish === 'length' && o.done && !o.afterDone && !o.error);
const tokens = results.reduce((s, o) => s + o.tokens, 0);
console.log(`${numStreams} streams in ${wall} ms, ${tokens} tokens`);
const firstBad = results.find((o) => !ok.includes(o));
if (firstBad)
    console.log(`the first failed stream: ${JSON.stringify(firstBad)}`);
check(`all ${numStreams} concurrent streams got their ${maxTokens} tokens, finish_reason ` +
      `length and [DONE] (${ok.length} did)`, ok.length === numStreams);

// 3. Still serving, the idle connections still there (unless the idle timeout took them).
const stillOpen = idle.filter((s) => !s.closedEarly).length;
console.log(`${stillOpen} idle connections still open`);
t = Date.now();
r = await small(-2);
check(`a completion is still served afterwards (${r.status}, ${Date.now() - t} ms)`,
      r.status === 200);
r = await request('GET', '/health');
check(`/health still answers 200 (${r.status})`, r.status === 200);
for (const s of idle)
    s.destroy();
console.log(`${passes} passed, ${fails} failed`);
process.exit(fails === 0 && passes > 0 ? 0 : 1);
