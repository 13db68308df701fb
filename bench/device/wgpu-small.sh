#!/usr/bin/env bash
# On the lent GPU machine, in one call: (1) f16 at short sequences, where f32 has caught up with
# it (bench/results/2026-11-24-h100-wgpu-924e55f: D=64 S=512 0.99x): the cooperative-matrix
# kernel's 16-, 32- and 64-row shapes and the FMA f16 kernel; (2) f32's measured shapes with 128
# rows, interleaved by two or four (`Variant::interleave`), against the default. Verifies the
# 128-row interleaved shapes first. Carry .device and .gl as for wgpu.sh; about 5 minutes.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
for il in 2 4; do
  ATTN_WGPU_ROWS=128 ATTN_WGPU_INTERLEAVE=$il timeout 90 $attn verify --quick --backend wgpu \
    > "$final/verify/rows128-il$il.txt" 2>&1
  echo "verify ROWS=128 INTERLEAVE=$il exit $?"; tail -n 1 "$final/verify/rows128-il$il.txt"
done
OUT="$final/f16" DTYPES=f16 DIMS=64,128 SEQS=512,1024 CONFIGS="default ATTN_WGPU_COOP_ROWS=32 \
ATTN_WGPU_COOP_ROWS=64 ATTN_WGPU_COOP=0" bash bench/device/wgpu-explore.sh
OUT="$final/f32" DTYPES=f32 DIMS=64,128 SEQS=512,4096 CONFIGS="default ATTN_WGPU_ROWS=128,ATTN_WGPU_INTERLEAVE=2 \
ATTN_WGPU_ROWS=128,ATTN_WGPU_INTERLEAVE=4" bash bench/device/wgpu-explore.sh
timeout 60 .device/bin/pipeline_stats f32 64,128 _m128n > "$final/verify/pipeline-stats.txt" 2>&1
grep -E "_qr_il" "$final/verify/pipeline-stats.txt" | cut -c1-150
cd "$final" && tar -czf small.tgz verify f16 f32 && rm -rf verify f16 f32
