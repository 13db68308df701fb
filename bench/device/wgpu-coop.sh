#!/usr/bin/env bash
# On the lent GPU machine: the cooperative-matrix (tensor-core) f16 kernel through Vulkan.
# Verifies the shape the planner picks on the full grid and every other shape on the quick grid
# (SHAPES, ATTN_WGPU_COOP_ROWS:ATTN_WGPU_COOP_KEYS), runs the coop_probe and coop_debug
# examples, then times every shape and the FMA f16 kernel with wgpu-explore.sh at S=$SEQS
# (default 4096). Carry .device and .gl; about 5 minutes. Files under $OUT/.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
source bench/device/vulkan-env.sh
attn=.device/bin/attn
shapes=${SHAPES:-"64:64 64:32 32:64 32:32 16:64 16:32"}
ATTN_WGPU_COOP=1 timeout 120 $attn verify --backend wgpu > "$out/verify-coop.txt" 2>&1
echo "verify coop (planner's shape, full grid) exit $?: $(grep verdict "$out/verify-coop.txt")"
for s in $shapes; do
  ATTN_WGPU_COOP=1 ATTN_WGPU_COOP_ROWS=${s%:*} ATTN_WGPU_COOP_KEYS=${s#*:} timeout 60 $attn verify --quick \
    --backend wgpu > "$out/verify-coop-m${s%:*}n${s#*:}.txt" 2>&1
  echo "verify coop m${s%:*}n${s#*:} (quick grid) exit $?: $(grep verdict "$out/verify-coop-m${s%:*}n${s#*:}.txt")"
done
timeout 60 .device/bin/coop_probe > "$out/coop-probe.txt" 2>&1; echo "coop_probe exit $?"; cat "$out/coop-probe.txt"
for rows in 16 64; do ATTN_WGPU_COOP=1 ATTN_WGPU_COOP_ROWS=$rows timeout 60 .device/bin/coop_debug; done > "$out/coop-debug.txt" 2>&1
echo "coop_debug exit $? (rows that differ from the host by more than 0.01 are the ones to read)"
configs="default"
for s in $shapes; do configs+=" ATTN_WGPU_COOP=1,ATTN_WGPU_COOP_ROWS=${s%:*},ATTN_WGPU_COOP_KEYS=${s#*:}"; done
CONFIGS=${CONFIGS:-$configs} DTYPES=${DTYPES:-f16} SEQS=${SEQS:-4096} bash bench/device/wgpu-explore.sh 2>&1 | tee "$out/explore.txt"
