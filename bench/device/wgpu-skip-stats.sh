#!/usr/bin/env bash
# On the lent GPU machine: the NVIDIA driver's statistics (registers, local memory, shared
# memory with what it spills there, binary size) of the f32 variants that split S over the head
# dim with and without `skip_unseen` (`_sk`), and the planner's choice, at D=64/128, both masks.
# Needs `pipeline_stats` in the bundle (carry .device and .gl). Seconds. (At d9e67e8 it also ran
# each of the experiment's ATTN_WGPU_SKIP_PARTS = loop,v, loop and v; that knob is gone.)
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
mkdir -p "$final/stats"
for mask in none causal; do
  echo "=== $mask"
  .device/bin/pipeline_stats f32 64,128 _sd $mask 2>&1
done | tee "$final/stats/pipeline-stats.txt"
