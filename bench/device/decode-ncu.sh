#!/usr/bin/env bash
# On the lent GPU machine: Nsight Compute's view of PyTorch SDPA's cuDNN decode kernel next to
# attn's decode kernel on the bandwidth-bound decode rows (issue 33), to see how cuDNN reads
# K/V faster: its grid, block, registers, shared memory and occupancy, and both kernels' DRAM
# throughput, memory-workload tables and warp stall reasons. Clocks are left free
# (`--clock-control none`), so the durations are the ones a timing run sees.
# Rows: NCU_ROWS (default: D=128 GQA 32:8 B=8 32k, B=32 4k, B=1 128k; D=64 GQA B=128 4k),
# `batch heads_q heads_kv seq_q seq_k head_dim` separated by ';'.
# Usage: `cargo xtask bundle` here, then on the GPU machine (carry .device)
# `bash bench/device/decode-ncu.sh`. Writes $OUT/decode-ncu.txt (both tools' reports).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
rows=${NCU_ROWS:-"8 32 8 1 32768 128;32 32 8 1 4096 128;1 32 8 1 131072 128;128 32 8 1 4096 64"}
sections=(--section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis
  --section SchedulerStats --section WarpStateStats --clock-control none)
tmp=$(mktemp -d)
{
  IFS=';' read -ra each <<< "$rows"
  for row in "${each[@]}"; do
    echo "$row" > "$tmp/row.txt"
    echo "==== row: $row — cuDNN (PyTorch SDPA), one call"
    timeout 240 "$ncu" --profile-from-start off "${sections[@]}" \
      python3 bench/peers/torch_sdpa_decode.py "$tmp/row.txt" --backends cudnn --profile-once 2>&1 | grep -v "^==PROF=="
    echo "==== row: $row — attn decode, the 21st launch"
    timeout 240 "$ncu" -k regex:attn_decode --launch-skip 20 --launch-count 1 "${sections[@]}" \
      .device/bin/decode_bench "$tmp/row.txt" 5 2>&1 | grep -v "^==PROF=="
  done
} 2>&1 | tee "$out/decode-ncu.txt"
