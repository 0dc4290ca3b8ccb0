/* The status page: static HTML with a little JavaScript (no framework) that reads /metrics every
 * two seconds and shows the figures live: throughput (tokens per second over the last interval),
 * latency percentiles estimated from the histograms, KV usage, prefix hit rate, running and
 * waiting requests, and per tenant (when /metrics has the tenants' series) its running and
 * waiting requests and prefix hit rate, and per engine (a router with several: the
 * pagoda_engine_* series labelled engine) its state, load, requests and prefix hit rate.
 * Everything it shows comes from /metrics, so the page and a scraper agree; label values are
 * shown unescaped (an address as the router has it) and a rate with nothing behind it (0/0, or
 * no figure) as "n/a". */
#include "gateway/gateway_internal.h"

#include <string.h>

static const char page[] =
    "<!doctype html>\n"
    "<html><head><meta charset=\"utf-8\"><title>pagoda</title>\n"
    "<style>body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse}td,th{padding:4px 12px;border-bottom:1px solid #ddd;"
    "text-align:right}th{text-align:left}#state{font-weight:bold}</style></head>\n"
    "<body><h1>pagoda</h1><p>engine: <span id=\"state\">connecting</span>, updated "
    "<span id=\"updated\">never</span></p>\n"
    "<table>\n"
    "<tr><th>running requests</th><td id=\"running\">-</td></tr>\n"
    "<tr><th>waiting requests</th><td id=\"waiting\">-</td></tr>\n"
    "<tr><th>KV usage</th><td id=\"kv\">-</td></tr>\n"
    "<tr><th>prefix cache hit rate</th><td id=\"hit\">-</td></tr>\n"
    "<tr><th>generated tokens</th><td id=\"gen\">-</td></tr>\n"
    "<tr><th>generation throughput (tokens/s)</th><td id=\"tps\">-</td></tr>\n"
    "<tr><th>finished requests</th><td id=\"done\">-</td></tr>\n"
    "<tr><th>time to first token p50 / p95 / p99 (s)</th><td id=\"ttft\">-</td></tr>\n"
    "<tr><th>time per output token p50 / p95 / p99 (s)</th><td id=\"tpot\">-</td></tr>\n"
    "<tr><th>end-to-end latency p50 / p95 / p99 (s)</th><td id=\"e2e\">-</td></tr>\n"
    "</table>\n"
    "<h2>tenants</h2><table id=\"tenants\"><tr><th>tenant</th><th>running</th><th>waiting</th>"
    "<th>prefix cache hit rate</th></tr></table>\n"
    "<h2>engines</h2><table id=\"engines\"><tr><th>engine</th><th>address</th><th>up</th>"
    "<th>load</th><th>running</th><th>waiting</th><th>prefix cache hit rate</th><th>routed</th>"
    "</tr></table>\n"
    "<script>\n"
    "function parse(text){const m={};for(const line of text.split('\\n')){"
    "if(!line||line[0]==='#')continue;const i=line.lastIndexOf(' ');"
    "m[line.slice(0,i)]=parseFloat(line.slice(i+1));}return m;}\n"
    "function quantile(m,name,q){const b=[];for(const k in m){"
    "const p=k.match(new RegExp('^'+name+'_bucket\\\\{le=\"([^\"]+)\"\\\\}$'));"
    "if(p)b.push([p[1]==='+Inf'?Infinity:parseFloat(p[1]),m[k]]);}"
    "b.sort((x,y)=>x[0]-y[0]);if(!b.length)return NaN;const n=b[b.length-1][1];"
    "if(!n)return NaN;for(const [le,c] of b)if(c>=q*n)return le;return Infinity;}\n"
    "function fmt(x,d){return isFinite(x)?x.toFixed(d):'-';}\n"
    "function pct(x){return isFinite(x)?(100*x).toFixed(1)+' %':'n/a';}\n"
    "function unesc(s){return s.replace(/\\\\(.)/g,(a,c)=>c==='n'?'\\n':c);}\n"
    "function q3(m,n){return [0.5,0.95,0.99].map(q=>fmt(quantile(m,n,q),3)).join(' / ');}\n"
    "let last=null;\n"
    "async function tick(){try{const r=await fetch('/metrics');const m=parse(await r.text());"
    "const set=(id,v)=>document.getElementById(id).textContent=v;"
    "set('state',Object.keys(m).some(k=>k.startsWith('pagoda_engine_up')&&m[k]===1)?'up':"
    "'down');"
    "set('running',fmt(m['pagoda_num_requests_running'],0));"
    "set('waiting',fmt(m['pagoda_num_requests_waiting'],0));"
    "set('kv',pct(m['pagoda_kv_cache_usage_perc']));"
    "set('hit',pct(m['pagoda_prefix_cache_hit_rate']));"
    "const gen=m['pagoda_generation_tokens_total'];set('gen',fmt(gen,0));"
    "const now=Date.now();if(last){set('tps',fmt((gen-last.gen)/((now-last.t)/1000),1));}"
    "last={gen:gen,t:now};"
    "let done=0;for(const k in m)if(k.startsWith('pagoda_request_success_total'))done+=m[k];"
    "set('done',fmt(done,0));"
    "set('ttft',q3(m,'pagoda_time_to_first_token_seconds'));"
    "set('tpot',q3(m,'pagoda_time_per_output_token_seconds'));"
    "set('e2e',q3(m,'pagoda_e2e_request_latency_seconds'));"
    "const ts={};for(const k in m){const p=k.match(/^pagoda_tenant_(num_requests_running|"
    "num_requests_waiting|prefix_cache_hit_rate)\\{tenant=\"((?:[^\"\\\\]|\\\\.)*)\"\\}$/);"
    "if(p){const n=unesc(p[2]);(ts[n]=ts[n]||{})[p[1]]=m[k];}}"
    "const tb=document.getElementById('tenants');while(tb.rows.length>1)tb.deleteRow(1);"
    "for(const name of Object.keys(ts).sort()){const r=tb.insertRow();r.id='tenant-'+name;"
    "const t=ts[name];for(const v of [name,fmt(t.num_requests_running,0),"
    "fmt(t.num_requests_waiting,0),pct(t.prefix_cache_hit_rate)])"
    "r.insertCell().textContent=v;}"
    "const es={};for(const k in m){const p=k.match(/^pagoda_engine_(up|load|running|waiting|"
    "prefix_query_tokens_total|prefix_hit_tokens_total|routed_total)\\{engine=\"([0-9]+)\","
    "address=\"((?:[^\"\\\\]|\\\\.)*)\"\\}$/);"
    "if(p){(es[p[2]]=es[p[2]]||{address:unesc(p[3])})[p[1]]=m[k];}}"
    "const eb=document.getElementById('engines');while(eb.rows.length>1)eb.deleteRow(1);"
    "for(const i of Object.keys(es).sort((x,y)=>x-y)){const r=eb.insertRow();r.id='engine-'+i;"
    "const e=es[i];for(const v of [i,e.address,e.up===1?'up':'down',fmt(e.load,0),"
    "fmt(e.running,0),fmt(e.waiting,0),"
    "pct(e.prefix_hit_tokens_total/e.prefix_query_tokens_total),"
    "fmt(e.routed_total,0)])r.insertCell().textContent=v;}"
    "set('updated',new Date().toLocaleTimeString());}catch(e){"
    "document.getElementById('state').textContent='unreachable';}}\n"
    "tick();setInterval(tick,2000);\n"
    "</script></body></html>\n";

void gateway_status_page(struct http_request *http)
{
    gateway_respond_plain(http, 200, "text/html; charset=utf-8", page, sizeof(page) - 1, NULL, 0);
}
