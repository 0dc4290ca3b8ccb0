// The reference writer of tests/chat/run: generates seeded conversations for the chat templates
// of the tokenizer_config.json files named on the command line, renders each with npm
// @huggingface/jinja, and writes one JSON object a line for chat_compare:
//
//   node reference.mjs NPM_DIR SEED COUNT OUT.jsonl NAME=CONFIG...
//
// {id, template, messages, tools, add_generation_prompt, extra, vars (all the template was given),
//  expected | error, expected_raw}
//
// expected is @huggingface/jinja's output with two corrections, applied here and nowhere else,
// where the package departs from Python's jinja2, which transformers runs:
//   - its str.strip/lstrip/rstrip ignore their chars argument and, like its |trim, strip
//     JavaScript's whitespace set; Python strips the given chars, or str.isspace() characters
//     (the Qwen3 template relies on strip('\n'));
//   - its == and != are JavaScript's loose ones ("" == false); Python's are typed (Llama 2's
//     template tests `system_message != false`).
// expected_raw is the unmodified package's output, for the record.
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";

const [npmDir, seedArg, countArg, outPath, ...configArgs] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(npmDir), "package.json"));
const { Template, Environment, Interpreter } = require("@huggingface/jinja");

// ---- seeded generation ----
let state = Number(seedArg) >>> 0;
function rand() {
  // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const chance = (p) => rand() < p;

const WORDS = ["hello", "world", "What", "is", "the", "weather", "in", "Paris?", "def f(x):",
  "return x + 1", "42", "3.14", "naïve", "café", "日本語", "中文测试", "한국어", "שלום", "مرحبا",
  "👍🏽", "👨‍👩‍👧", "e\u0301", "Ω", "<b>bold</b>", "{\"a\": 1}", "'quoted'", "\"dq\"", "a\\b",
  "{{ not a tag }}", "{% raw %}", "tab\tinside", "line\nbreak", "<|eot_id|>", "<|im_start|>",
  "\u200b", "ß", "İ"];
const EDGES = ["", "", "", " ", "  ", "\n", "\n\n", "\t", " \n ", "\u00a0", "\u3000", "\r\n",
  "\u2028"];
// Whitespace to Python (str.isspace) but not to JavaScript, or the reverse: rarer, so that most
// conversations also compare with the unmodified reference.
const EDGES_DIVERGENT = ["\u0085", "\ufeff", "\u001f"];
const edge = () => (chance(0.03) ? pick(EDGES_DIVERGENT) : pick(EDGES));

function text(maxWords = 12) {
  if (chance(0.08)) return "";
  const n = 1 + Math.floor(rand() * maxWords);
  const parts = [];
  for (let i = 0; i < n; i++) parts.push(pick(WORDS));
  return edge() + parts.join(pick([" ", " ", "\n", ", "])) + edge();
}

function argsValue(depth = 0) {
  switch (Math.floor(rand() * (depth > 1 ? 4 : 6))) {
    case 0: return text(4);
    case 1: return Math.floor(rand() * 2000) - 1000;
    case 2: return Math.floor(rand() * 1000) / 8 + 0.125;  // never integral: JS has no 2.0
    case 3: return chance(0.5);
    case 4: return [argsValue(depth + 1), argsValue(depth + 1)];
    default: return { unit: pick(["c", "f"]), nested: argsValue(depth + 1) };
  }
}

const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Get the weather",
    parameters: { type: "object", properties: { city: { type: "string", description: "City" },
      unit: { type: "string", enum: ["c", "f"] } }, required: ["city"] } } },
  { type: "function", function: { name: "search", description: "Search the web: ünïcode",
    parameters: { type: "object", properties: { q: { type: "string" }, n: { type: "integer" } } } } },
];

function toolCall() {
  const args = {};
  const n = Math.floor(rand() * 3);
  for (let i = 0; i < n; i++) args[pick(["city", "q", "n", "unit", "x"]) + i] = argsValue();
  const fn = { name: pick(["get_weather", "search"]), arguments: chance(0.3) ? JSON.stringify(args) : args };
  return chance(0.8) ? { id: "call_" + Math.floor(rand() * 1e6), type: "function", function: fn } : fn;
}

