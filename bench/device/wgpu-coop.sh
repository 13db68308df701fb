#!/usr/bin/env bash
# On the lent GPU machine: the cooperative-matrix (tensor-core) f16 kernel through Vulkan.
# 1. attn verify on the full grid for each memory model (MODELS, ATTN_WGPU_COOP_MODEL: annotated,
#    the default, and glsl450, both verified on the H100) and each tile width (KEYS,
#    ATTN_WGPU_COOP_KEYS: 32, and 64, which fails causal large-score cases under both models);
# 2. each shape (ROWS, ATTN_WGPU_COOP_ROWS) on the quick grid; the coop_probe and coop_debug
#    examples;
# 3. times with wgpu-explore.sh at S=$SEQS (default 4096): the FMA f16 kernel (ATTN_WGPU_COOP=0)
#    and the planner's coop shape under each model, then every shape (CONFIGS overrides).
# Carry .device and .gl; about 5 minutes. Files under $OUT/.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
source bench/device/vulkan-env.sh
attn=.device/bin/attn
models=${MODELS:-"annotated glsl450"}
keys=${KEYS:-"32 64"}
rows=${ROWS:-"16 32 64"}
for m in $models; do for n in $keys; do
  ATTN_WGPU_COOP_MODEL=$m ATTN_WGPU_COOP_KEYS=$n timeout 120 $attn verify --backend wgpu \
    > "$out/verify-coop-$m-n$n.txt" 2>&1
  echo "verify coop, $m model, $n-key tiles (full grid) exit $?: $(grep verdict "$out/verify-coop-$m-n$n.txt")"
done; done
for r in $rows; do
  ATTN_WGPU_COOP_ROWS=$r timeout 60 $attn verify --quick --backend wgpu > "$out/verify-coop-m$r.txt" 2>&1
  echo "verify coop m$r (quick grid) exit $?: $(grep verdict "$out/verify-coop-m$r.txt")"
done
timeout 60 .device/bin/coop_probe > "$out/coop-probe.txt" 2>&1; echo "coop_probe exit $?"; cat "$out/coop-probe.txt"
for r in 16 64; do ATTN_WGPU_COOP_ROWS=$r timeout 60 .device/bin/coop_debug; done > "$out/coop-debug.txt" 2>&1
echo "coop_debug exit $? (rows that differ from the host by more than 0.01 are the ones to read)"
configs="ATTN_WGPU_COOP=0"
for m in $models; do configs+=" ATTN_WGPU_COOP_MODEL=$m"; done
for r in $rows; do configs+=" ATTN_WGPU_COOP_ROWS=$r"; done
CONFIGS=${CONFIGS:-$configs} DTYPES=${DTYPES:-f16} SEQS=${SEQS:-4096} bash bench/device/wgpu-explore.sh 2>&1 | tee "$out/explore.txt"
