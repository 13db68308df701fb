#!/usr/bin/env bash
# On the lent GPU machine, in one call: Q held in registers with 16 invocations per row
# (ATTN_WGPU_Q_REGS=1 with ATTN_WGPU_ROW_THREADS=16: half the registers of Q and O per
# invocation), f32, against the default at S=$SEQS (default 4096); and what the driver made of
# every Q-in-registers shape (pipeline_stats: registers, spills). Verifies the knob first (quick
# grid). Carry .device and .gl as for wgpu.sh; about 5 minutes. Files under $OUT/ (one archive).
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_Q_REGS=1 ATTN_WGPU_ROW_THREADS=16 timeout 90 $attn verify --quick --backend wgpu > "$final/verify/tx16-qr.txt" 2>&1
echo "verify Q_REGS=1 ROW_THREADS=16 exit $?"; tail -1 "$final/verify/tx16-qr.txt"
timeout 100 .device/bin/pipeline_stats f32 64,128 _qr > "$final/verify/pipeline-stats-qr.txt" 2>&1
grep -E "^\*?\s*flash|registers|spill" "$final/verify/pipeline-stats-qr.txt" | head -80
OUT="$final/explore" DTYPES=f32 SEQS=${SEQS:-4096} CONFIGS="default ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROW_THREADS=16 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROW_THREADS=16,ATTN_WGPU_KEY_GROUPS=1" bash bench/device/wgpu-explore.sh
OUT="$final/explore-d128" DTYPES=f32 DIMS=128 SEQS=${SEQS:-4096} CONFIGS="ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROW_THREADS=16,ATTN_WGPU_V_KEYS=1 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROW_THREADS=16,ATTN_WGPU_KEY_GROUPS=1,ATTN_WGPU_V_KEYS=1" bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf qregs-tx16.tgz verify explore explore-d128 && rm -rf verify explore explore-d128
