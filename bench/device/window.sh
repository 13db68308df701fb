#!/usr/bin/env bash
# On the lent H100, in one call: sliding windows and soft-capping on both CUDA families.
#   verify    attn verify --backend cuda (the full grid, window and softcap families included),
#             ATTN_CUDA_FAMILY=ampere and =hopper
#   sanitize  compute-sanitizer memcheck on one small window + soft-cap case per family
#   time      bf16 D=128, B=1, H=16: S=32768 causal against the causal window (4096, 0) (time
#             ratio against the ratio of visible (query, key) pairs), and soft-cap 30 against
#             none at S=4096 and 8192, with and without the causal mask; every configuration
#             once per round, ROUNDS rounds interleaved, each a CUDA-event median of ITERS runs
# Expects the release `attn` at $ATTN (default .device/bin/attn, from `cargo xtask bundle`).
# Writes $OUT/window.tgz (every log, the verify JSON) and $OUT/h100-window-softcap.json, the
# self-describing result that bench/results/ keeps (packed after each step, so that a step cut
# short keeps the ones before it). STEPS="sanitize verify time" (default all); TIME_BUDGET: seconds
# after which the timing step starts no new run (default: what is left of 540 s from the start).
set -uo pipefail
final=${OUT:-/tmp/out}; out=/tmp/window; mkdir -p "$out" "$final"
pack() { echo "step $1 done at ${SECONDS}s" >> "$out/steps.txt"; tar -czf "$final/window.tgz" -C /tmp window; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
attn=${ATTN:-.device/bin/attn}
steps=${STEPS:-sanitize verify time}
rounds=${ROUNDS:-2}
iters=${ITERS:-20}
has() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"

if has sanitize; then
  : > "$out/sanitizer.log"
  for fam in ampere hopper; do
    echo "== compute-sanitizer memcheck, $fam: Sq=300 Sk=500 Hq=4 Hkv=2 D=128, window (64,16), soft-cap 30"
    ATTN_CUDA_FAMILY=$fam timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $attn run --backend cuda \
      --dtype bf16 -d 128 --seq-q 300 --seq-k 500 --heads 4 --kv-heads 2 --window 64,16 --softcap 30 --lse \
      --iters 1 --warmup 0 --check-rows 300 > "$out/sanitizer-$fam.txt" 2>&1
    rc=$?
    echo "memcheck $fam: exit $rc, $(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$out/sanitizer-$fam.txt")" | tee -a "$out/sanitizer.log"
    grep -E '"kernel"|max_abs|rel_l2' "$out/sanitizer-$fam.txt" | head -4
  done
fi

pack sanitize

if has verify; then
  for fam in ampere hopper; do
    echo "== verify (cuda, $fam family)"
    ATTN_CUDA_FAMILY=$fam timeout 210 $attn verify --backend cuda --json > "$out/verify-$fam.json" 2> "$out/verify-$fam.log"
    echo "verify $fam exit $?"
    python3 - "$out/verify-$fam.json" <<'PY' || tail -5 "$out/verify-$fam.log"
import json, sys
r = json.load(open(sys.argv[1]))
print("verdict:", r.get("verdict"))
for c in r.get("results", []):
    o = c["outcome"]
    if c["family"] in ("window", "softcap") or o["status"] == "fail":
        print(f"  {o['status']:4s} {c['worst_ratio']:6.3f}  {c['case']}  {o.get('reason', '')[:120]}")
PY
  done
fi

pack verify

if has time; then
  echo "== timings (rounds $rounds, iters $iters)"
  ATTN="$attn" ROUNDS=$rounds ITERS=$iters OUTDIR="$out" BUDGET=${TIME_BUDGET:-$(( SECONDS < 480 ? 540 - SECONDS : 60 ))} FINAL="$final" COMMIT_FILE=${COMMIT_FILE:-.device/COMMIT} python3 - <<'PY'
import json, os, subprocess, sys, time
attn, rounds, iters, outdir = os.environ["ATTN"], int(os.environ["ROUNDS"]), int(os.environ["ITERS"]), os.environ["OUTDIR"]
base = ["--backend", "cuda", "--dtype", "bf16", "-d", "128", "--batch", "1", "--heads", "16",
        "--iters", str(iters), "--warmup", "5", "--check-rows", "0", "--json"]
configs = []  # (family, name, seq, flags)
for fam in ["ampere", "hopper"]:
    configs.append((fam, "causal", 32768, []))
    configs.append((fam, "window4096", 32768, ["--window", "4096,0"]))
    for s in [4096, 8192]:
        for causal in [False, True]:
            mask = [] if causal else ["--no-causal"]
            tag = "causal" if causal else "none"
            configs.append((fam, f"{tag}", s, mask))
            configs.append((fam, f"{tag}-softcap30", s, mask + ["--softcap", "30"]))
