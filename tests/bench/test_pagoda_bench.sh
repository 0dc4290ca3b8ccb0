#!/usr/bin/env bash
# test_pagoda_bench.sh BINDIR: pagoda-bench against a real CPU group (deploy/pagoda-up with a
# tenants file, on a private ipc:// address), with small counts: each workload, an open-loop
# (--rate) and a closed-loop (--concurrency) run, a run where one tenant's key is wrong, a sweep
# with its plot, and a workload that does not fit the model. For every run the JSON report is
# checked against the per-request records (--output-requests), recomputed here with jq:
# completed + failed = requests sent, token totals equal what the responses carried (token ids
# received and the router's usage), percentiles ordered and equal to an independent
# recomputation, failures counted with their reason. No timing is asserted.
set -euo pipefail
# shellcheck source=tests/check.sh
. "$(dirname "$0")/../check.sh"

bin_dir=$(cd "${1:?usage: test_pagoda_bench.sh BINDIR}" && pwd -P)
src=${PAGODA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd -P)}
scale=${PAGODA_TEST_TIME_SCALE:-1}
command -v jq >/dev/null || { echo "jq is missing (scripts/install-deps installs it)"; exit 1; }

tmp=$(mktemp -d /tmp/pagoda-bt-XXXXXX)
run=$tmp/run
url=ipc://$run/client.ipc
cleanup() {
    "$src/deploy/pagoda-down" --run-dir "$run" --timeout 60 >/dev/null 2>&1 || true
    [ -n "${KEEP_TMP:-}" ] || rm -rf -- "$tmp"
}
trap cleanup EXIT

# jq_true FILE FILTER: the filter yields true on the file (slurped when it is JSON lines).
jq_true() { [ "$(jq -e "$2" "$1" 2>/dev/null)" = true ]; }
jqs_true() { [ "$(jq -s -e "$2" "$1" 2>/dev/null)" = true ]; }

"$bin_dir/pagoda-mkmodel" --preset tiny --seed 1 --out "$tmp/model" >/dev/null
mkdir -m 0700 "$run"

# The router's tenants file (tenants, and the admin key that the engine's figures need: the suite
# checks the report, not tenancy) and the one pagoda-bench reads (groups, pins: they shape the
# prompts), naming the same tenants and keys.
cat >"$tmp/tenants-router.json" <<'EOF'
{"admin_keys": ["adm"],
 "tenants": [
  {"name": "alice", "api_keys": ["k1"], "max_running": 64, "max_waiting": 256},
  {"name": "bob", "api_keys": ["k2"], "max_running": 64, "max_waiting": 256},
  {"name": "carol", "api_keys": ["k3"], "max_running": 64, "max_waiting": 256},
  {"name": "dave", "api_keys": ["k4"], "max_running": 64, "max_waiting": 256}]}
EOF
cat >"$tmp/tenants-bench.json" <<'EOF'
{"admin_keys": ["k1"],
 "groups": [{"name": "team", "cache_quota_blocks": 100}],
 "tenants": [
  {"name": "alice", "api_keys": ["k1"], "group": "team"},
  {"name": "bob", "api_keys": ["k2"], "group": "team"},
  {"name": "carol", "api_keys": ["k3"]},
  {"name": "dave", "api_keys": ["k4"]}],
 "pins": [{"name": "sys", "token_ids": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
           "tenants": ["dave"]}]}
EOF

up_timeout=$((60 * scale))
"$src/deploy/pagoda-up" --run-dir "$run" --bin-dir "$bin_dir" --model "$tmp/model" \
    --listen "$url" --kv-blocks 512 --tenants "$tmp/tenants-router.json" \
    --timeout "$up_timeout" >/dev/null 2>"$tmp/up.err" && rc=0 || rc=$?
check "pagoda-up starts the group with the tenants file (exit $rc)" [ "$rc" = 0 ]
if [ "$rc" != 0 ]; then
    cat "$tmp/up.err"
    check_summary || exit 1
fi

bench() { # NAME args...: runs pagoda-bench, JSON in $tmp/NAME.json, records in $tmp/NAME.jsonl
    local name=$1
    shift
    "$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" --stats-interval-ms 50 \
        --stats-api-key adm --timeout-ms $((30000 * scale)) --json "$tmp/$name.json" \
        --output-requests "$tmp/$name.jsonl" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
}

