#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32's measured shapes with S split over the head dim and
# 128 rows (ATTN_WGPU_SPLIT_D=1, ATTN_WGPU_ROWS=128) against the default, D=64 and 128 at
# S=512/2048/8192, both masks (the question: causal, where the default is Q shuffled at D=64
# and 64 rows at D=128). Verifies the quick grid with the knobs first. Carry .device and .gl as
# for wgpu.sh; about 4 minutes.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_SPLIT_D=1 ATTN_WGPU_ROWS=128 timeout 90 $attn verify --quick --backend wgpu \
  > "$final/verify/split-rows128.txt" 2>&1
echo "verify SPLIT_D=1 ROWS=128 exit $?"; tail -n 1 "$final/verify/split-rows128.txt"
OUT="$final/f32" DTYPES=f32 DIMS=64,128 SEQS=512,2048,8192 CONFIGS="default \
ATTN_WGPU_SPLIT_D=1,ATTN_WGPU_ROWS=128" bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf causal-rows.tgz verify f32 && rm -rf verify f32
