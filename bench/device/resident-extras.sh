#!/usr/bin/env bash
# On the lent GPU machine: issue 33's index arrays as device memory in the device-resident calls.
# attn verify --resident on the families with index arrays (alibi, varlen, paged, kv-cache,
# decode), with the default family choice and with ATTN_CUDA_FAMILY=ampere; the GPU tests of
# crates/attn-cuda/tests/resident.rs (device arrays give the host-copy path's bits; corrupt
# arrays run); those two under compute-sanitizer memcheck (corrupt page numbers, decreasing
# offsets, huge key counts: no access outside the buffers); the candle op's CUDA tests.
# Expects in $dir (default .device-resident): attn, test-cuda-resident, test-candle-cuda
# (gzipped; the candle one optional) and COMMIT. Writes $OUT/summary.txt and $OUT/verify-*.json.
set -uo pipefail
dir=${1:-.device-resident}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
work=/tmp/resident-extras; mkdir -p $work
for f in "$dir"/*.gz; do gunzip -c "$f" > "$work/$(basename "${f%.gz}")"; chmod +x "$work/$(basename "${f%.gz}")"; done
families=(--family alibi --family varlen --family paged --family kv-cache --family decode)
verify() {  # $1: the family choice (default or ampere), $2: timeout
  echo "== attn verify --quick --backend cuda --resident ${families[*]} (family choice: $1)"
  if [[ $1 == ampere ]]; then export ATTN_CUDA_FAMILY=ampere; else unset ATTN_CUDA_FAMILY; fi
  timeout "$2" $work/attn verify --quick --backend cuda --resident "${families[@]}" --json > "$out/verify-$1.json" 2> "$out/verify-$1.err"
  echo "exit $?"
  unset ATTN_CUDA_FAMILY
  python3 - "$out/verify-$1.json" <<'PY'
import json, sys, collections
r = json.load(open(sys.argv[1]))
c = collections.Counter((x["backend"], x["outcome"]["status"]) for x in r["results"])
worst = collections.defaultdict(float)
for x in r["results"]:
    worst[x["backend"]] = max(worst[x["backend"]], x["worst_ratio"])
print("passed:", r["passed"], dict(sorted((f"{b} {s}", n) for (b, s), n in c.items())))
print("worst ratio per backend:", {b: round(w, 3) for b, w in worst.items()})
for x in r["results"]:
    if x["outcome"]["status"] != "pass":
        print("  ", x["backend"], x["case"], json.dumps(x["outcome"])[:240])
PY
}
{
  echo "commit $(cat "$dir/COMMIT")"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  start=$SECONDS
  verify default 30
  echo "== compute-sanitizer memcheck: device arrays, then corrupt ones"
  ATTN_REQUIRE_CUDA=on timeout 35 compute-sanitizer --tool memcheck --error-exitcode 9 $work/test-cuda-resident \
    --test-threads 1 --nocapture index_arrays corrupt_index > "$out/sanitizer.txt" 2>&1
  echo "sanitizer exit $?"
  grep -E "ERROR SUMMARY|test result|panicked|Invalid|without a fault|same bits" "$out/sanitizer.txt" | head -40
  if [[ -f $work/test-candle-cuda ]]; then
    echo "== attn-candle tests/cuda.rs"
    timeout 35 $work/test-candle-cuda --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|SKIPPED|max \|"
  fi
  verify ampere 25
  echo "== tests/resident.rs"
  ATTN_REQUIRE_CUDA=on timeout 25 $work/test-cuda-resident --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked"
  echo "total ${SECONDS}s (from $start)"
} 2>&1 | tee "$out/summary.txt"