# The report against the records, for a run that sent SENT requests.
check_report() { # NAME SENT
    local n=$1 sent=$2 j=$tmp/$1.json r=$tmp/$1.jsonl
    check "$n: the report counts $sent requests" jq_true "$j" ".num_requests == $sent"
    check "$n: completed + failed = requests sent" \
        jq_true "$j" '.completed + .failed == .num_requests'
    check "$n: one record per request" [ "$(wc -l <"$r")" = "$sent" ]
    check "$n: records: completed and failed agree with the report" jqs_true "$r" \
        "(map(select(.ok)) | length) == $(jq .completed "$j") and
         (map(select(.ok | not)) | length) == $(jq .failed "$j")"
    check "$n: output tokens = token ids the responses carried" jqs_true "$r" \
        "(map(select(.ok) | .token_ids | length) | add // 0) == $(jq .output_tokens "$j")"
    check "$n: output tokens = the router's usage.completion_tokens" jqs_true "$r" \
        "(map(select(.ok) | .usage.completion_tokens) | add // 0) == $(jq .output_tokens "$j")"
    check "$n: input tokens = prompt lengths = usage.prompt_tokens" jqs_true "$r" \
        "(map(select(.ok) | .prompt_len) | add // 0) == $(jq .input_tokens "$j") and
         (map(select(.ok) | .usage.prompt_tokens) | add // 0) == $(jq .input_tokens "$j")"
    check "$n: cached tokens = usage.cached_tokens" jqs_true "$r" \
        "(map(select(.ok) | .usage.cached_tokens) | add // 0) == $(jq .cached_tokens "$j")"
    check "$n: tokens of failed requests are counted apart" jqs_true "$r" \
        "(map(select(.ok | not) | .token_ids | length) | add // 0) == \
         $(jq .failed_output_tokens "$j")"
    check "$n: no usage disagrees with what arrived" jq_true "$j" '.usage_mismatches == 0'
    check "$n: failures by reason add up to the failed count" jq_true "$j" \
        '(.failures | map(.count) | add // 0) + .failures_other == .failed'
    local m
    for m in ttft_ms tpot_ms itl_ms e2e_ms prefill_tps; do
        check "$n: $m percentiles ordered (P95 between P90 and P99)" jq_true "$j" \
            ".$m | .count == 0 or (.min <= .p50 and .p50 <= .p90 and .p90 <= .p95 and
                                   .p95 <= .p99 and .p99 <= .max)"
    done
    check "$n: ITL samples = tokens after each first token" jqs_true "$r" \
        "(map(select(.ok) | .itl_ms | length) | add // 0) == $(jq .itl_ms.count "$j")"
    check "$n: shared-poll tokens = ITL samples of 0" jqs_true "$r" \
        "(map(select(.ok) | .itl_ms[] | select(. == 0)) | length) == \
         $(jq .polls.shared_tokens "$j")"
    # Independent recomputation: the mean TTFT and numpy-style percentiles of E2E and ITL.
    local pct='def pct(p): sort as $x | ($x | length) as $n | (($n - 1) * p / 100) as $h |
        ($h | floor) as $lo | if $lo >= $n - 1 then $x[$n - 1]
        else $x[$lo] + ($h - $lo) * ($x[$lo + 1] - $x[$lo]) end;
        def near(a; b): ((a - b) | fabs) <= 1e-6 * ([1, (b | fabs)] | max);'
    check "$n: mean TTFT and E2E p50/p90/p99 recomputed from the records" jqs_true "$r" \
        "$pct (map(select(.ok))) as \$ok | (\$ok | length) == 0 or
         (near(\$ok | map(.ttft_ms) | add / length; $(jq .ttft_ms.mean "$j")) and
          near(\$ok | map(.e2e_ms) | pct(50); $(jq .e2e_ms.p50 "$j")) and
          near(\$ok | map(.e2e_ms) | pct(90); $(jq .e2e_ms.p90 "$j")) and
          near(\$ok | map(.e2e_ms) | pct(99); $(jq .e2e_ms.p99 "$j")))"
    check "$n: ITL p99 recomputed from the records" jqs_true "$r" \
        "$pct [.[] | select(.ok) | .itl_ms[]] as \$i | (\$i | length) == 0 or
         near(\$i | pct(99); $(jq .itl_ms.p99 "$j"))"
    check "$n: engine figures were read" jq_true "$j" \
        '.engine.available and .engine.steps > 0 and .engine.computed_tokens > 0'
    # The engine's work against the requests: with nothing failed or preempted, the prompt
    # tokens it computed are the prompts less their cached tokens, and it decoded at least one
    # token per output token after each first (a stop seen a step late may cost one more).
    check "$n: engine prefill tokens = prompt tokens less cached ones (no preemption)" \
        jqs_true "$r" "$(jq '.engine.preemptions > 0 or .failed > 0' "$j") or
         (map(.prompt_len - .usage.cached_tokens) | add // 0) == $(jq .engine.prefill_tokens "$j")"
    check "$n: engine decode tokens cover every output token after the first" jqs_true "$r" \
        "(map(select(.ok) | (.token_ids | length) - 1) | add // 0) <= $(jq .engine.decode_tokens "$j")"
    check "$n: engine prefill and decode tokens/s are their counts over the duration" jq_true "$j" \
        '(.engine.prefill_tps - .engine.prefill_tokens / .duration_s | fabs) < 1e-6 and
         (.engine.decode_tps - .engine.decode_tokens / .duration_s | fabs) < 1e-6'
    check "$n: prefill throughput per request recomputed from the records" jqs_true "$r" \
        "$pct [.[] | select(.ok and .ttft_ms > 0) |
               (.prompt_len - .usage.cached_tokens) / (.ttft_ms / 1000)] as \$p |
         (\$p | length) == $(jq .prefill_tps.count "$j") and
         ((\$p | length) == 0 or near(\$p | pct(50); $(jq .prefill_tps.p50 "$j")))"
    check "$n: the text report says the same counts" \
        grep -q "Completed requests: *$(jq .completed "$j")\$" "$tmp/$n.out"
}

