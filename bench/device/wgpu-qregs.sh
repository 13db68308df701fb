#!/usr/bin/env bash
# On the lent GPU machine, in one call: Q held in registers (ATTN_WGPU_Q_REGS=1, Variant::q_regs)
# and the V-by-keys shapes not yet timed, f32. The knob's first shapes (plans.txt): D=64, 32-column
# K stages, 8 KiB of workgroup memory; D=128, V staged by keys, 16 KiB (the default's 24 / 48).
# Verify the knob (full grid; the 128-row shapes and the f16 FMA path on the quick grid), then
# time the default against the knob shapes with wgpu-explore.sh at S=$SEQS (default 4096). Carry
# .device and .gl as for wgpu.sh; about 5 minutes. Files under $OUT/ (one archive).
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
for knob in ATTN_WGPU_Q_REGS=1 ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROWS=128 ATTN_WGPU_Q_REGS=1,ATTN_WGPU_COOP=0; do
  quick=--quick; [[ $knob == ATTN_WGPU_Q_REGS=1 ]] && quick=
  env ${knob//,/ } timeout 90 $attn verify $quick --backend wgpu > "$final/verify/${knob//=/_}.txt" 2>&1
  echo "verify $knob exit $?"; tail -1 "$final/verify/${knob//=/_}.txt"
done
for cfg in ATTN_WGPU_Q_REGS=1 ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROWS=128; do for d in 64 128; do
  env ${cfg//,/ } $attn plan --backend wgpu --dtype f32 -d $d --seq 4096 --batch 4 --heads $((2048 / d)) 2>&1
done; done > "$final/verify/plans.txt"
grep -E "^(kernel|shared)" "$final/verify/plans.txt"
OUT="$final/explore" DTYPES=f32 SEQS=${SEQS:-4096} CONFIGS="default ATTN_WGPU_Q_REGS=1 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROWS=128 ATTN_WGPU_Q_REGS=1,ATTN_WGPU_KEY_GROUPS=1 \
ATTN_WGPU_Q_REGS=1,ATTN_WGPU_ROWS=128,ATTN_WGPU_KEY_GROUPS=1 ATTN_WGPU_Q_REGS=1,ATTN_WGPU_V_KEYS=0" \
  bash bench/device/wgpu-explore.sh
# V staged by keys with 16 invocations per row: D=128 only (at D=64 such stages would be the
# whole head dim).
OUT="$final/explore-d128" DTYPES=f32 DIMS=128 SEQS=${SEQS:-4096} CONFIGS="ATTN_WGPU_V_KEYS=1,ATTN_WGPU_ROW_THREADS=16" \
  bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf qregs.tgz verify explore explore-d128 && rm -rf verify explore explore-d128
