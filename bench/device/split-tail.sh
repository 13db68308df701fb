#!/usr/bin/env bash
# On the lent GPU machine: the Hopper split tail's merge in unit order (this bundle) against the
# build before it (BASE, default .device/old/attn). The resident tests (threads x streams at once
# equal to serial calls, three times), attn verify on the full grid (one CTA per SM, then 3 CTAs:
# many split runs per tile) and through the device API, then ROUNDS (default 3) alternating
# rounds of attn bench on the rows with a split tail (Hopper, bf16, no mask, D=64/128/256,
# S=512..16384). Writes $OUT/summary.txt and the rows as $OUT/time-*.jsonl.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
new=.device/bin/attn; base=${BASE:-.device/old/attn}
{
  echo "new $(cat .device/COMMIT), base $(cat "$(dirname "$base")/COMMIT")"
  for i in 1 2 3; do
    ATTN_REQUIRE_CUDA=on timeout 120 .device/bin/test-cuda-resident --test-threads 1 threads_and 2>&1 | grep "test result"
  done
  echo "== verify"
  timeout 200 $new verify --backend cuda --resident 2>&1 | tail -1
  ATTN_CUDA_SM90_GRID=3 timeout 200 $new verify --backend cuda 2>&1 | tail -1
  for round in $(seq 1 "${ROUNDS:-3}"); do
    order="base new"; ((round % 2 == 0)) && order="new base"
    for build in $order; do
      bin=$new; [[ $build == base ]] && bin=$base
      timeout 150 $bin bench --backend cuda --dtypes bf16 --dims 64,128,256 --seqs 512,1024,2048,4096,8192,16384 \
        --masks none --tokens 16384 --model-dim 2048 --warmup 5 --iters 30 --check-rows 8 > "$out/time-$build-r$round.jsonl" 2>/dev/null
    done
  done
  python3 - "$out" <<'PY'
import glob, json, re, statistics, sys
rows = {}
for p in sorted(glob.glob(sys.argv[1] + "/time-*.jsonl")):
    build, rnd = re.match(r".*/time-(base|new)-r(\d+)\.jsonl", p).groups()
    for line in open(p):
        r = json.loads(line)
        if "gflops" in r:
            rows.setdefault((r["head_dim"], r["seq"]), {}).setdefault(build, []).append(r["gflops"] / 1e3)
print("D S | base TFLOP/s per round | new | new/base (means)")
ratios = []
for k in sorted(rows):
    b, n = rows[k].get("base", []), rows[k].get("new", [])
    if b and n:
        ratios.append(statistics.mean(n) / statistics.mean(b))
        print(*k, "|", " / ".join(f"{x:.1f}" for x in b), "|", " / ".join(f"{x:.1f}" for x in n), f"| {ratios[-1]:.3f}")
print(f"new/base: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")
PY
} 2>&1 | tee "$out/summary.txt"
