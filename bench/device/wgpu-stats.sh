#!/usr/bin/env bash
# On the lent GPU machine: the adapter's features and cooperative-matrix shapes (attn-wgpu's
# `adapters` example), its f32 FMA rate through Vulkan (`fma_peak`), what the NVIDIA Vulkan driver made of every wgpu kernel variant (registers,
# spills, instruction counts; `pipeline_stats`), and the CPU's topology (for the CPU comparisons). Expects `cargo xtask bundle` output in .device/ and
# `cargo xtask vulkan-loader` output in .gl/ (carry both). Writes $OUT/pipeline-stats.txt.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
source bench/device/vulkan-env.sh
{ echo "commit $(cat .device/COMMIT)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  .device/bin/adapters; .device/bin/fma_peak; timeout 120 .device/bin/pipeline_stats ${DTYPES:-f32,f16} ${DIMS:-64,128}; } 2>&1 \
  | tee "$out/pipeline-stats.txt"
lscpu > "$out/lscpu.txt"; grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|MHz|L1d|L2|L3" "$out/lscpu.txt"
