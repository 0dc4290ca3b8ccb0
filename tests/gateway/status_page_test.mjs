// The status page's script (gateway/gateway_status.c) run in node against a crafted /metrics of
// two engines: an address with a quote and a backslash is shown as the router has it (the label
// unescaped), and a hit rate with nothing behind it (0/0, or no figure) reads "n/a", not "- %".
// Usage: node status_page_test.mjs PAGE.html (the gateway's "/"). Exits 0 when both hold.
import { readFileSync } from 'node:fs';
import vm from 'node:vm';

const html = readFileSync(process.argv[2], 'utf8');
const script = html.slice(html.indexOf('<script>') + 8, html.indexOf('</script>'));
const address = 'tcp://a"b\\c:1'; // as the router has it
const label = address.replace(/\\/g, '\\\\').replace(/"/g, '\\"'); // as /metrics escapes it
const metrics = [
  'pagoda_engine_up 1',
  'pagoda_num_requests_running 0',
  `pagoda_engine_up{engine="0",address="${label}"} 1`,
  `pagoda_engine_prefix_query_tokens_total{engine="0",address="${label}"} 0`,
  `pagoda_engine_prefix_hit_tokens_total{engine="0",address="${label}"} 0`,
  'pagoda_engine_up{engine="1",address="tcp://b:2"} 1',
  'pagoda_engine_prefix_query_tokens_total{engine="1",address="tcp://b:2"} 4',
  'pagoda_engine_prefix_hit_tokens_total{engine="1",address="tcp://b:2"} 1',
].join('\n') + '\n';

const elements = {};
function element(id) {
  if (!elements[id]) {
    elements[id] = {
      id, textContent: '', rows: [{ header: true }],
      deleteRow(i) { this.rows.splice(i, 1); },
      insertRow() {
        const row = { id: '', cells: [], insertCell() { const c = { textContent: '' }; this.cells.push(c); return c; } };
        this.rows.push(row);
        return row;
      },
    };
  }
  return elements[id];
}
const context = {
  document: { getElementById: element },
  fetch: async () => ({ text: async () => metrics }),
  setInterval: () => 0,
};
vm.runInNewContext(script, context);
await new Promise((resolve) => setTimeout(resolve, 200));

const rows = element('engines').rows.slice(1);
const cells = (i) => rows.find((r) => r.id === `engine-${i}`)?.cells.map((c) => c.textContent);
const want = [
  ['engine 0 address', cells(0)?.[1], address],
  ['engine 0 hit rate (0/0)', cells(0)?.[6], 'n/a'],
  ['engine 1 hit rate', cells(1)?.[6], '25.0 %'],
  ['hit rate without a figure', element('hit').textContent, 'n/a'],
  ['state', element('state').textContent, 'up'],
];
let failed = 0;
for (const [what, got, expected] of want) {
  if (got !== expected) {
    console.log(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(expected)}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
