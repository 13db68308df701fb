#!/usr/bin/env bash
# On the lent GPU machine: the cooperative-matrix (tensor-core) f16 kernel through Vulkan.
# Verifies it with the memory-model fix (attn_wgpu::spirv, the default) on the full grid, and
# without it (ATTN_WGPU_COOP_MODEL=vulkan, quick grid) to show what that changes; runs the
# coop_probe and coop_debug examples; then times CONFIGS (default: each coop shape) with
# wgpu-explore.sh at S=$SEQS, DTYPES (default f16). Carry .device and .gl; about 5 minutes. Files under $OUT/.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
source bench/device/vulkan-env.sh
attn=.device/bin/attn
for model in glsl450 vulkan; do
  grid=(); [[ $model == vulkan ]] && grid=(--quick)
  env ATTN_WGPU_COOP=1 ATTN_WGPU_COOP_MODEL=$model timeout 120 $attn verify "${grid[@]}" --backend wgpu \
    > "$out/verify-coop-$model.txt" 2>&1
  echo "verify coop ($model memory model) exit $?: $(grep verdict "$out/verify-coop-$model.txt")"
done
timeout 60 .device/bin/coop_probe > "$out/coop-probe.txt" 2>&1; echo "coop_probe exit $?"; cat "$out/coop-probe.txt"
for rows in 16 64; do ATTN_WGPU_COOP=1 ATTN_WGPU_COOP_ROWS=$rows timeout 60 .device/bin/coop_debug; done > "$out/coop-debug.txt" 2>&1; echo "coop_debug exit $?"
head -80 "$out/coop-debug.txt"
CONFIGS=${CONFIGS:-"ATTN_WGPU_COOP=1 ATTN_WGPU_COOP=1,ATTN_WGPU_COOP_ROWS=32 ATTN_WGPU_COOP=1,ATTN_WGPU_COOP_ROWS=16"} \
  DTYPES=${DTYPES:-f16} SEQS=${SEQS:-4096} bash bench/device/wgpu-explore.sh 2>&1 | tee "$out/explore.txt"
