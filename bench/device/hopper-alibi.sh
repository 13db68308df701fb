#!/usr/bin/env bash
# On the lent H100, in one call: ALiBi in the Hopper family and the soft-cap's cost there.
#   sanitize  compute-sanitizer memcheck on one small ALiBi + causal + soft-cap case (Hopper)
#   verify    attn verify --backend cuda: the alibi and window families of the full grid, and the
#             quick grid (default family choice)
#   plan      attn plan for ALiBi problems: which family and kernel
#   time      bf16, D=64 and 128, S=4096 and 16384 (batch·S = 16384 tokens, heads = 2048 / D),
#             causal and not: plain, ALiBi, soft-cap 30, both (`attn bench`, this build), and
#             soft-cap 30 and ALiBi with the build before ($BASE, for the before/after); then
#             bf16 D=128 B=1 H=16 S=32768 causal against the window (4096, 0) (`attn run`, both
#             builds' windows); every configuration once per round, ROUNDS rounds interleaved
# Expects the release `attn` of this commit at $ATTN and the one to compare with at $BASE
# (default .device-hopper/attn and .device-hopper/attn-base) and the commits in $ATTN.commit and
# $BASE.commit. Writes $OUT/hopper-alibi.tgz (every log) and $OUT/h100-hopper-alibi-softcap.json,
# the self-describing result that bench/results/ keeps (rewritten after each timing run, so that a
# call cut short keeps what ran). Each step has its own timeout; BUDGET (seconds from the start,
# default 320) stops the timing rounds.
set -uo pipefail
final=${OUT:-/tmp/out}; out=/tmp/hopper-alibi; mkdir -p "$out" "$final"
pack() { echo "step $1 done at ${SECONDS}s" >> "$out/steps.txt"; tar -czf "$final/hopper-alibi.tgz" -C /tmp hopper-alibi; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export UP0=$(cut -d' ' -f1 /proc/uptime)  # the start, for the timing step's budget
attn=${ATTN:-.device-hopper/attn}
base=${BASE:-.device-hopper/attn-base}
chmod +x "$attn" "$base" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"

echo "== memcheck: bf16 D=128 Sq=300 Sk=500 Hq=4 Hkv=2, causal, soft-cap 30, ALiBi (default family)"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $attn run --backend cuda --dtype bf16 -d 128 \
  --seq-q 300 --seq-k 500 --heads 4 --kv-heads 2 --softcap 30 --alibi --lse --iters 1 --warmup 0 \
  --check-rows 300 --json > "$out/sanitizer.txt" 2>&1
echo "memcheck exit $?, $(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$out/sanitizer.txt")" | tee "$out/sanitizer.log"
grep -o '"kernel": *"[^"]*"' "$out/sanitizer.txt" | head -1 | tee -a "$out/sanitizer.log"
pack sanitize

echo "== plans"
for args in "-d 64 --no-causal --softcap 30" "-d 128 --window 300,40" "-d 256" "-d 256 --window 64,0"; do
  echo "-- attn plan --alibi $args" >> "$out/plans.txt"
  timeout 20 $attn plan --backend cuda --dtype bf16 --seq 2048 --heads 8 --alibi $args >> "$out/plans.txt" 2>&1
done
grep -E "^-- |kernel|ALiBi|Ampere" "$out/plans.txt" | head -40
pack plan

echo "== verify: alibi and window families (full grid), then the quick grid"
timeout 120 $attn verify --backend cuda --family alibi --family window --json > "$out/verify-families.json" 2> "$out/verify-families.log"
echo "verify families exit $?"
timeout 70 $attn verify --backend cuda --quick --json > "$out/verify-quick.json" 2> "$out/verify-quick.log"
echo "verify quick exit $?"
python3 - "$out" <<'PY'
import json, sys, os
for name in ["verify-families", "verify-quick"]:
    path = os.path.join(sys.argv[1], name + ".json")
    try:
        r = json.load(open(path))
    except Exception as e:
        print(name, "unreadable:", e); continue
    res = r.get("results", [])
    counts = {}
    for c in res:
        counts[c["outcome"]["status"]] = counts.get(c["outcome"]["status"], 0) + 1
    print(name, "verdict:", r.get("verdict"), counts)
    for c in res:
        o = c["outcome"]
        if c["family"] == "alibi" or o["status"] == "fail":
            print(f"  {o['status']:4s} {c['worst_ratio']:6.3f}  {c['case']}  {o.get('reason', '')[:100]}")
