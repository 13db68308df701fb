#!/usr/bin/env bash
# On the lent GPU machine, in one call: with Q in registers, is P·V cheaper with the
# probabilities read from workgroup memory (one vec4 load per key for four rows) than shuffled
# from their lanes (four shuffles), and with 4x16 micro-tiles (a Q shuffle per 16 keys, not 8)?
# f32, S=$SEQS (default 4096), each head dim's knob shapes next to the default in the same call;
# then what the driver made of them (pipeline_stats: registers, spills). Carry .device and .gl
# as for wgpu.sh; about 5 minutes. Files under $OUT/ (one archive).
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
mkdir -p "$final/stats"
OUT="$final/d128" DTYPES=f32 DIMS=128 SEQS=${SEQS:-4096} CONFIGS="default \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_P_SHUFFLE=0,ATTN_WGPU_V_KEYS=1,ATTN_WGPU_CHUNK=32 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_P_SHUFFLE=0,ATTN_WGPU_V_KEYS=1 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_KEY_GROUPS=4,ATTN_WGPU_V_KEYS=1" bash bench/device/wgpu-explore.sh
OUT="$final/d64" DTYPES=f32 DIMS=64 SEQS=${SEQS:-4096} CONFIGS="default \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_P_SHUFFLE=0,ATTN_WGPU_V_KEYS=1 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_KEY_GROUPS=4,ATTN_WGPU_V_KEYS=1" bash bench/device/wgpu-explore.sh
for part in _sg_vk_qr _n128_c64_full_sg_pshfl_vk_qr _n128_c32_full_sg_pshfl_vk_qr; do
  timeout 60 .device/bin/pipeline_stats f32 64,128 $part
done > "$final/stats/pipeline-stats.txt" 2>&1
grep -E "full.*(_sg_vk_qr|n128.*pshfl_vk_qr)|^\*" "$final/stats/pipeline-stats.txt" | sort -u
cd "$final" && tar -czf pv.tgz d128 d64 stats && rm -rf d128 d64 stats
