#!/usr/bin/env bash
# On the lent GPU machine, in one call: this bundle checked on every shipped kernel path, then
# timed against another build on the same shapes in interleaved rounds. The proof a refactor
# owes: the kernels compute the same thing, and no row got slower than the run-to-run spread.
# Steps (STEPS, default "verify sanitize time"):
#   verify    attn verify with NaN-poisoned outputs against f64: cuda's Hopper family on the
#             full grid (one CTA per SM, then 3 CTAs, each computing many tiles and split runs),
#             and on the quick grid with each choice a knob can flip (Q slots, block order,
#             split tail); the Ampere/Ada family at every tile rank (full grid at rank 0); wgpu
#             on the full grid and on the quick grid without subgroups and with f16 on the FMA
#             kernel
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck on a small problem of each
#             family, head dim and mask
#   time      ROUNDS (default 2; about 200 s a round on the H100) rounds of `attn bench`, the two builds in turn (BASE first in
#             odd rounds, this one first in even ones): Hopper bf16 D=64/128/256, Ampere/Ada
#             bf16 D=64/128 and wgpu f32 D=64/128, both masks; summary.txt gives each row's
#             per-round TFLOP/s of both builds, the ratio of their means and each build's
#             spread (max/min over the rounds)
# BASE: the other build's attn (default .device/old/attn, e.g. `cargo xtask bundle` at the older
# commit, copied there with its COMMIT). Wgpu needs `cargo xtask vulkan-loader`'s .gl/.
# Carry .device and .gl; timeout_s=600 per call: verify and sanitize took 258 s, two rounds of
# time about 400 s, so STEPS="verify sanitize" and STEPS=time are two calls.
# Writes $OUT/ab.tgz (everything, repacked after each step) and $OUT/summary.txt.
set -uo pipefail
final=${OUT:-/tmp/out}; work=$(mktemp -d); out=$work/ab; mkdir -p "$out"
pack() { echo "step $1 done at ${SECONDS}s" >> "$out/steps.txt"; tar -czf "$final/ab.tgz" -C "$work" ab; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
source bench/device/vulkan-env.sh
new=.device/bin/attn
base=${BASE:-.device/old/attn}
steps=${STEPS:-verify sanitize time}
has() { [[ " $steps " == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; echo "new $(cat .device/COMMIT)";
  echo "base $(cat "$(dirname "$base")/COMMIT" 2>/dev/null)"; $new backends; } 2>&1 | tee "$out/gpu.txt"

# verify label env-settings... -- attn-verify-arguments...
verify() {
  local label=$1; shift; local settings=()
  while [[ $1 != -- ]]; do settings+=("$1"); shift; done; shift
  env "${settings[@]}" timeout 200 $new verify --json "$@" > "$out/verify-$label.json" 2> "$out/verify-$label.log"
  local rc=$?
  echo "verify $label: exit $rc, $(python3 -c "import json; print(json.load(open('$out/verify-$label.json'))['verdict'])" 2>/dev/null \
    || tail -2 "$out/verify-$label.log")"
}
if has verify; then
  verify hopper -- --backend cuda
  verify hopper-3ctas ATTN_CUDA_SM90_GRID=3 -- --backend cuda
  for knob in ATTN_CUDA_SM90_QSLOTS=1 ATTN_CUDA_SM90_QSLOTS=2 ATTN_CUDA_SM90_BLOCKS=top ATTN_CUDA_SM90_SPLIT=off; do
    label=${knob#ATTN_CUDA_SM90_}; verify "hopper-${label/=/-}" $knob ATTN_CUDA_SM90_GRID=7 -- --backend cuda --quick
  done
  verify ampere-r0 ATTN_CUDA_FAMILY=ampere ATTN_CUDA_RANK=0 -- --backend cuda
  for rank in 1 2 3 4; do
    verify ampere-r$rank ATTN_CUDA_FAMILY=ampere ATTN_CUDA_RANK=$rank -- --backend cuda --quick
  done
  verify wgpu -- --backend wgpu
  verify wgpu-nosubgroups ATTN_WGPU_SUBGROUPS=off -- --backend wgpu --quick
  verify wgpu-f16-fma ATTN_WGPU_COOP=off -- --backend wgpu --quick
  pack verify
fi

if has sanitize; then
  : > "$out/sanitizer.txt"
  for family in hopper ampere; do for d in 64 128 256; do for c in "" --no-causal; do for tool in memcheck racecheck synccheck; do
    r=$(ATTN_CUDA_FAMILY=$family timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $new run --backend cuda \
        --dtype bf16 -d $d --seq 300 --heads 2 --batch 1 $c --iters 1 --warmup 0 --check-rows 4 --json 2>&1 | tail -2 | tr '\n' ' ')
    echo "$family d=$d ${c:-causal} $tool exit ${PIPESTATUS[0]}: $r" >> "$out/sanitizer.txt"
  done; done; done; done
  echo "sanitizer: $(grep -c 'exit 0:' "$out/sanitizer.txt") of $(wc -l < "$out/sanitizer.txt") runs exit 0"
  grep -v 'exit 0:' "$out/sanitizer.txt" | head -5
  pack sanitize
fi

# time label binary env-settings... -- attn-bench-arguments...
time_one() {
  local label=$1 bin=$2; shift 2; local settings=()
  while [[ $1 != -- ]]; do settings+=("$1"); shift; done; shift
  env "${settings[@]}" timeout 200 $bin bench --warmup 5 --iters 30 --check-rows 8 --tokens 16384 --model-dim 2048 "$@" \
    > "$out/time-$label.jsonl" 2> "$out/time-$label.log" || echo "time $label: exit $? $(tail -1 "$out/time-$label.log")"
}
if has time; then
  for round in $(seq 1 "${ROUNDS:-2}"); do
    order="base new"; ((round % 2 == 0)) && order="new base"
    for build in $order; do
      bin=$new; [[ $build == base ]] && bin=$base
      time_one "hopper-$build-r$round" $bin ATTN_CUDA_FAMILY=hopper -- --backend cuda --dtypes bf16 --dims 64,128,256 \
        --seqs 512,1024,2048,4096,8192,16384 --masks none,causal
      time_one "ampere-$build-r$round" $bin ATTN_CUDA_FAMILY=ampere -- --backend cuda --dtypes bf16 --dims 64,128 \
        --seqs 1024,4096,16384 --masks none,causal
      time_one "wgpu-$build-r$round" $bin -- --backend wgpu --dtypes f32 --dims 64,128 --seqs 2048,4096 \
        --masks none,causal --min-warmup-ms 500
    done
    pack "time-r$round"
  done
  python3 - "$out" <<'PY' | tee "$final/summary.txt" "$out/summary.txt"
import glob, json, re, statistics, sys
out = sys.argv[1]
rows = {}
for p in sorted(glob.glob(f"{out}/time-*.jsonl")):
    family, build, rnd = re.match(r".*/time-(\w+)-(base|new)-r(\d+)\.jsonl", p).groups()
    for line in open(p):
        r = json.loads(line)
        if "gflops" not in r:
            continue
        key = (family, r.get("dtype"), r["head_dim"], r["seq"], "causal" if r["causal"] else "none")
        rows.setdefault(key, {}).setdefault(build, {})[int(rnd)] = r["gflops"] / 1e3
        err = r.get("rel_l2")
        if err is not None:
            rows[key].setdefault("err_" + build, []).append(err)
print("family dtype D S mask | base TFLOP/s per round | new TFLOP/s per round | new/base (means) | spread base, new (max/min) | worst rel L2 base, new")
ratios = []
for k in sorted(rows):
    b, n = rows[k].get("base", {}), rows[k].get("new", {})
    if not b or not n:
        print(*k, "| missing:", "base" if not b else "new"); continue
    mb, mn = statistics.mean(b.values()), statistics.mean(n.values())
    ratios.append(mn / mb)
    sp = lambda xs: max(xs) / min(xs)
    fmt = lambda d: " / ".join(f"{d[i]:.1f}" for i in sorted(d))
    e = lambda s: f"{max(rows[k].get('err_' + s, [float('nan')])):.1e}"
    print(*k, f"| {fmt(b)} | {fmt(n)} | {mn / mb:.3f} | {sp(list(b.values())):.3f}, {sp(list(n.values())):.3f} | {e('base')}, {e('new')}")
if ratios:
    print(f"rows {len(ratios)}; new/base: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")
PY
  pack time
fi
