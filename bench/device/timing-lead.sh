#!/usr/bin/env bash
# On the lent GPU machine: what runs ahead of a timed call changes what CUDA events measure,
# ours and PyTorch SDPA's (`Lead` in crates/attn-cuda/src/runtime.rs; ATTN_CUDA_TIMING_LEAD,
# torch_sdpa_gpu.py --lead): nothing (`idle`, the rule before this script's commit), the same
# call untimed (`repeat`, the rule since), or a one-thread wait (`hold:200`). The Hopper
# kernel one sequence length at a time (D=128 without a mask, LEAD_SEQS) under each
# of LEADS, in ROUNDS interleaved rounds, each segment stamped so that clocks.csv (SM clock and
# power every 100 ms) gives its clock; then ours and the peers (cuDNN, FlashAttention-2) on bf16
# D=64/128, S=512..16384, both masks, under each of GRID_LEADS.
# Expects `cargo xtask bundle` output in .device/ (carry it). Writes $OUT/timing-lead.tgz.
set -uo pipefail
final=${OUT:-/tmp/out}; out=$final/timing-lead; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper
attn=.device/bin/attn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
cat .device/COMMIT >> "$out/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,nounits -lms 100 \
  > "$out/clocks.csv" 2>&1 &
smi=$!
stamp() { echo "$(date -u +%FT%T.%3N) $*" >> "$out/segments.txt"; }
bench() {  # label, lead, then attn bench arguments
  local label=$1 lead=$2; shift 2
  stamp "start $label"
  ATTN_CUDA_TIMING_LEAD=$lead timeout 200 $attn bench --backend cuda --warmup 5 --iters 30 --check-rows 8 "$@" \
    2> "$out/attn-$label.log" > "$out/attn-$label.jsonl"
  stamp "end $label"
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for seq in ${LEAD_SEQS:-2048 4096 8192 16384}; do
    for lead in ${LEADS:-idle repeat hold:200}; do
      bench "d128-s$seq-none-${lead/:/}-r$round" $lead --dtypes bf16 --dims 128 --seqs $seq --masks none \
        --tokens 16384 --model-dim 2048
    done
  done
done
GRID=(--dtypes bf16 --dims 64,128 --seqs 512,1024,2048,4096,8192,16384 --masks none,causal --tokens 16384 --model-dim 2048)
for lead in ${GRID_LEADS:-idle repeat}; do
  bench "grid-${lead/:/}" $lead "${GRID[@]}"
  stamp "start sdpa-${lead/:/}"
  timeout 200 python3 bench/peers/torch_sdpa_gpu.py --backends cudnn,flash --lead $lead "${GRID[@]}" \
    > "$out/sdpa-${lead/:/}.jsonl" 2> "$out/sdpa-${lead/:/}.log"
  stamp "end sdpa-${lead/:/}"
done
kill $smi
python3 - "$out" "${GRID_LEADS:-idle repeat}" <<'PY' | tee "$out/summary.txt"
import datetime as dt, json, sys
out = sys.argv[1]
def when(s):
    return dt.datetime.fromisoformat(s.replace("/", "-").strip())
clocks = []
for line in open(f"{out}/clocks.csv"):
    parts = [p.strip() for p in line.split(",")]
    try:
        clocks.append((when(parts[0]), float(parts[1]), float(parts[2])))
    except (ValueError, IndexError):
        pass
segs, starts = {}, {}
for line in open(f"{out}/segments.txt"):
    t, kind, label = line.split()
    if kind == "start":
        starts[label] = dt.datetime.fromisoformat(t.rstrip("Z"))
    else:
        segs[label] = (starts[label], dt.datetime.fromisoformat(t.rstrip("Z")))
def median(xs):
    xs = sorted(xs); return xs[len(xs) // 2] if xs else float("nan")
print("segment | TFLOP/s | median SM MHz | median W")
for label, (a, b) in segs.items():
    inside = [c for c in clocks if a <= c[0] <= b and c[1] > 0]
    try:
        rows = [json.loads(l) for l in open(f"{out}/attn-{label}.jsonl")]
        tf = " ".join(f"{r['gflops'] / 1e3:.1f}" for r in rows if "gflops" in r)
    except FileNotFoundError:
        tf = "-"
    print(f"{label} | {tf} | {median([c[1] for c in inside]):.0f} | {median([c[2] for c in inside]):.0f}")
def rows(path):
    got = {}
    for l in open(path):
        r = json.loads(l)
        if "gflops" in r:
            got[(r.get("impl", "attn"), r["head_dim"], r["seq"], r["causal"])] = r["gflops"] / 1e3
    return got
leads = sys.argv[2].split()
print("\nimpl D S causal | " + " | ".join(leads) + " | ratios to the first")
for side in ["attn-grid", "sdpa"]:
    try:
        got = [rows(f"{out}/{side}-{lead.replace(':', '')}.jsonl") for lead in leads]
    except FileNotFoundError:
        continue
    for k in sorted(got[0]):
        if all(k in g for g in got):
            tf = " | ".join(f"{g[k]:.1f}" for g in got)
            ratios = " ".join(f"{g[k] / got[0][k]:.3f}" for g in got[1:])
            print(f"{k[0]} {k[1]} {k[2]} {k[3]} | {tf} | {ratios}")
PY
tar -czf "$final/timing-lead.tgz" -C "$final" timing-lead
