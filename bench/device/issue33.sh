#!/usr/bin/env bash
# On the lent GPU machine: issue 33's features after the merge, in one call. attn verify's full
# grid (windows, soft-caps, ALiBi, varlen, paged caches, seqused_k, decode rows) on CUDA with the
# default family choice and with the Ampere/Ada family forced, and on wgpu over the H100's Vulkan
# driver; the device-resident tests; compute-sanitizer memcheck on one paged + varlen + ALiBi
# call and one soft-capped window call. Expects `cargo xtask bundle` output in .device/ and the
# Vulkan loader in .gl/. Writes $OUT/summary.txt.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
source bench/device/vulkan-env.sh
bin=.device/bin
attn=$bin/attn
{
  cat .device/COMMIT; echo
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for setting in "" ATTN_CUDA_FAMILY=ampere; do
    echo "== attn verify --backend cuda ${setting:-(default family choice)}"
    env ${setting:-ATTN_X=1} timeout 240 $attn verify --backend cuda 2>&1 | tail -3
  done
  echo "== attn verify --backend wgpu (Vulkan)"
  timeout 240 $attn verify --backend wgpu 2>&1 | tail -3
  echo "== tests/resident.rs"
  timeout 200 $bin/test-cuda-resident --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED"
  echo "== memcheck: paged + varlen + ALiBi (bf16, D=128, causal, GQA 4:1)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $attn run --backend cuda --varlen 7 \
    --page-size 16 --alibi -b 3 --seq 100 --heads 8 --kv-heads 2 --iters 1 --warmup 0 --check-rows 32 2>&1 \
    | grep -E "ERROR SUMMARY|kernel |accuracy|error"
  echo "== memcheck: decode, window + soft-cap (bf16, D=128, seq_q 4, 5000 keys)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $attn run --backend cuda --seq-q 4 --seq-k 5000 \
    --window 1000,0 --softcap 30 --heads 8 --kv-heads 2 --iters 1 --warmup 0 --check-rows 32 2>&1 \
    | grep -E "ERROR SUMMARY|kernel |accuracy|error"
} 2>&1 | tee "$out/summary.txt"