times = {}
kernels = {}
started, budget = time.time(), float(os.environ["BUDGET"])
for r in range(rounds):
    for fam, name, s, flags in configs:
        if time.time() - started > budget:
            print("time budget spent: no more runs", flush=True)
            break
        cmd = [attn, "run", "--seq", str(s)] + base + flags
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "ATTN_CUDA_FAMILY": fam}, timeout=120)
        key = f"{fam}/s{s}/{name}"
        if p.returncode != 0:
            print(key, "FAILED", p.stderr[-400:], flush=True)
            continue
        j = json.loads(p.stdout)
        times.setdefault(key, []).append(j["timing"]["median_s"])
        kernels[key] = j["plan"]["kernel"]
        print(f"round {r} {key:32s} {j['timing']['median_s']*1e3:9.3f} ms  {j['plan']['kernel']}", flush=True)

def pairs(s, left=None):
    # Visible (query, key) pairs of a causal mask with `left` keys back (None: unbounded), seq_q = seq_k = s.
    if left is None:
        return s * (s + 1) // 2
    w = left + 1
    return w * s - w * (w - 1) // 2

flops_per_pair = 4 * 16 * 128
result = {"window": {}, "softcap": {}}
for fam in ["ampere", "hopper"]:
    c, w = times.get(f"{fam}/s32768/causal"), times.get(f"{fam}/s32768/window4096")
    if c and w:
        tc, tw = min(c), min(w)
        visible = pairs(32768, 4096) / pairs(32768)
        result["window"][fam] = {
            "causal_s": c, "window_s": w, "kernel_causal": kernels[f"{fam}/s32768/causal"],
            "kernel_window": kernels[f"{fam}/s32768/window4096"],
            "time_ratio": tw / tc, "visible_pair_ratio": visible, "time_over_proportional": (tw / tc) / visible,
            "tflops_causal": flops_per_pair * pairs(32768) / tc / 1e12,
            "tflops_window": flops_per_pair * pairs(32768, 4096) / tw / 1e12,
        }
    for s in [4096, 8192]:
        for tag in ["none", "causal"]:
            a, b = times.get(f"{fam}/s{s}/{tag}"), times.get(f"{fam}/s{s}/{tag}-softcap30")
            if a and b:
                result["softcap"][f"{fam}/s{s}/{tag}"] = {
                    "plain_s": a, "softcap_s": b, "kernel_softcap": kernels[f"{fam}/s{s}/{tag}-softcap30"],
                    "slowdown": min(b) / min(a) - 1.0}
meta = {
    "what": "sliding window and soft-cap on the CUDA backend's two families: time of the causal window (4096, 0) "
            "against causal at S=32768 next to the ratio of visible (query, key) pairs, and soft-cap 30 against none",
    "shape": "bf16, B=1, Hq=Hkv=16, D=128, seq_q = seq_k",
    "timing": f"attn run --json: CUDA-event median of {iters} launches after 5 warm-up ones, per process; "
              f"{rounds} rounds of every configuration interleaved; ratios from the best round of each",
    "device": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
    "commit": open(os.environ["COMMIT_FILE"]).read().strip() if os.path.exists(os.environ["COMMIT_FILE"]) else "unknown",
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "command": "bash bench/device/window.sh (ATTN=<release attn>, STEPS=\"verify sanitize time\")",
}
# The verify and memcheck steps of the same call, where they ran.
verify = {}
for fam in ["ampere", "hopper"]:
    path = os.path.join(outdir, f"verify-{fam}.json")
    if os.path.exists(path):
        v = json.load(open(path))
        cases = [c for c in v["results"] if c["family"] in ("window", "softcap") and c["outcome"]["status"] != "skip"]
        verify[fam] = {"verdict": v["verdict"], "window_softcap_cases": len(cases),
                       "worst_ratio_window_softcap": max((c["worst_ratio"] for c in cases), default=None)}
result["verify"] = verify
for name, key in [("sanitizer.log", "sanitizer"), ("steps.txt", "device_steps_s")]:
    path = os.path.join(outdir, name)
    result[key] = open(path).read().strip().splitlines() if os.path.exists(path) else []
json.dump({**meta, **result}, open(os.path.join(outdir, "h100-window-softcap.json"), "w"), indent=1)
json.dump({**meta, **result}, open(os.path.join(os.environ["FINAL"], "h100-window-softcap.json"), "w"), indent=1)
print(json.dumps(result, indent=1))
PY
fi
pack time
