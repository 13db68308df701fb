#!/usr/bin/env bash
# On the lent GPU machine: the rotated walks of the Hopper backward (ATTN_CUDA_BWD_WALK=rotated)
# checked and timed against the aligned ones in one call. (a) The full gradient grid in the
# deterministic mode with the walks rotated (its turns ordered by step: the risky part), (b) ten
# runs of each mode bit for bit, causal and without a mask (backward_bench's determinism rows),
# (c) backward-ab.sh with the two walks as its settings (its quick verification of each, then
# interleaved rounds). Usage: `cargo xtask bundle` here, then on the GPU machine (carry .device)
# `bash bench/device/backward-walk.sh`; MAX_SEQ (default 8192), ROUNDS (default 2), DIMS (default
# 64,128), BUDGET_S (backward-ab.sh's, default 210).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=.device/bin
{
  echo "== ATTN_CUDA_BWD_WALK=rotated: attn verify --grad --backend cuda --deterministic (full grid)"
  ATTN_CUDA_BWD_WALK=rotated timeout 120 "$bin/attn" verify --grad --backend cuda --deterministic 2>&1 | tail -1
  echo "== ATTN_CUDA_BWD_WALK=rotated: ten runs of each mode"
  ATTN_CUDA_BWD_WALK=rotated timeout 90 "$bin/backward_bench" 1 1024 "${DIMS:-64,128}" both | grep determinism
} 2>&1 | tee "$out/checks.txt"
SETTINGS="ATTN_CUDA_BWD_WALK=aligned ATTN_CUDA_BWD_WALK=rotated" DIMS=${DIMS:-64,128} MAX_SEQ=${MAX_SEQ:-8192} \
  ROUNDS=${ROUNDS:-2} PEERS=0 BUDGET_S=${BUDGET_S:-210} bash bench/device/backward-ab.sh | grep -v '^{'
