#!/usr/bin/env bash
# On the lent GPU machine: the cooperative-matrix (tensor-core) f16 kernel through Vulkan.
# Verifies the shape the planner picks on the full grid and each shape (ROWS: rows per
# workgroup, ATTN_WGPU_COOP_ROWS) on the quick grid, runs the coop_probe and coop_debug examples,
# then times every shape and the FMA f16 kernel (ATTN_WGPU_COOP=0) with wgpu-explore.sh at
# S=$SEQS (default 4096). Carry .device and .gl; about 4 minutes. Files under $OUT/.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
source bench/device/vulkan-env.sh
attn=.device/bin/attn
rows=${ROWS:-"16 32 64"}
timeout 120 $attn verify --backend wgpu > "$out/verify-coop.txt" 2>&1
echo "verify (planner's shape, full grid) exit $?: $(grep verdict "$out/verify-coop.txt")"
for r in $rows; do
  ATTN_WGPU_COOP_ROWS=$r timeout 60 $attn verify --quick --backend wgpu > "$out/verify-coop-m$r.txt" 2>&1
  echo "verify coop m$r (quick grid) exit $?: $(grep verdict "$out/verify-coop-m$r.txt")"
done
timeout 60 .device/bin/coop_probe > "$out/coop-probe.txt" 2>&1; echo "coop_probe exit $?"; cat "$out/coop-probe.txt"
for r in 16 64; do ATTN_WGPU_COOP_ROWS=$r timeout 60 .device/bin/coop_debug; done > "$out/coop-debug.txt" 2>&1
echo "coop_debug exit $? (rows that differ from the host by more than 0.01 are the ones to read)"
configs="ATTN_WGPU_COOP=0"
for r in $rows; do configs+=" ATTN_WGPU_COOP_ROWS=$r"; done
CONFIGS=${CONFIGS:-$configs} DTYPES=${DTYPES:-f16} SEQS=${SEQS:-4096} bash bench/device/wgpu-explore.sh 2>&1 | tee "$out/explore.txt"