PY
pack verify

echo "== timings"
ATTN="$attn" BASE="$base" OUTDIR="$out" FINAL="$final" BUDGET=${BUDGET:-320} ROUNDS=${ROUNDS:-2} python3 - <<'PY'
import json, os, subprocess, time
attn, base, outdir, final = os.environ["ATTN"], os.environ["BASE"], os.environ["OUTDIR"], os.environ["FINAL"]
budget, rounds = float(os.environ["BUDGET"]), int(os.environ["ROUNDS"])
grid = ["bench", "--backend", "cuda", "--dtypes", "bf16", "--dims", "64,128", "--seqs", "4096,16384",
        "--tokens", "16384", "--model-dim", "2048", "--masks", "none,causal", "--iters", "20", "--warmup", "3",
        "--check-rows", "4"]
features = {"plain": [], "alibi": ["--alibi"], "softcap30": ["--softcap", "30"],
            "softcap30+alibi": ["--softcap", "30", "--alibi"]}
benches = [("this", f, a) for f, a in features.items()] + [("base", "softcap30", features["softcap30"]),
                                                            ("base", "alibi", features["alibi"])]
win = ["run", "--backend", "cuda", "--dtype", "bf16", "-d", "128", "--batch", "1", "--heads", "16", "--seq", "32768",
       "--iters", "20", "--warmup", "3", "--check-rows", "0", "--json"]
windows = [("this", "causal", []), ("this", "window4096", ["--window", "4096,0"]),
           ("base", "window4096", ["--window", "4096,0"])]
bins = {"this": attn, "base": base}
commit = lambda b: open(b + ".commit").read().strip() if os.path.exists(b + ".commit") else "unknown"
rows = {}    # (build, feature, d, seq, causal) -> [median ms per round], and the kernel
kernels, accuracy, wins, wkern = {}, {}, {}, {}
try:
    device = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
except OSError:
    device = "unknown (no nvidia-smi)"
elapsed = lambda: float(open("/proc/uptime").read().split()[0]) - float(os.environ["UP0"])

def pairs(s, left=None):
    if left is None:
        return s * (s + 1) // 2
    w = left + 1
    return w * s - w * (w - 1) // 2

