#!/usr/bin/env bash
# On the lent GPU machine: bench/device/stream_probe.cu (how fast each way of copying K and V
# streams them) on two decode-like grids, with PyTorch SDPA cuDNN's decode and torch.sum's read
# rate on the same byte counts in the same call. Needs nvcc (CUDA 13) there. Writes
# $OUT/stream-probe.jsonl.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvcc -O3 -arch=sm_90a -o /tmp/stream_probe bench/device/stream_probe.cu || exit 1
# (regions, rows): B=32 MHA 4k keys (1024 CTAs); B=8 GQA 32k keys in two splits (128 CTAs).
for grid in "1024 4096" "128 16384"; do
  timeout 120 /tmp/stream_probe $grid 30 ${PART:-0} | tee -a "$out/stream-probe.jsonl"
done
printf '32 32 32 1 4096 128\n8 32 8 1 32768 128\n' > /tmp/probe-rows.txt
timeout 120 python3 bench/peers/torch_sdpa_decode.py /tmp/probe-rows.txt --iters 30 --backends cudnn --roofline-gib 2 |
  tee -a "$out/stream-probe.jsonl"
