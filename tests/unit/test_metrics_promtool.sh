#!/usr/bin/env bash
# promtool (Debian's prometheus, installed by scripts/install-deps) checks the text metrics/
# renders (test_metrics --print: a registry shaped like the router's). Its absence is a failure.
# Names take the prefix "pagoda_" (not vLLM's colon: Prometheus reserves colons for recording
# rules and promtool 2.42 fails on them), so every finding, lint or parse, fails.
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
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
    echo "promtool check metrics (exit $rc):"
    printf '%s\n' "$out"
    exit 1
fi
echo "promtool check metrics: $(grep -c '^# TYPE' "$text") families pass"
