#!/usr/bin/env bash
# On the lent GPU machine: attn verify's full grid on CUDA with the default family choice (every
# family: windows, soft-caps, ALiBi, varlen, paged caches, seqused_k, decode rows, head dims,
# long keys...), host-copy path, then the quick grid through the device-resident calls. Expects
# the release attn at $ATTN (default .device/bin/attn, as `cargo xtask bundle` leaves it). Writes
# $OUT/verify-full.json (every result and the verdict) and prints the verdicts.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
attn=${ATTN:-.device/bin/attn}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== verify full grid, host copies, default family (t=$SECONDS)"
timeout ${FULL_TIMEOUT:-330} $attn verify --backend cuda --json > "$out/verify-full.json" 2> "$out/verify-full.err"
echo "exit $?"
tail -4 "$out/verify-full.err"
echo "== verify quick grid, device-resident (t=$SECONDS)"
timeout 60 $attn verify --quick --backend cuda --resident 2>&1 | tail -2
echo "(t=$SECONDS)"
