#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32 with key groups and stages that no row sees skipped
# (ATTN_WGPU_SKIP_UNSEEN=1, `Variant::skip_unseen`) against the default, causal at D=64/128 and
# S=$SEQS (1024-8192), and without a mask at S=2048 (nothing to skip there: the branches' cost),
# in $ROUNDS interleaved rounds. Verifies the full grid with the knob first. Carry .device and
# .gl as for wgpu.sh; about 4 minutes at the defaults.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
mkdir -p "$final/verify"
ATTN_WGPU_SKIP_UNSEEN=1 timeout 120 .device/bin/attn verify --backend wgpu > "$final/verify/skip.txt" 2>&1
echo "verify ATTN_WGPU_SKIP_UNSEEN=1 exit $?"; tail -n 1 "$final/verify/skip.txt"
for round in $(seq 1 "${ROUNDS:-3}"); do
  OUT="$final/r$round" DTYPES=f32 DIMS=64,128 SEQS=${SEQS:-1024,2048,4096,8192} MASKS=causal ITERS=10 \
    CONFIGS="default ATTN_WGPU_SKIP_UNSEEN=1" bash bench/device/wgpu-explore.sh | sed "s/^/round $round: /"
  OUT="$final/r$round-none" DTYPES=f32 DIMS=64,128 SEQS=2048 MASKS=none ITERS=10 \
    CONFIGS="default ATTN_WGPU_SKIP_UNSEEN=1" bash bench/device/wgpu-explore.sh | sed "s/^/round $round: /"
done
cd "$final" && tar -czf skip.tgz verify r* && rm -rf verify r[0-9]*
