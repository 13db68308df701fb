#!/usr/bin/env bash
# On the lent GPU machine: the NVIDIA driver's statistics (registers, local memory, instructions)
# of the f32 variants with `skip_unseen` (`_sk`) and the planner's choice, at D=64/128, both
# masks, for each of ATTN_WGPU_SKIP_PARTS = loop,v (the default), loop and v. Needs
# `pipeline_stats` in the bundle (carry .device and .gl). Seconds.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
mkdir -p "$final/stats"
for parts in loop,v loop v; do
  for mask in none causal; do
    echo "=== ATTN_WGPU_SKIP_PARTS=$parts $mask"
    ATTN_WGPU_SKIP_PARTS=$parts .device/bin/pipeline_stats f32 64,128 _sd_sk $mask 2>&1
  done
done | tee "$final/stats/pipeline-stats.txt"
