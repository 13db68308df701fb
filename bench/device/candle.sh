#!/usr/bin/env bash
# On the lent GPU machine: issue 32's candle op and device-path overhead. The candle op's CUDA
# tests, the transformer block example (candle's own attention against the op, bf16, S = 1k..8k),
# and attn-cuda's resident_overhead example. Expects .device/candle/ from
# bench/device/build-candle-cuda.sh and .device/bin/ from `cargo xtask bundle`. Writes
# $OUT/summary.txt, $OUT/block.jsonl and $OUT/overhead.jsonl.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
work=/tmp/candle; mkdir -p $work
for f in .device/candle/*.gz; do gunzip -c "$f" > "$work/$(basename "${f%.gz}")"; chmod +x "$work/$(basename "${f%.gz}")"; done
{
  echo "bundle $(cat .device/COMMIT), candle build $(cat .device/candle/COMMIT)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "== attn-candle tests/cuda.rs"
  timeout 300 $work/test-cuda --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|SKIPPED|ok$"
  echo "== block example, bf16"
  timeout 400 $work/block --cuda --dtype bf16 --seqs 1024,2048,4096,8192 --iters 5 > "$out/block.jsonl" 2> "$out/block.err"
  echo "exit $?"; cat "$out/block.jsonl"; tail -3 "$out/block.err"
  echo "== attn-wgpu tests/resident.rs on the H100's Vulkan driver"
  (source bench/device/vulkan-env.sh; ATTN_REQUIRE_WGPU=1 timeout 200 .device/bin/test-wgpu-resident --test-threads 1 2>&1 | grep -E "^test |test result|panicked")
  echo "== resident_overhead"
  timeout 300 .device/bin/resident_overhead > "$out/overhead.jsonl" 2> "$out/overhead.err"; echo "exit $?"
  cat "$out/overhead.jsonl"; tail -3 "$out/overhead.err"
} 2>&1 | tee "$out/summary.txt"
