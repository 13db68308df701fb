#!/usr/bin/env bash
# On the lent GPU machine: where the Hopper backward's roles wait. Runs backward_bench on the traced
# build (ATTN_CUDA_SM90_TRACE: each role's waits summed per CTA, kernels/flash_bwd_sm90.cu's Trace)
# in both modes, and bench/device/backward_trace.py summarizes each problem's trace into
# $OUT/backward-trace.txt (the CSVs stay on the machine: TRACE_DIR, default /tmp/bwd-trace).
# The traced build's times are not the kernel's. First, the traced build's gradients verified.
# Usage: `cargo xtask bundle` here, then on the GPU machine (carry .device)
# `bash bench/device/backward-trace.sh`; DIMS (default 128), MAX_SEQ (default 16384).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=.device/bin
trace=${TRACE_DIR:-/tmp/bwd-trace}; rm -rf "$trace"; mkdir -p "$trace"
{
  nvidia-smi --query-gpu=name --format=csv,noheader
  echo "commit: $(cat .device/COMMIT 2>/dev/null)"
  echo "== the traced build: attn verify --grad --quick --backend cuda (both modes)"
  ATTN_CUDA_SM90_TRACE=/tmp/bwd-trace-verify timeout 120 "$bin/attn" verify --grad --quick --backend cuda 2>&1 | tail -1
  ATTN_CUDA_SM90_TRACE=/tmp/bwd-trace-verify timeout 120 "$bin/attn" verify --grad --quick --backend cuda --deterministic 2>&1 | tail -1
  echo "== backward_bench on the traced build"
  ATTN_CUDA_SM90_TRACE="$trace" timeout 300 "$bin/backward_bench" 1 "${MAX_SEQ:-16384}" "${DIMS:-128}" both | grep -v '^{"determinism'
  python3 bench/device/backward_trace.py "$trace" > "$out/backward-trace.txt"
  cat "$out/backward-trace.txt"
} 2>&1 | tee "$out/log.txt"
