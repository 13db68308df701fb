#!/usr/bin/env bash
# On the lent H100: the decode family of this build checked, then timed against another build's
# (BASE_BENCH, e.g. the decode_bench of the commit before a kernel change) on every row of
# decode-rows.txt, with PyTorch SDPA cuDNN and the read roofline in each round.
# Steps (STEPS, default "verify time"):
#   verify  attn verify --backend cuda --resident --family decode (full grid, host-copy and
#           device-resident paths), the quick decode, paged and kv-cache grids with the split
#           count forced to 3, the resident and append test binaries, compute-sanitizer memcheck
#           on a causal 4-query decode in 5 splits and on the quick paged grid
#   time    ROUNDS (default 3) rounds: this build's decode_bench, the base's (order swapped in
#           even rounds), then SDPA cuDNN; CUDA-event medians of 50 calls each behind an untimed
#           twin. decode_ab_report.py prints per row both builds' medians, their ratio and
#           cuDNN's, and writes $OUT/decode-ab.json.
# Expects bin/ next to this script holding attn, decode_bench, test-cuda-resident and
# test-cuda-append, BASE_BENCH (default bin/decode_bench.base), COMMIT and BASE_COMMIT files.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$here/bin
base=${BASE_BENCH:-$bin/decode_bench.base}
peer=$here/torch_sdpa_decode.py; [[ -f $peer ]] || peer=bench/peers/torch_sdpa_decode.py
rows=$here/decode-rows.txt
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
steps=${STEPS:-verify time}
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
  echo "commit: $(cat "$here/COMMIT" 2>/dev/null), base: $(cat "$here/BASE_COMMIT" 2>/dev/null)"
  if [[ $steps == *verify* ]]; then
    echo "== attn verify --backend cuda --resident --family decode"
    timeout 240 "$bin/attn" verify --backend cuda --resident --family decode 2>&1 | tail -3
    echo "== ATTN_CUDA_DECODE_SPLITS=3: quick decode, paged, kv-cache"
    ATTN_CUDA_DECODE_SPLITS=3 timeout 90 "$bin/attn" verify --backend cuda --quick --family decode --family paged \
      --family kv-cache 2>&1 | tail -2
    echo "== test-cuda-resident, test-cuda-append"
    for t in resident append; do
      ATTN_REQUIRE_CUDA=on timeout 120 "$bin/test-cuda-$t" --test-threads 1 2>&1 | grep -E "test result|panicked" -A2
    done
    echo "== memcheck: 4 causal queries, 3001 keys, 5 splits"
    ATTN_CUDA_DECODE_SPLITS=5 timeout 120 "$san" --tool memcheck --error-exitcode 3 "$bin/attn" run --backend cuda -b 2 \
      --heads 8 --kv-heads 2 --seq-q 4 --seq-k 3001 -d 128 --lse --iters 1 --warmup 0 2>&1 |
      grep -E "ERROR SUMMARY|split|accuracy" | head -4
    echo "== memcheck: quick paged and kv-cache grid"
    timeout 120 "$san" --tool memcheck --error-exitcode 3 "$bin/attn" verify --quick --backend cuda --family paged \
      --family kv-cache 2>&1 | grep -E "ERROR SUMMARY|verdict" | head -3
  fi
  if [[ $steps == *time* ]]; then
    for round in $(seq 1 "${ROUNDS:-3}"); do
      order=(new base); (( round % 2 == 0 )) && order=(base new)
      for who in "${order[@]}"; do
        b=$bin/decode_bench; [[ $who == base ]] && b=$base
        timeout 120 "$b" "$rows" 50 2>/dev/null | sed "s/^{/{\"build\":\"$who\",\"round\":$round,/" >> "$out/ab.jsonl"
      done
      timeout 120 python3 "$peer" "$rows" --iters 50 --backends cudnn --roofline-gib 4 > "$out/sdpa-r$round.jsonl"
    done
    python3 "$here/decode_ab_report.py" "$out" "$(cat "$here/COMMIT" 2>/dev/null)" "$(cat "$here/BASE_COMMIT" 2>/dev/null)"
  fi
} 2>&1 | tee "$out/summary.txt"