def write():
    table = []
    for (b, f, d, s, c), ms in sorted(rows.items()):
        table.append({"build": b, "features": f, "head_dim": d, "seq": s, "batch": 16384 // s, "heads": 2048 // d,
                      "causal": c, "median_ms_per_round": ms, "best_ms": min(ms), "kernel": kernels[(b, f, d, s, c)],
                      "rel_l2": accuracy[(b, f, d, s, c)]})
    cost = []
    for (b, f, d, s, c), ms in sorted(rows.items()):
        plain = rows.get(("this", "plain", d, s, c))
        if f != "plain" and plain:
            cost.append({"build": b, "features": f, "head_dim": d, "seq": s, "causal": c,
                         "slower_than_plain": min(ms) / min(plain) - 1.0})
    w = {}
    if ("this", "causal") in wins:
        tc = min(wins[("this", "causal")])
        visible = pairs(32768, 4096) / pairs(32768)
        for (b, name), ms in wins.items():
            if name == "window4096":
                w[b] = {"causal_ms": wins[("this", "causal")], "window_ms": ms, "kernel_window": wkern[(b, name)],
                        "kernel_causal": wkern[("this", "causal")], "time_ratio": min(ms) / tc,
                        "visible_pair_ratio": visible, "time_over_proportional": min(ms) / tc / visible}
    doc = {
        "what": "ALiBi in the CUDA backend's Hopper family and the soft-cap's cost there: time of ALiBi, soft-cap 30 "
                "and both against neither (this build), soft-cap 30 and ALiBi of the build before (base: soft-cap "
                "with MUFU.RCP, ALiBi handed to the Ampere/Ada family); and the causal window (4096, 0) against "
                "causal at S=32768 next to the ratio of visible (query, key) pairs",
        "device": device,
        "commit": commit(attn), "base_commit": commit(base),
        "command": "bash bench/device/hopper-alibi.sh (ATTN=<release attn of commit>, BASE=<release attn of base_commit>); "
                   "grid rows: attn bench --backend cuda --dtypes bf16 --dims 64,128 --seqs 4096,16384 --tokens 16384 "
                   "--model-dim 2048 --masks none,causal --iters 20 --warmup 3 --check-rows 4 [--alibi] [--softcap 30]; "
                   "window: attn run --backend cuda --dtype bf16 -d 128 --batch 1 --heads 16 --seq 32768 --iters 20 "
                   "[--window 4096,0]",
        "timing": "CUDA-event median of 20 launches per row after warm-up, per round; rounds interleaved (every "
                  "configuration once per round); ratios from the best round of each",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": table, "cost_against_plain": cost, "window": w,
    }
    for path in [os.path.join(outdir, "h100-hopper-alibi-softcap.json"), os.path.join(final, "h100-hopper-alibi-softcap.json")]:
        json.dump(doc, open(path, "w"), indent=1)

for r in range(rounds):
    for b, f, args in benches:
        if elapsed() > budget:
            break
        p = subprocess.run([bins[b]] + grid + args, capture_output=True, text=True, timeout=max(5, budget + 20 - elapsed()))
        open(os.path.join(outdir, f"bench-{b}-{f}-r{r}.log"), "w").write(p.stdout + p.stderr)
        for line in p.stdout.splitlines():
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            key = (b, f, j["head_dim"], j["seq"], j["causal"])
            rows.setdefault(key, []).append(j["median_ms"])
            kernels[key], accuracy[key] = j["kernel"], j["rel_l2"]
            print(f"r{r} {b:4s} {f:16s} d{j['head_dim']} s{j['seq']:5d} {'causal' if j['causal'] else 'none  '} "
                  f"{j['median_ms']:8.3f} ms  rel_l2 {j['rel_l2']:.1e}  {j['kernel']}", flush=True)
        if p.returncode != 0:
            print(b, f, "exit", p.returncode, p.stderr[-300:], flush=True)
        write()
    for b, name, args in windows:
        if elapsed() > budget:
            break
        p = subprocess.run([bins[b]] + win + args, capture_output=True, text=True, timeout=max(5, budget + 20 - elapsed()))
        if p.returncode != 0:
            print(b, name, "exit", p.returncode, p.stderr[-300:], flush=True)
            continue
        j = json.loads(p.stdout)
        wins.setdefault((b, name), []).append(j["timing"]["median_s"] * 1e3)
        wkern[(b, name)] = j["plan"]["kernel"]
        print(f"r{r} {b:4s} s32768 {name:10s} {j['timing']['median_s']*1e3:8.3f} ms  {j['plan']['kernel']}", flush=True)
        write()
write()
doc = json.load(open(os.path.join(final, "h100-hopper-alibi-softcap.json")))
for c in doc["cost_against_plain"]:
    print(f"{c['build']:4s} {c['features']:16s} d{c['head_dim']} s{c['seq']:5d} {'causal' if c['causal'] else 'none  '} "
          f"{100 * c['slower_than_plain']:+6.1f}%")
for b, w in doc["window"].items():
    print(f"window {b}: {w['time_over_proportional']:.3f}x proportional ({w['kernel_window']})")
PY
pack time
