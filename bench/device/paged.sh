#!/usr/bin/env bash
# On the lent GPU machine: the decode family on paged KV caches, per-sequence key counts,
# soft-caps and ALiBi (issue 33). (a) `attn verify --backend cuda` on the paged, kv-cache,
# alibi and softcap families of the full grid (the decode-shaped rows run on the decode
# family; prefill-shaped ones are refused by the prefill families and reported so), and
# compute-sanitizer memcheck on the quick grid's paged and kv-cache rows (pages of 16 and 64
# keys, sequences of 1 to 130 keys); (b) timings: paged vs dense decode
# (crates/attn-cuda/examples/paged_bench.rs on bench/device/paged-rows.txt, two rounds) and
# PyTorch SDPA cuDNN on the dense equivalent (bench/device/paged-sdpa-rows.txt) between them;
# bench/device/paged_report.py writes $OUT/h100-decode-paged.json.
# Usage: on the GPU machine, from a folder holding bin/ (attn, paged_bench), this script, the
# two rows files, paged_report.py, torch_sdpa_decode.py and COMMIT: `bash paged.sh [verify,bench]`.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$here/bin
peer=$here/torch_sdpa_decode.py; [[ -f $peer ]] || peer=bench/peers/torch_sdpa_decode.py
parts=${1:-verify,bench}
iters=${ITERS:-30}
families=(--family paged --family kv-cache --family alibi --family softcap)
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
  echo "commit: $(cat "$here/COMMIT" 2>/dev/null)"
  if [[ $parts == *verify* ]]; then
    echo "== attn verify --backend cuda ${families[*]}"
    # 27 cases; on the H100 machine 23 of them took 195 s (the f64 reference at 32k keys): give
    # this step 300 s, or run it alone (`bash paged.sh verify`).
    timeout 300 "$bin/attn" verify --backend cuda "${families[@]}" 2>&1 | tail -45
    echo "== compute-sanitizer memcheck: attn verify --quick --backend cuda --family paged --family kv-cache"
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 90 "$san" --tool memcheck --error-exitcode 3 "$bin/attn" verify --quick --backend cuda \
      --family paged --family kv-cache 2>&1 | grep -vE "^\s*$" | tail -14
    echo "memcheck exit: ${PIPESTATUS[0]}"
  fi
  if [[ $parts == *bench* ]]; then
    echo "== round 1: attn"
    timeout 100 "$bin/paged_bench" "$here/paged-rows.txt" "$iters" | tee "$out/attn-r1.jsonl"
    echo "== sdpa"
    timeout 60 python3 "$peer" "$here/paged-sdpa-rows.txt" --iters "$iters" --backends cudnn --roofline-gib 1 \
      | tee "$out/sdpa.jsonl"
    echo "== round 2: attn (rows in reverse order)"
    grep -v '^#' "$here/paged-rows.txt" | tac > "$out/rows-reversed.txt"
    timeout 100 "$bin/paged_bench" "$out/rows-reversed.txt" "$iters" | tee "$out/attn-r2.jsonl"
    python3 "$here/paged_report.py" "$out" "$(cat "$here/COMMIT" 2>/dev/null)" "bash bench/device/paged.sh bench" \
      > "$out/h100-decode-paged.json" \
      && python3 -c "import json,sys; [print(r['text']) for r in json.load(open(sys.argv[1]))['rows']]" "$out/h100-decode-paged.json"
  fi
} 2>&1 | tee "$out/summary.txt"
