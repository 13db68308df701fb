#!/usr/bin/env bash
# On the lent GPU machine, in one call: the cooperative-matrix kernel with O starting from the
# zero matrix (the default from this commit on) against O's zero blocks loaded from scratch
# (ATTN_WGPU_COOP_ZERO=scratch, the kernel until then) and against K's next-tile blocks loaded
# ahead (ATTN_WGPU_COOP_PREFETCH=1), f16 at S=512 and 4096; f32 at S=512 beside them. Verifies
# the full grid with the default and the quick grid with the prefetch first. Carry .device and
# .gl as for wgpu.sh; about 5 minutes. Both settings were removed after their run (65b11f8).
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
timeout 120 $attn verify --backend wgpu > "$final/verify/default.txt" 2>&1
echo "verify exit $?"; tail -n 1 "$final/verify/default.txt"
ATTN_WGPU_COOP_PREFETCH=1 timeout 90 $attn verify --quick --backend wgpu > "$final/verify/prefetch.txt" 2>&1
echo "verify COOP_PREFETCH=1 exit $?"; tail -n 1 "$final/verify/prefetch.txt"
OUT="$final/f16" DTYPES=f16 DIMS=64,128 SEQS=512,4096 CONFIGS="default ATTN_WGPU_COOP_ZERO=scratch \
ATTN_WGPU_COOP_PREFETCH=1" bash bench/device/wgpu-explore.sh
OUT="$final/f32" DTYPES=f32 DIMS=64,128 SEQS=512 bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf coop-zero.tgz verify f16 f32 && rm -rf verify f16 f32
