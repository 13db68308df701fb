#!/usr/bin/env bash
# On the lent GPU machine: the long-keys checks of issue 35 (the wgpu key count defect). attn
# verify's full grid (long-keys: 32k and 128k keys) on wgpu over the H100's Vulkan driver with
# subgroups and without, and on CUDA; then decode rows at 1M keys on wgpu (f32, f16 on
# cooperative matrices, subgroups off), whose plans must show no key split (a hardware adapter
# has no loop limit) and whose accuracy lines compare with the f64 reference.
# Expects `cargo xtask bundle` output in .device/ and the Vulkan loader in .gl/. Writes a summary
# to $OUT/summary.txt.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
{
  $attn backends
  for setting in "" ATTN_WGPU_SUBGROUPS=0; do
    echo "== verify wgpu ${setting:-(defaults)}"
    env $setting timeout 200 $attn verify --backend wgpu 2>&1 | tail -4
  done
  echo "== verify cuda"
  timeout 200 $attn verify --backend cuda 2>&1 | tail -4
  for args in "--dtype f32" "--dtype f16" "--dtype f32 ATTN_WGPU_SUBGROUPS=0"; do
    set -- $args
    echo "== wgpu decode, 1M keys: $args"
    env ${3:-ATTN_X=1} timeout 120 $attn run --backend wgpu $1 $2 --seq-q 1 --seq-k 1048576 -d 128 --heads 8 \
      --kv-heads 2 --no-causal --lse --iters 3 --warmup 1 2>&1 | grep -E "kernel |split|time |accuracy|error"
  done
} 2>&1 | tee "$out/summary.txt"
