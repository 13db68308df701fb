#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32's measured shapes (D=64, D=128) with two or four row
# groups' lanes interleaved (ATTN_WGPU_INTERLEAVE=2|4, `Variant::interleave`: lanes 2k and 2k+1
# read the same K and V vec4s, which NVIDIA returns in half the cycles of neighbouring vec4s)
# against the default, at S=2048/4096/8192, none and causal. Verifies each knob on the quick
# grid first and prints the driver's registers for the three forms. Carry .device and .gl as for
# wgpu.sh; about 6 minutes.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
for il in 2 4; do
  ATTN_WGPU_INTERLEAVE=$il timeout 90 $attn verify --quick --backend wgpu > "$final/verify/il$il.txt" 2>&1
  echo "verify INTERLEAVE=$il exit $?"; tail -1 "$final/verify/il$il.txt"
done
timeout 60 .device/bin/pipeline_stats f32 64,128 _qr > "$final/verify/pipeline-stats.txt" 2>&1
grep -E "^\*|_qr_il|_qr " "$final/verify/pipeline-stats.txt" | grep -E "_vk_qr" | cut -c1-220
OUT="$final/seqs" DTYPES=f32 DIMS=64,128 SEQS=2048,4096,8192 CONFIGS="default ATTN_WGPU_INTERLEAVE=2 \
ATTN_WGPU_INTERLEAVE=4" bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf interleave.tgz verify seqs && rm -rf verify seqs
