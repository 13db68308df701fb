#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32's measured shapes with S = Q·Kᵀ split over the head
# dim (ATTN_WGPU_SPLIT_D=1, `Variant::split_d`: partial scores over each lane's dims, added across
# the row by a reduce-scatter, instead of Q shuffled per dim) against the default, at
# S=2048/4096/8192, none and causal, D=64 and 128; then D=128's split form with 64 and 128 rows at
# S=4096. Verifies the knob on the quick grid first and prints the driver's registers for the
# split forms. Carry .device and .gl as for wgpu.sh; about 6 minutes.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_SPLIT_D=1 timeout 90 $attn verify --quick --backend wgpu > "$final/verify/split.txt" 2>&1
echo "verify SPLIT_D=1 exit $?"; tail -n 1 "$final/verify/split.txt"
ATTN_WGPU_SPLIT_D=1 ATTN_WGPU_INTERLEAVE=1 timeout 90 $attn verify --quick --backend wgpu \
  > "$final/verify/split-il1.txt" 2>&1
echo "verify SPLIT_D=1 INTERLEAVE=1 exit $?"; tail -n 1 "$final/verify/split-il1.txt"
timeout 60 .device/bin/pipeline_stats f32 64,128 _qr > "$final/verify/pipeline-stats.txt" 2>&1
grep -E "^\*|_qr_il2" "$final/verify/pipeline-stats.txt" | cut -c1-220
OUT="$final/seqs" DTYPES=f32 DIMS=64,128 SEQS=2048,4096,8192 CONFIGS="default ATTN_WGPU_SPLIT_D=1" \
  bash bench/device/wgpu-explore.sh
OUT="$final/rows" DTYPES=f32 DIMS=128 SEQS=4096 CONFIGS="ATTN_WGPU_SPLIT_D=1,ATTN_WGPU_ROWS=64 \
ATTN_WGPU_SPLIT_D=1,ATTN_WGPU_ROWS=128" bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf split.tgz verify seqs rows && rm -rf verify seqs rows