# -- page locality on the fresh pool (the first run): one sequence at a time, its blocks handed
# out consecutively, so every sample with it running reads locality 1.
bench local --api-key k1 --workload random --num-prompts 2 --input-len 100 --output-len 60 \
    --concurrency 1 --ignore-eos --seed 9 --bandwidth-gbs 1000 --matrix-tflops 100 && rc=0 ||
    rc=$?
check "local: one sequence at a time runs (exit $rc)" [ "$rc" = 0 ]
# 2 requests of 100 + 60 one at a time: 118 decode steps (59 each), the bound's parts add up.
check "local: the floor and the compute-and-bandwidth bound are reported" \
    jq_true "$tmp/local.json" '.bandwidth_floor.batch == 1 and .bound.decode_steps == 118 and
        .bound.prefill_flops > 0 and .bound.fraction > 0 and
        ((.bound.bound_s - .bound.prefill_s - .bound.decode_s) | fabs) < 1e-9'
check_report local 2
check "local: locality 1 on a fresh pool with one sequence (sampled while it ran)" \
    jq_true "$tmp/local.json" '.engine.locality_min == 1 and .engine.locality_mean == 1 and
                               .engine.run_length_mean >= 3'
check "local: the worker's time a step over the run (its counters' differences), a result a step" \
    jq_true "$tmp/local.json" '.engine.steps > 0 and .engine.worker_step_device_ms > 0 and
                               .engine.worker_step_wall_ms > 0 and
                               (.engine.worker_steps_timed - .engine.steps | fabs) <= 2'
check "local: the text report has the worker's GPU time a step" \
    grep -q "^Worker GPU time per step (delta): *[0-9.]* ms\$" "$tmp/local.out"

# -- random, open loop (Poisson), EOS ignored: every request gets exactly max_tokens.
bench rate --api-key k2 --workload random --num-prompts 8 --input-len 8:24 --output-len 4:10 \
    --rate 40 --seed 1 --ignore-eos && rc=0 || rc=$?
check "random --rate runs (exit $rc)" [ "$rc" = 0 ]
check_report rate 8
check "rate: all completed" jq_true "$tmp/rate.json" '.completed == 8 and .failed == 0'
check "rate: with --ignore-eos each request got max_tokens" jqs_true "$tmp/rate.jsonl" \
    'all(.[]; (.token_ids | length) == .max_tokens)'
check "rate: lengths within the ranges" jqs_true "$tmp/rate.jsonl" \
    'all(.[]; .prompt_len >= 8 and .prompt_len <= 24 and .max_tokens >= 4 and .max_tokens <= 10)'