function conversation(kind) {
  const messages = [];
  let tools = null;
  const extra = {};
  if (chance(0.5)) messages.push({ role: "system", content: text() });
  const turns = 1 + Math.floor(rand() * 8);
  const qwen = kind === "qwen";
  const llama31 = kind === "llama31";
  if ((qwen || llama31) && chance(0.35)) tools = TOOLS.slice(0, 1 + Math.floor(rand() * 2));
  if (qwen && chance(0.6)) extra.enable_thinking = chance(0.5);
  if (llama31) {
    extra.date_string = "26 Jul 2024";  // never the clock: both sides render the same day
    if (chance(0.5)) extra.tools_in_user_message = chance(0.5);
  }
  for (let t = 0; t < turns; t++) {
    if (qwen && chance(0.1)) messages.push({ role: "user", content: "<tool_response>" + text(3) + "</tool_response>" });
    else messages.push({ role: "user", content: text() });
    if (t === turns - 1 && chance(0.6)) break;  // end on a user turn
    const m = { role: "assistant", content: text() };
    if (qwen) {
      if (chance(0.25)) m.reasoning_content = chance(0.8) ? text() : null;
      else if (chance(0.25)) m.content = pick(["", "\n"]) + "<think>" + text() + "</think>" + text();
      if (chance(0.3)) {
        m.tool_calls = [];
        const k = 1 + Math.floor(rand() * 2);
        for (let i = 0; i < k; i++) m.tool_calls.push(toolCall());
        if (chance(0.3)) m.content = chance(0.8) ? "" : null;
        messages.push(m);
        for (let i = 0; i < k; i++) messages.push({ role: "tool", content: text(5) });
        continue;
      }
    }
    if (llama31 && chance(0.3)) {
      // one call a turn (the template refuses two), arguments as an object
      const call = toolCall();
      m.tool_calls = [call.function ? call : { type: "function", function: call }];
      if (typeof m.tool_calls[0].function.arguments === "string") m.tool_calls[0].function.arguments = {};
      if (chance(0.1)) m.tool_calls.push(m.tool_calls[0]);
      messages.push(m);
      messages.push({ role: pick(["tool", "ipython"]), content: text(5) });
      continue;
    }
    messages.push(m);
  }
  return { messages, tools, extra };
}

// Conversations where @huggingface/jinja departs from Python in ways not corrected below: null
// and absent content (Python prints None, and an undefined |trim is ""; the package refuses
// both), whole-number floats in tool arguments (JavaScript has no 2.0: written here as a
// {"__float__": 2} placeholder that the output turns into 2.0). chat_compare leaves them out
// of the comparison with this package (python_only) and compares them with Python's jinja2.
function pythonOnly(c) {
  const m = c.messages;
  for (let k = 1 + Math.floor(rand() * 2); k > 0 && m.length > 0; k--) {
    const msg = pick(m);
    const how = Math.floor(rand() * 3);
    if (how === 0) msg.content = null;
    else if (how === 1) delete msg.content;
    else msg.content = pick(["\u0085", "\ufeff", "\u001c"]) + text(3) + pick(["\u0085", "\ufeff", "\u001f"]);
  }
  for (const msg of m)
    for (const call of msg.tool_calls || []) {
      const fn = call.function || call;
      if (fn.arguments && typeof fn.arguments === "object") fn.arguments.f = { __float__: Math.floor(rand() * 100) - 50 };
    }
  c.python_only = true;
  return c;
}

// ---- rendering ----
function varsOf(config, c, agp) {
  // as transformers: special_tokens_map, the caller's kwargs, then messages, tools, documents
  const vars = {};
  const text = (v) => (v && typeof v === "object" ? v.content : v);
  for (const k of ["bos_token", "eos_token", "unk_token", "pad_token", "cls_token", "sep_token", "mask_token"])
    if (typeof text(config[k]) === "string") vars[k] = text(config[k]);
  if (Array.isArray(config.additional_special_tokens))
    vars.additional_special_tokens = config.additional_special_tokens.map(text).filter((t) => typeof t === "string");
  Object.assign(vars, c.extra);
  vars.messages = c.messages;
  vars.tools = c.tools;
  vars.add_generation_prompt = agp;
  if (!("documents" in vars)) vars.documents = null;
  return vars;
}

