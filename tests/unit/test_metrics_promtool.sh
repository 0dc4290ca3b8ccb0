#!/usr/bin/env bash
# promtool (Debian's prometheus, installed by scripts/install-deps) checks the text metrics/
# renders (test_metrics --print: a registry shaped like the router's). Its absence is a failure.
#
# One lint finding is accepted: "metric names should not contain ':'". The issue asks for
# vLLM's style of names (prefix "pagoda:", as vLLM's "vllm:"), which Prometheus parses and
# scrapes; promtool 2.42 lints colons because recording rules use them. Every other finding, and
# any parse error, fails.
set -euo pipefail
test_metrics=${1:?usage: test_metrics_promtool.sh path/to/test_metrics}
if ! command -v promtool >/dev/null; then
    echo "promtool not found: install the Debian package prometheus (scripts/install-deps)"
    exit 1
fi
text=$(mktemp /tmp/pagoda-metrics.XXXXXX)
trap 'rm -f "$text"' EXIT
"$test_metrics" --print >"$text"
[ -s "$text" ] || { echo "test_metrics --print wrote nothing"; exit 1; }
rc=0
out=$(promtool check metrics <"$text" 2>&1) || rc=$?
other=$(printf '%s\n' "$out" | grep -v "metric names should not contain ':'" | grep -v '^$' || true)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ] || [ -n "$other" ]; then
    echo "promtool check metrics (exit $rc):"
    printf '%s\n' "$out"
    exit 1
fi
echo "promtool check metrics: $(grep -c '^# TYPE' "$text") families pass (colon lint only: $((rc == 3)))"