check "rate: arrivals are scheduled, in order" jqs_true "$tmp/rate.jsonl" \
    'sort_by(.index) | [.[].scheduled_s] | . == sort and .[0] > 0'

# -- the same workload dumped: the same prompts the run sent (same seed, same flags).
"$bin_dir/pagoda-bench" --model "$tmp/model" --workload random --num-prompts 8 \
    --input-len 8:24 --output-len 4:10 --seed 1 --dump-workload "$tmp/dump.json" && rc=0 || rc=$?
check "--dump-workload writes the workload and exits (exit $rc)" [ "$rc" = 0 ]
check "the dump has the run's prompt and output lengths" [ \
    "$(jq -c '[.requests[] | [(.prompt | length), .max_tokens]]' "$tmp/dump.json")" = \
    "$(jq -s -c 'sort_by(.index) | [.[] | [.prompt_len, .max_tokens]]' "$tmp/rate.jsonl")" ]
check "the dump's token ids are below the vocabulary" jq_true "$tmp/dump.json" \
    '.vocab == 512 and all(.requests[].prompt[]; . >= 0 and . < 512)'

# -- random, closed loop, EOS honoured: the counts are whatever the responses carried.
bench conc --api-key k3 --workload random --num-prompts 6 --input-len 12 --output-len 12 \
    --concurrency 3 --seed 2 && rc=0 || rc=$?
check "random --concurrency runs (exit $rc)" [ "$rc" = 0 ]
check_report conc 6
check "conc: the report names the closed loop" jq_true "$tmp/conc.json" \
    '.mode == "concurrency" and .concurrency == 3 and .request_rate == null'

# -- shared-prefix.
bench shared --api-key k4 --workload shared-prefix --groups 2 --prompts-per-group 3 \
    --system-prompt-len 32 --question-len 8 --output-len 6 --concurrency 2 --ignore-eos \
    --seed 3 && rc=0 || rc=$?
check "shared-prefix runs (exit $rc)" [ "$rc" = 0 ]
check_report shared 6
check "shared: every prompt is system + question" jqs_true "$tmp/shared.jsonl" \
    'all(.[]; .prompt_len == 40)'

# -- multi-tenant from the extended tenants file: groups and a pin.
bench multi --workload multi-tenant --tenants "$tmp/tenants-bench.json" --num-prompts 8 \
    --system-prompt-len 16 --question-len 8 --output-len 5 --ignore-eos --seed 4 && rc=0 || rc=$?
check "multi-tenant runs (exit $rc)" [ "$rc" = 0 ]
check_report multi 8
check "multi: all completed" jq_true "$tmp/multi.json" '.failed == 0'
check "multi: per-tenant counts add up" jq_true "$tmp/multi.json" \
    '(.tenants | map(.requests) | add) == .num_requests and
     (.tenants | map(.output_tokens) | add) == .output_tokens and
     (.tenants | map(.name)) == ["alice", "bob", "carol", "dave"]'
check "multi: the pin reader's prompts are longer by the pin" jqs_true "$tmp/multi.jsonl" \
    'all(.[]; if .tenant == "dave" then .prompt_len == 40 else .prompt_len == 24 end)'

# -- failures are counted, not hidden: the second tenant's key is unknown to the router.
bench fail --workload multi-tenant --api-keys k1,wrong-key,k3 \
    --num-prompts 6 --system-prompt-len 8 --question-len 8 --output-len 4 --ignore-eos \
    && rc=0 || rc=$?
check "a run with failing requests still reports (exit $rc)" [ "$rc" = 0 ]
check_report fail 6
check "fail: the wrong key's 2 requests failed, the other 4 completed" jq_true "$tmp/fail.json" \
    '.failed == 2 and .completed == 4 and
     (.tenants | map(.failed)) == [0, 2, 0]'
check "fail: the reason is the router's" jq_true "$tmp/fail.json" \
    '.failures[0].count == 2 and (.failures[0].error | test("unknown API key"))'
check "fail: the failed records carry the error" jqs_true "$tmp/fail.jsonl" \
    'map(select(.ok | not)) | length == 2 and all(.[]; .tenant == "tenant1" and
     (.error | test("unknown API key")))'
check "fail: the text report lists the failures" grep -q "2 x .*unknown API key" "$tmp/fail.out"