function render(tpl, vars) {
  try {
    return { out: new Template(tpl).render(structuredClone(vars)) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
}

const cases = [];
let id = 0;
for (const arg of configArgs) {
  const eq = arg.indexOf("=");
  const name = arg.slice(0, eq);
  const config = JSON.parse(readFileSync(arg.slice(eq + 1), "utf8"));
  const kind = name.startsWith("qwen") ? "qwen" : name === "llama3_1_tools" ? "llama31" : "llama";
  for (let i = 0; i < Number(countArg); i++) {
    const c = conversation(kind);
    for (const agp of [false, true]) cases.push({ id: id++, template: name, tpl: config.chat_template, config, ...c, agp });
  }
  for (let i = 0; i < Math.ceil(Number(countArg) / 5); i++) {
    const c = pythonOnly(conversation(kind));
    for (const agp of [false, true]) cases.push({ id: id++, template: name, tpl: config.chat_template, config, ...c, agp });
  }
}
for (const c of cases) c.raw = render(c.tpl, varsOf(c.config, c, c.agp));

// ---- the correction: Python's str.strip family ----
const isPySpace = (ch) => {
  const c = ch.codePointAt(0);
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c === 0x85 || c === 0xa0 ||
    c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 ||
    c === 0x202f || c === 0x205f || c === 0x3000;
};
function pyStrip(s, chars, left, right) {
  const a = Array.from(s);
  const strip = chars == null ? isPySpace : (ch) => chars.includes(ch);
  let b = 0, e = a.length;
  if (left) while (b < e && strip(a[b])) b++;
  if (right) while (e > b && strip(a[e - 1])) e--;
  return a.slice(b, e).join("");
}
String.prototype.trim = function () { return pyStrip(String(this), null, true, true); };
String.prototype.trimStart = function () { return pyStrip(String(this), null, true, false); };
String.prototype.trimEnd = function () { return pyStrip(String(this), null, false, true); };
{
  const env = new Environment();
  const sample = new Interpreter(env).evaluate({ type: "StringLiteral", value: "x" }, env);
  const proto = Object.getPrototypeOf(sample);
  const desc = Object.getOwnPropertyDescriptor(proto, "builtins");
  const FunctionValue = sample.builtins.get("upper").constructor;
  const StringValue = sample.constructor;
  Object.defineProperty(proto, "builtins", {
    get() {
      const m = desc.get.call(this);
      for (const [fn, l, r] of [["strip", true, true], ["lstrip", true, false], ["rstrip", false, true]]) {
        m.set(fn, new FunctionValue((args) => {
          const chars = args[0] && args[0].type === "StringValue" ? args[0].value : null;
          return new StringValue(pyStrip(this.value, chars, l, r));
        }));
      }
      return m;
    },
  });
}

// ---- the correction: Python's == and != ----
// @huggingface/jinja compares with JavaScript's loose ==, so "" == false and 0 == "" there; in
// Python (and so in transformers) values of different types are unequal, except numbers and
// booleans among themselves (Llama 2's template tests `system_message != false`).
{
  const proto = Interpreter.prototype;
  const original = proto.evaluateBinaryExpression;
  const numeric = (v) => ["IntegerValue", "FloatValue", "BooleanValue"].includes(v.type);
  const seq = (v) => v.type === "ArrayValue" || v.type === "TupleValue";
  const map = (v) => v.type === "ObjectValue" || v.type === "KeywordArgumentsValue";
  const pyEqual = (a, b) => {
    if (numeric(a) && numeric(b)) return Number(a.value) === Number(b.value);
    if (seq(a) && seq(b))
      return a.value.length === b.value.length && a.value.every((x, i) => pyEqual(x, b.value[i]));
    if (map(a) && map(b))
      return a.value.size === b.value.size &&
        [...a.value].every(([k, v]) => b.value.has(k) && pyEqual(v, b.value.get(k)));
    if (a.type !== b.type) return false;
    if (a.type === "NullValue" || a.type === "UndefinedValue") return true;
    return a.value === b.value;
  };
  let BooleanValue = null;
  proto.evaluateBinaryExpression = function (node, environment) {
    const op = node.operator.value;
    if (op !== "==" && op !== "!=") return original.call(this, node, environment);
    if (BooleanValue === null) BooleanValue = original.call(this, node, environment).constructor;
    const eq = pyEqual(this.evaluate(node.left, environment), this.evaluate(node.right, environment));
    return new BooleanValue(op === "==" ? eq : !eq);
  };
}

const lines = [];
for (const c of cases) {
  const r = render(c.tpl, varsOf(c.config, c, c.agp));
  const rec = { id: c.id, template: c.template, messages: c.messages, tools: c.tools,
    add_generation_prompt: c.agp, extra: c.extra, vars: varsOf(c.config, c, c.agp) };
  if ("out" in r) rec.expected = r.out; else rec.error = r.error;
  rec.expected_raw = "out" in c.raw ? c.raw.out : null;
  if (c.python_only) rec.python_only = true;
  lines.push(JSON.stringify(rec).replace(/\{"__float__":(-?\d+)\}/g, "$1.0"));
}
writeFileSync(outPath, lines.join("\n") + "\n");
console.log(`reference.mjs: ${cases.length} cases written to ${outPath}`);
