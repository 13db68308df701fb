#!/usr/bin/env bash
# On the lent GPU machine: the decode family (issue 33). (a) `attn verify --backend cuda
# --resident --family decode` (the decode rows of the full grid on the host-copy and
# device-resident paths), the quick decode rows again with the split count forced to 3, the
# resident test binary, and compute-sanitizer memcheck on one small decode run (several splits,
# causal, 4 queries); (b) decode timings: attn (crates/attn-cuda/examples/decode_bench.rs) and
# PyTorch SDPA cuDNN / flash (bench/peers/torch_sdpa_decode.py) on bench/device/decode-rows.txt,
# in two alternating rounds, with the read-bandwidth roofline (torch.sum, copy) in each; then
# bench/device/decode_report.py writes $OUT/h100-decode.json.
# Usage: `cargo xtask bundle` here, then on the GPU machine (carry .device) `bash
# bench/device/decode.sh [verify,bench]`. It also runs from a folder that holds bin/ (attn,
# decode_bench, test-cuda-resident), this script, decode-rows.txt, decode_report.py,
# torch_sdpa_decode.py and COMMIT (how it was run before the branch reached main).
# ROWS: another rows file (e.g. bench/device/decode-pad-rows.txt); NAME: the JSON's name
# (default h100-decode); BEFORE=1: also one run of decode_bench with the decode family off
# (ATTN_CUDA_DECODE=off: the prefill families), into $OUT/before.jsonl.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$here/bin; [[ -d $bin ]] || bin=.device/bin
peer=$here/torch_sdpa_decode.py; [[ -f $peer ]] || peer=bench/peers/torch_sdpa_decode.py
commit_file=$here/COMMIT; [[ -f $commit_file ]] || commit_file=.device/COMMIT
parts=${1:-verify,bench}
rows=${ROWS:-$here/decode-rows.txt}
name=${NAME:-h100-decode}
iters=${ITERS:-50}
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
  echo "commit: $(cat "$commit_file" 2>/dev/null)"
  if [[ $parts == *verify* ]]; then
    echo "== attn verify --backend cuda --resident --family decode"
    timeout 240 "$bin/attn" verify --backend cuda --resident --family decode 2>&1 | tail -6
    echo "== the same, quick grid, ATTN_CUDA_DECODE_SPLITS=3"
    ATTN_CUDA_DECODE_SPLITS=3 timeout 60 "$bin/attn" verify --backend cuda --quick --family decode 2>&1 | tail -4
    echo "== test-cuda-resident"
    ATTN_REQUIRE_CUDA=on timeout 120 "$bin/test-cuda-resident" --test-threads 1 2>&1 | grep -E "^test |test result|panicked|differs" | tail -12
    echo "== compute-sanitizer memcheck"
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 120 "$san" --tool memcheck --error-exitcode 3 "$bin/attn" run --backend cuda -b 2 --heads 8 --kv-heads 2 \
      --seq-q 4 --seq-k 3001 -d 128 --lse --iters 1 --warmup 0 2>&1 | grep -E "ERROR SUMMARY|kernel |split|accuracy|error" | head -8
    echo "memcheck exit: ${PIPESTATUS[0]}"
    "$bin/attn" plan --backend cuda -b 1 --heads 32 --kv-heads 8 --seq-q 1 --seq-k 32768 --no-causal 2>&1 | head -30
  fi
  if [[ $parts == *bench* ]]; then
    for round in 1 2; do
      echo "== round $round: attn"
      timeout 150 "$bin/decode_bench" "$rows" "$iters" | tee "$out/attn-r$round.jsonl"
      echo "== round $round: sdpa"
      timeout 150 python3 "$peer" "$rows" --iters "$iters" | tee "$out/sdpa-r$round.jsonl"
    done
    if [[ ${BEFORE:-0} == 1 ]]; then
      echo "== attn with the decode family off (ATTN_CUDA_DECODE=off)"
      ATTN_CUDA_DECODE=off timeout 150 "$bin/decode_bench" "$rows" "$iters" | tee "$out/before.jsonl"
    fi
    python3 "$here/decode_report.py" "$out" "$(cat "$commit_file" 2>/dev/null)" "ROWS=${ROWS:-} bash bench/device/decode.sh bench" \
      > "$out/$name.json" && python3 -c "import json,sys; [print(r['text']) for r in json.load(open(sys.argv[1]))['rows']]" "$out/$name.json"
  fi
} 2>&1 | tee "$out/summary.txt"
