#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32 D=64 causal at S=2048 and 4096 (or $SEQS) with 64-row
# workgroups (ATTN_WGPU_ROWS=64) against the default (128 rows, S split over the head dim), in
# two interleaved rounds: the default was chosen before causal blocks went longest first across
# heads (b2ae7c7), and the rows it misses by are these. Verifies the quick grid with the knob
# first. Carry .device and .gl as for wgpu.sh; about 3 minutes (at the default SEQS).
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
mkdir -p "$final/verify"
ATTN_WGPU_ROWS=64 timeout 90 .device/bin/attn verify --quick --backend wgpu > "$final/verify/rows64.txt" 2>&1
echo "verify ATTN_WGPU_ROWS=64 exit $?"; tail -n 1 "$final/verify/rows64.txt"
for round in 1 2; do
  OUT="$final/r$round" DTYPES=f32 DIMS=64 SEQS=${SEQS:-2048,4096} MASKS=causal ITERS=10 CONFIGS="default ATTN_WGPU_ROWS=64" \
    bash bench/device/wgpu-explore.sh | sed "s/^/round $round: /"
done
cd "$final" && tar -czf d64-rows.tgz verify r1 r2 && rm -rf verify r1 r2
