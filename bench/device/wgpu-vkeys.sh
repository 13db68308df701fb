#!/usr/bin/env bash
# On the lent GPU machine, in one call: V staged by keys (ATTN_WGPU_V_KEYS=1, Variant::v_by_keys)
# against the default, f32. Verify the knob (full grid, then the f16 FMA path on the quick grid),
# time default and knob and a few knob shapes with wgpu-explore.sh at S=$SEQS, then the knob's
# f32 rows at S>=2048 next to SDPA's math and efficient backends in one wgpu.sh run.
# Carry .device and .gl as for wgpu.sh; about 4 minutes. Files under $OUT/.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_V_KEYS=1 timeout 90 $attn verify --backend wgpu > "$final/verify/vkeys.txt" 2>&1
echo "verify ATTN_WGPU_V_KEYS=1 exit $?"; tail -1 "$final/verify/vkeys.txt"
ATTN_WGPU_V_KEYS=1 ATTN_WGPU_COOP=0 timeout 40 $attn verify --quick --backend wgpu > "$final/verify/vkeys-fma-f16.txt" 2>&1
echo "verify ATTN_WGPU_V_KEYS=1,ATTN_WGPU_COOP=0 exit $?"; tail -1 "$final/verify/vkeys-fma-f16.txt"
for d in 64 128; do
  ATTN_WGPU_V_KEYS=1 $attn plan --backend wgpu --dtype f32 -d $d --seq 4096 --batch 4 --heads $((2048 / d)) 2>&1
done > "$final/verify/plan-vkeys.txt"
grep -i "kernel" "$final/verify/plan-vkeys.txt"
OUT="$final/explore" DTYPES=f32 SEQS=${SEQS:-2048,4096,8192} CONFIGS="default ATTN_WGPU_V_KEYS=1" \
  bash bench/device/wgpu-explore.sh
OUT="$final/shapes" DTYPES=f32 SEQS=4096 CONFIGS="ATTN_WGPU_V_KEYS=1,ATTN_WGPU_CHUNK=32 \
ATTN_WGPU_V_KEYS=1,ATTN_WGPU_ROWS=32,ATTN_WGPU_CHUNK=32 ATTN_WGPU_V_KEYS=1,ATTN_WGPU_ROW_THREADS=16 \
ATTN_WGPU_V_KEYS=1,ATTN_WGPU_ROWS=128,ATTN_WGPU_ROW_THREADS=16" bash bench/device/wgpu-explore.sh
ATTN_WGPU_V_KEYS=1 OUT="$final/grid" STEPS="bench sdpa report" DTYPES=f32 SEQS=2048,4096,8192 \
  bash bench/device/wgpu.sh > "$final/grid.log" 2>&1
cat "$final/grid/wgpu/targets.txt" 2>/dev/null || tail -20 "$final/grid.log"
cp "$final/grid/wgpu/attn-wgpu.jsonl" "$final/grid/wgpu/sdpa.jsonl" "$final/grid/wgpu/meta.json" "$final/" 2>/dev/null
cd "$final" && tar -czf vkeys.tgz verify explore shapes grid && rm -rf verify explore shapes grid
