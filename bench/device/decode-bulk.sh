#!/usr/bin/env bash
# On the lent GPU machine: the decode family's K/V copy paths on sm_90 (issue 33), bulk copies
# (ATTN_CUDA_DECODE_COPY=bulk: one cp.async.bulk per K/V row, completing on an mbarrier) against
# cp.async (ATTN_CUDA_DECODE_COPY=cp.async, the path before) and PyTorch SDPA cuDNN.
# (a) `attn verify --backend cuda --quick --family decode` (the default path), the same with
# cp.async forced; (b) timings: crates/attn-cuda/examples/decode_bench.rs with each copy path and
# bench/peers/torch_sdpa_decode.py (cuDNN, with the torch.sum and copy rooflines) on
# decode-bulk-rows.txt, in two interleaved rounds (bulk, cp.async, SDPA; cp.async, bulk, SDPA);
# then both paths again with ATTN_CUDA_DECODE_SPLITS=33 on decode-bulk-split-rows.txt; (c)
# `attn verify --backend cuda --resident --family decode` (host-copy and device-resident), and
# compute-sanitizer memcheck on a small bulk run (causal, 4 queries, several splits, a tail chunk).
# decode_bulk_report.py then writes $OUT/h100-decode-bulk.json.
# Runs from a folder holding bin/ (attn, decode_bench), this script, the two rows files,
# decode_bulk_report.py, torch_sdpa_decode.py and COMMIT; 115 s on an H100. The bulk path and
# ATTN_CUDA_DECODE_COPY exist at ad1700d only (removed after this run, slower: see
# docs/experiments.md), so it runs with release builds of that commit.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin rows=$here/decode-bulk-rows.txt iters=${ITERS:-50}
out=${OUT:-/tmp/out}; mkdir -p "$out"
peer=$here/torch_sdpa_decode.py; [[ -f $peer ]] || peer=bench/peers/torch_sdpa_decode.py
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
commit=$(cat "$here/COMMIT" 2>/dev/null)
bench() {  # bench <copy path> <file> [rows]
  ATTN_CUDA_DECODE_COPY=$1 timeout 40 "$bin/decode_bench" "${3:-$rows}" "$iters" | tee "$out/$2"
}
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
  echo "commit: $commit"
  echo "== attn verify --backend cuda --quick --family decode (default copy path)"
  timeout 40 "$bin/attn" verify --backend cuda --quick --family decode 2>&1 | tail -4
  echo "== the same, ATTN_CUDA_DECODE_COPY=cp.async"
  ATTN_CUDA_DECODE_COPY=cp.async timeout 30 "$bin/attn" verify --backend cuda --quick --family decode 2>&1 | tail -2
  echo "== round 1"
  bench bulk bulk-r1.jsonl
  bench cp.async cpasync-r1.jsonl
  timeout 50 python3 "$peer" "$rows" --iters "$iters" --backends cudnn | tee "$out/sdpa-r1.jsonl"
  echo "== round 2"
  bench cp.async cpasync-r2.jsonl
  bench bulk bulk-r2.jsonl
  timeout 50 python3 "$peer" "$rows" --iters "$iters" --backends cudnn | tee "$out/sdpa-r2.jsonl"
  echo "== ATTN_CUDA_DECODE_SPLITS=33"
  ATTN_CUDA_DECODE_SPLITS=33 bench bulk splits-bulk.jsonl "$here/decode-bulk-split-rows.txt"
  ATTN_CUDA_DECODE_SPLITS=33 bench cp.async splits-cpasync.jsonl "$here/decode-bulk-split-rows.txt"
  python3 "$here/decode_bulk_report.py" "$out" "$commit" > "$out/h100-decode-bulk.json"
  echo "== attn verify --backend cuda --resident --family decode"
  timeout 60 "$bin/attn" verify --backend cuda --resident --family decode 2>&1 | tail -5
  echo "== compute-sanitizer memcheck (bulk)"
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  ATTN_CUDA_DECODE_COPY=bulk timeout 30 "$san" --tool memcheck --error-exitcode 3 "$bin/attn" run --backend cuda -b 2 \
    --heads 8 --kv-heads 2 --seq-q 4 --seq-k 3001 -d 128 --lse --iters 1 --warmup 0 2>&1 \
    | grep -E "ERROR SUMMARY|kernel |split|copies|accuracy|error" | head -8
  echo "memcheck exit: ${PIPESTATUS[0]}"
  "$bin/attn" plan --backend cuda -b 8 --heads 32 --kv-heads 8 --seq-q 1 --seq-k 32768 --no-causal 2>&1 | head -24
} 2>&1 | tee "$out/summary.txt"
