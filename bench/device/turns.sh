#!/usr/bin/env bash
# On the lent GPU machine: what the ping-pong turns cost or gain in the persistent form
# (ATTN_CUDA_SM90_TURNS=off compiles it without them: the consumer warpgroups issue their
# products whenever they are ready). Quick-grid verify without the turns, then both ways in
# ROUNDS interleaved rounds on bf16 D=64 (S=2048, 4096, both masks) and D=128 (S=2048, 4096,
# no mask). Expects `cargo xtask bundle` output in .device/ (carry it). Writes $OUT/turns.tgz.
set -uo pipefail
final=${OUT:-/tmp/out}; out=$final/turns; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper
attn=.device/bin/attn
cat .device/COMMIT > "$out/gpu.txt"; nvidia-smi --query-gpu=name,driver_version --format=csv >> "$out/gpu.txt"
ATTN_CUDA_SM90_TURNS=off timeout 120 $attn verify --backend cuda --json --quick > "$out/verify-noturns.json" 2> "$out/verify-noturns.log"
echo "verify without turns (quick): exit $? $(python3 -c "import json; print(json.load(open('$out/verify-noturns.json'))['verdict'])" 2>/dev/null)"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for turns in on off; do
    for shape in "64 2048,4096 none,causal" "128 2048,4096 none"; do
      read -r d seqs masks <<< "$shape"
      ATTN_CUDA_SM90_TURNS=$turns timeout 100 $attn bench --backend cuda --warmup 5 --iters 30 --check-rows 8 \
        --dtypes bf16 --dims $d --seqs $seqs --masks $masks --tokens 16384 --model-dim 2048 \
        > "$out/attn-d$d-turns-$turns-r$round.jsonl" 2> "$out/attn-d$d-turns-$turns-r$round.log"
    done
  done
done
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import glob, json, re, sys
out = sys.argv[1]
got = {}
for p in sorted(glob.glob(f"{out}/attn-*.jsonl")):
    turns = re.search(r"turns-(on|off)", p).group(1)
    for l in open(p):
        r = json.loads(l)
        if "gflops" in r:
            key = (r["head_dim"], r["seq"], "causal" if r["causal"] else "none")
            got.setdefault(key, {}).setdefault(turns, []).append(r["gflops"] / 1e3)
print("D S mask | turns on | turns off | off / on (means)")
for k in sorted(got):
    on, off = got[k].get("on", []), got[k].get("off", [])
    ratio = (sum(off) / len(off)) / (sum(on) / len(on)) if on and off else float("nan")
    print(f"{k[0]} {k[1]} {k[2]} | {' / '.join(f'{x:.1f}' for x in on)} | {' / '.join(f'{x:.1f}' for x in off)} | {ratio:.3f}")
PY
tar -czf "$final/turns.tgz" -C "$final" turns
