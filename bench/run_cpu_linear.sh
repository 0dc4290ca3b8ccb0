#!/usr/bin/env bash
# Builds and runs bench/cpu_linear_vs_openblas.c (installs Debian's OpenBLAS if missing).
# usage: bench/run_cpu_linear.sh [BUILD_DIR]   (BUILD_DIR holds a pagoda build, default build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dpkg-query -W -f='${Status}' libopenblas-dev 2>/dev/null | grep -q "install ok installed" ||
    { apt-get update -qq && apt-get install -y -qq libopenblas-dev >/dev/null; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -std=c11 -O2 -D_GNU_SOURCE -I"$root" -I/usr/include/x86_64-linux-gnu/openblas-pthread \
    "$root/bench/cpu_linear_vs_openblas.c" "$build/kernels/libpagoda_kernels_cpu.a" \
    -lopenblas -lm -o "$out/bench"
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} "$out/bench"