# -- a sweep over two rates, with its plot.
"$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" --stats-api-key adm --api-key k2 \
    --workload random --num-prompts 4 --input-len 8 --output-len 4 --ignore-eos \
    --sweep 20,40 --json "$tmp/sweep.json" --output-requests "$tmp/sweep.jsonl" \
    --plot "$tmp/sweep.png" >"$tmp/sweep.out" 2>"$tmp/sweep.err" && rc=0 || rc=$?
check "--sweep runs (exit $rc)" [ "$rc" = 0 ]
check "the sweep's JSON has one report per rate" jq_true "$tmp/sweep.json" \
    '[.sweep[].request_rate] == [20, 40] and all(.sweep[]; .completed + .failed == 4)'
check "each rate of the sweep has fresh prompts (seed + k)" jq_true "$tmp/sweep.json" \
    '[.sweep[].seed] == [0, 1]'
check "the sweep's records name their rate" jqs_true "$tmp/sweep.jsonl" \
    'length == 8 and ([.[].rate] | unique) == [20, 40]'
png_magic=$(head -c 8 "$tmp/sweep.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
check "the plot is a PNG" [ "$png_magic" = 89504e470d0a1a0a ]

# -- a --duration run of the realistic workload, with its timeline: requests of long-tailed
# lengths decode side by side, so tables interleave (locality below 1); nothing starts after
# the duration; the windows add up to the report. The run is long enough for a few dozen
# requests: 3 s, times the time scale up to DURATION_SCALE_MAX (the sanitizer build's group runs
# its model uninstrumented, so it is about 3 times slower, not PAGODA_TEST_TIME_SCALE's 20).
DURATION_SCALE_MAX=3
dur=$((3 * (scale < DURATION_SCALE_MAX ? scale : DURATION_SCALE_MAX)))
bench long --api-key k2 --workload realistic --input-len 24:200 --output-len 16:80 \
    --concurrency 6 --duration "$dur" --timeline-interval 1 --timeline-plot "$tmp/long.png" \
    --ignore-eos --seed 11 && rc=0 || rc=$?
check "realistic --duration runs (exit $rc)" [ "$rc" = 0 ]
check_report long "$(jq .num_requests "$tmp/long.json")"
check "long: the workload's parameters are reported" jq_true "$tmp/long.json" \
    '.workload == "realistic" and (.workload_params | test("median 24, sigma 1.00, cap 200"))
     and .duration_limit_s == '"$dur"' and .workload_requests > .num_requests'
check "long: no request started after --duration" jqs_true "$tmp/long.jsonl" \
    "all(.[]; .start_s < $dur)"
check "long: lengths long-tailed within the caps" jqs_true "$tmp/long.jsonl" \
    'all(.[]; .prompt_len >= 1 and .prompt_len <= 200 and .max_tokens <= 80) and
     ([.[].prompt_len] | max) > 2 * ([.[].prompt_len] | sort | .[length / 2 | floor])'
check "long: tables interleave under churn (locality below 1)" jq_true "$tmp/long.json" \
    '.engine.locality_min < 1'
check "long: the timeline's windows cover the run and add up to the report" jq_true \
    "$tmp/long.json" '(.timeline | length) >= '"$dur"' and .timeline_interval_s == 1 and
     (.timeline | map(.started) | add) == .num_requests and
     (.timeline | map(.completed) | add) == .completed and
     (.timeline | map(.output_tokens) | add) == .output_tokens + .failed_output_tokens and
     all(.timeline[]; .tpot_ms.count == 0 or
                      (.tpot_ms.p50 <= .tpot_ms.p95 and .tpot_ms.p95 <= .tpot_ms.p99))'
check "long: the timeline's engine windows carry the counters" jq_true "$tmp/long.json" \
    '(.timeline | map(select(.engine != null)) | length) > 0 and
     all(.timeline[] | select(.engine != null) | .engine;
         .prefill_tokens >= 0 and .decode_tokens >= 0)'
check "long: the text report prints the timeline" grep -q "^Timeline (windows of 1.0 s" \
    "$tmp/long.out"
png_magic=$(head -c 8 "$tmp/long.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
check "long: the timeline plot is a PNG" [ "$png_magic" = 89504e470d0a1a0a ]

# -- --duration holds in open loop when the clients fall behind (400 req/s offered to 2 client
# threads): no request starts after the duration, whatever its scheduled arrival. 4 s, so that
# a client's first request ends before the deadline (under ASan on a busy machine it can take
# more than 1 s) and its next one starts late.
bench over --api-key k2 --workload random --num-prompts 4000 --input-len 16 --output-len 16 \
    --rate 400 --max-concurrency 2 --duration 4 --ignore-eos --seed 12 && rc=0 || rc=$?
check "over: an overloaded open loop with --duration runs (exit $rc)" [ "$rc" = 0 ]
check "over: no request started after --duration (+0.1 s)" jqs_true "$tmp/over.jsonl" \
    'length > 0 and all(.[]; .start_s < 4.1)'
check "over: late starts are counted, the workload was not used up" jq_true "$tmp/over.json" \
    '.late_starts > 0 and .workload_exhausted == false'
# -- a workload used up before --duration ends the run early, and says so.
bench short --api-key k2 --workload shared-prefix --groups 2 --prompts-per-group 2 \
    --system-prompt-len 16 --question-len 8 --output-len 4 --concurrency 2 --duration 60 \
    --ignore-eos --seed 13 && rc=0 || rc=$?
check "short: a --duration run of a small workload runs (exit $rc)" [ "$rc" = 0 ]
check "short: it says the workload was used up" jq_true "$tmp/short.json" \
    '.workload_exhausted == true and .num_requests == 4 and .duration_s < 60'
check "short: the text report and stderr say so" grep -q "WORKLOAD USED UP" "$tmp/short.out"
# -- a plot path gnuplot cannot quote is refused before anything is sent.
"$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" --concurrency 1 --duration 1 \
    --timeline-plot "$tmp/a'b.png" >/dev/null 2>"$tmp/quote.err" && rc=0 || rc=$?
check "a quote in --timeline-plot is refused at once (exit $rc)" [ "$rc" = 2 ]

# -- the engine's figures through pagoda stats: the work counters, locality, the steps in flight
# and the worker's time per step (wall and device, from its step results).
"$bin_dir/pagoda" --url "$url" --api-key adm stats --json >"$tmp/stats.json" 2>&1 && rc=0 || rc=$?
check "pagoda stats answers (exit $rc)" [ "$rc" = 0 ]
check "stats: work, locality, steps in flight and the worker's step times" jq_true \
    "$tmp/stats.json" '.prefill_tokens > 0 and .decode_tokens > 0 and .locality == 1 and
     .peak_steps_in_flight >= 1 and .worker_step_wall_us > 0 and .worker_step_device_us > 0 and
     .worker_step_device_us <= .worker_step_wall_us * 1.5 and
     .worker_steps_timed > 0 and .worker_steps_timed <= .steps and
     (.worker_step_device_us_total / .worker_steps_timed - .worker_step_device_us | fabs) <=
         0.01 * .worker_step_device_us + 1'

# -- refusals: a workload that does not fit the model's 2048 positions, bad flags.
"$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" --workload shared-prefix \
    >/dev/null 2>"$tmp/ctx.err" && rc=0 || rc=$?
check "the default shared-prefix (2048 + 128 + 256) is refused on a 2048-position model" \
    [ "$rc" = 2 ]
check "the refusal names the positions and the flags" \
    grep -q "max_position_embeddings.*--system-prompt-len" "$tmp/ctx.err"
"$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" --rate 1 --concurrency 2 \
    >/dev/null 2>&1 && rc=0 || rc=$?
check "--rate with --concurrency is refused (exit $rc)" [ "$rc" = 2 ]
"$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" --rate 1 --matrix-tflops 100 \
    >/dev/null 2>&1 && rc=0 || rc=$?
check "--matrix-tflops without --bandwidth-gbs is refused (exit $rc)" [ "$rc" = 2 ]
"$bin_dir/pagoda-bench" --url "$url" --model "$tmp/model" --rate 40 --bandwidth-gbs 1000 \
    --matrix-tflops 100 >/dev/null 2>&1 && rc=0 || rc=$?
check "--matrix-tflops at a finite --rate is refused (exit $rc)" [ "$rc" = 2 ]

if [ "$failed" != 0 ]; then
    for f in "$tmp"/*.err "$run"/*.log; do
        [ -s "$f" ] || continue
        echo "---- $f"
        tail -n 20 "$f"
    done
fi
check_summary
