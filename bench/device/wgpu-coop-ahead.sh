#!/usr/bin/env bash
# On the lent GPU machine, in one call: the cooperative-matrix kernel with S one tile ahead
# (ATTN_WGPU_COOP_AHEAD=1: the next tile's S products issued before this tile's softmax) against
# the default, f16 at S=512/4096, D=64/128, with 16 and 32 rows. Verifies the full grid with the
# knob first. Carry .device and .gl as for wgpu.sh; about 4 minutes. The knob was removed after
# its run (bench/results/2026-11-24-h100-wgpu-coop-ahead-33760d2): run it at 33760d2.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_COOP_AHEAD=1 timeout 150 $attn verify --backend wgpu > "$final/verify/ahead.txt" 2>&1
echo "verify COOP_AHEAD=1 exit $?"; tail -n 1 "$final/verify/ahead.txt"
OUT="$final/f16" DTYPES=f16 DIMS=64,128 SEQS=512,4096 CONFIGS="default ATTN_WGPU_COOP_AHEAD=1 \
ATTN_WGPU_COOP_AHEAD=1,ATTN_WGPU_COOP_ROWS=32" bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf coop-ahead.tgz verify f16 && rm -rf verify f16
