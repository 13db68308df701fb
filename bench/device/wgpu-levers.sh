#!/usr/bin/env bash
# On the lent GPU machine: f32 kernel shapes that only knobs pick, before any of them becomes a
# default. 1. `attn verify --quick` with each (VERIFY, space-separated, knobs joined by commas);
# 2. registers and spills of the variants whose names contain PART (pipeline_stats); 3. times
# of each configuration in CONFIGS next to the default (wgpu-explore.sh, f32, S=$SEQS).
# Defaults: the shapes that read V, or K and V, straight from their buffers (ATTN_WGPU_V_DIRECT,
# ATTN_WGPU_K_DIRECT, ATTN_WGPU_ROWS). Carry .device and .gl; about 5 minutes. Files under $OUT/.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
source bench/device/vulkan-env.sh
attn=.device/bin/attn
verify=${VERIFY:-"ATTN_WGPU_V_DIRECT=1 ATTN_WGPU_V_DIRECT=1,ATTN_WGPU_ROWS=128 ATTN_WGPU_V_DIRECT=1,ATTN_WGPU_CHUNK=64 ATTN_WGPU_K_DIRECT=1 ATTN_WGPU_K_DIRECT=1,ATTN_WGPU_ROWS=128"}
for knob in $verify; do
  env ${knob//,/ } timeout 60 $attn verify --quick --backend wgpu > "$out/verify-${knob//=/_}.txt" 2>&1
  echo "verify $knob (quick grid) exit $?: $(grep verdict "$out/verify-${knob//=/_}.txt")"
done
timeout 90 .device/bin/pipeline_stats f32 64,128 "${PART:-_vd}" > "$out/pipeline-stats.txt" 2>&1
echo "pipeline_stats exit $?"; cut -c1-120 "$out/pipeline-stats.txt"
CONFIGS=${CONFIGS:-"default ATTN_WGPU_V_DIRECT=1 ATTN_WGPU_V_DIRECT=1,ATTN_WGPU_CHUNK=64 ATTN_WGPU_V_DIRECT=1,ATTN_WGPU_ROWS=128 ATTN_WGPU_K_DIRECT=1 ATTN_WGPU_K_DIRECT=1,ATTN_WGPU_ROWS=128 ATTN_WGPU_K_DIRECT=1,ATTN_WGPU_KEY_GROUPS=1"} \
  DTYPES=${DTYPES:-f32} SEQS=${SEQS:-4096} OUT="$out" bash bench/device/wgpu-explore.sh 2>&1 | tee "$out/explore.txt"
