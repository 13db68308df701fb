#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32 D=64 with Q in registers, 4x16 micro-tiles and V
# staged by keys (m64n128, 16 KiB of workgroup memory; +5-8% at S=4096 in wgpu-pv.sh) against
# the default at S=2048/4096/8192, and its neighbours at S=4096 (128 rows; V staged by columns in
# 32- or 64-column stages). Verifies the shape first (full grid at D=64 is not separate: the
# quick grid with the knobs). Carry .device and .gl as for wgpu.sh; about 5 minutes.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_Q_REGS=1 ATTN_WGPU_KEY_GROUPS=4 ATTN_WGPU_V_KEYS=1 timeout 90 $attn verify --quick --backend wgpu \
  > "$final/verify/qr-kg4-vk.txt" 2>&1
echo "verify Q_REGS=1 KEY_GROUPS=4 V_KEYS=1 exit $?"; tail -1 "$final/verify/qr-kg4-vk.txt"
OUT="$final/seqs" DTYPES=f32 DIMS=64 SEQS=2048,4096,8192 CONFIGS="default \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_KEY_GROUPS=4,ATTN_WGPU_V_KEYS=1" bash bench/device/wgpu-explore.sh
OUT="$final/shapes" DTYPES=f32 DIMS=64 SEQS=4096 CONFIGS="ATTN_WGPU_Q_REGS=1,ATTN_WGPU_KEY_GROUPS=4,ATTN_WGPU_V_KEYS=1,ATTN_WGPU_ROWS=128 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_KEY_GROUPS=4,ATTN_WGPU_V_KEYS=0,ATTN_WGPU_CHUNK=32 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_KEY_GROUPS=4,ATTN_WGPU_V_KEYS=0 ATTN_WGPU_KEY_GROUPS=4,ATTN_WGPU_V_KEYS=1" \
  bash bench/device/wgpu-explore.sh
timeout 60 .device/bin/pipeline_stats f32 64 n128_c32_full_sg_pshfl > "$final/verify/pipeline-stats.txt" 2>&1
grep -E "n128_c32_full_sg_pshfl|^\*" "$final/verify/pipeline-stats.txt"
cd "$final" && tar -czf d64.tgz verify seqs shapes && rm -rf verify seqs shapes
