#!/usr/bin/env bash
# On the lent GPU machine, in one call: where the cooperative-matrix kernel's time goes (f16,
# S=4096, D=64 and 128): timed whole and with parts taken out (ATTN_WGPU_ABLATE, wrong results:
# see attn-wgpu's shader::Ablation). Also f32 D=64 with S split over the head dim and 128 rows
# against the default at S=2048/4096, and the quick grid verified with this commit's defaults
# first. Carry .device and .gl as for wgpu.sh; about 6 minutes.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
timeout 120 $attn verify --quick --backend wgpu > "$final/verify/quick.txt" 2>&1
echo "verify exit $?"; tail -n 1 "$final/verify/quick.txt"
OUT="$final/ablate" DTYPES=f16 DIMS=64,128 SEQS=4096 CONFIGS="default ATTN_WGPU_ABLATE=qk \
ATTN_WGPU_ABLATE=pv ATTN_WGPU_ABLATE=exp ATTN_WGPU_ABLATE=softmax ATTN_WGPU_ABLATE=barrier \
ATTN_WGPU_ABLATE=softmax+barrier ATTN_WGPU_ABLATE=qk+pv ATTN_WGPU_ABLATE=qk+pv+softmax+barrier" \
  bash bench/device/wgpu-explore.sh
OUT="$final/f32" DTYPES=f32 DIMS=64 SEQS=2048,4096 CONFIGS="default ATTN_WGPU_SPLIT_D=1,ATTN_WGPU_ROWS=128 \
ATTN_WGPU_SPLIT_D=1,ATTN_WGPU_ROWS=64" bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf coop-ablate.tgz verify ablate f32 && rm -rf verify ablate f32
