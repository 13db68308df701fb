#!/usr/bin/env bash
# On the lent GPU machine, in one call (about 4 minutes): what each inference feature costs on the
# default CUDA plan of one build (issue 33's prefill targets: ALiBi and the soft-cap at most 5%
# slower than without, the window (4096, 0) at S=32k within 10% of proportional to its visible
# pairs). CONFIGS (default bench/device/feature-costs.txt): lines `name | compared with | attn run
# flags [| visible=F]`; every configuration runs once a round, ROUNDS rounds (default 3), the order
# reversed every other round, each an `attn run --json` CUDA-event median of ITERS launches
# (default 20) after 5 warm-up ones, checked against the f64 reference on 16 rows. Per
# configuration: the median over rounds, its time over its base's, and with `visible=F` that
# ratio over F (1.0 = proportional). Expects the release attn at $ATTN (default .device/bin/attn)
# and the commit in .device/COMMIT. Writes $OUT/rows.jsonl and $OUT/$NAME.json (default
# feature-costs.json).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
ATTN=${ATTN:-.device/bin/attn} CONFIGS=${CONFIGS:-bench/device/feature-costs.txt} ROUNDS=${ROUNDS:-3} \
ITERS=${ITERS:-20} NAME=${NAME:-feature-costs} COMMIT=$(cat .device/COMMIT 2>/dev/null || echo unknown) OUTDIR=$out \
  python3 - <<'PY' 2>&1 | tee "$out/summary.txt"
import json, os, statistics, subprocess, time
env = os.environ
configs = []
for line in open(env["CONFIGS"]):
    line = line.split("#", 1)[0].strip()
    if line:
        parts = [x.strip() for x in line.split("|")]
        visible = float(parts[3].split("=", 1)[1]) if len(parts) > 3 else None
        configs.append((parts[0], None if parts[1] == "-" else parts[1], parts[2].split(), visible))
device = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.strip()
print(device, "commit", env["COMMIT"], flush=True)
rows, times, meta = [], {}, {}
for r in range(int(env["ROUNDS"])):
    for name, _, flags, _ in (configs if r % 2 == 0 else configs[::-1]):
        cmd = [env["ATTN"], "run", "--backend", "cuda", "--dtype", "bf16", "--iters", env["ITERS"], "--warmup", "5",
               "--check-rows", "16", "--json"] + flags
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print(f"{name} FAILED: {p.stderr[-300:]}", flush=True)
            continue
        j = json.loads(p.stdout)
        t = j["timing"]["median_s"]
        times.setdefault(name, []).append(t)
        meta[name] = {"kernel": j["plan"]["kernel"], "accuracy": j.get("accuracy")}
        rows.append({"round": r, "config": name, "median_s": t, "kernel": j["plan"]["kernel"]})
        print(f"round {r} {name:24s} {t*1e3:9.3f} ms  {j['plan']['kernel']}", flush=True)
with open(os.path.join(env["OUTDIR"], "rows.jsonl"), "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
med = {n: statistics.median(t) for n, t in times.items()}
res = []
for name, base, flags, visible in configs:
    if name not in med:
        continue
    e = {"config": name, "flags": " ".join(flags), "median_ms": 1e3 * med[name],
         "rounds_ms": [1e3 * t for t in times[name]], **meta[name]}
    if base and base in med:
        e["base"] = base
        e["over_base"] = med[name] / med[base]
        if visible:
            e["visible_fraction"] = visible
            e["over_proportional"] = e["over_base"] / visible
    res.append(e)
    extra = ""
    if "over_base" in e:
        extra = f"  x{e['over_base']:.3f} of {base}"
        if "over_proportional" in e:
            extra += f"  {e['over_proportional']:.3f}x proportional"
    print(f"{name:24s} {e['median_ms']:9.3f} ms{extra}  {e['kernel']}")
json.dump({"what": "inference features' cost on the default CUDA plan (issue 33): each configuration's time over its "
                   "base's (ALiBi, the soft-cap: target <= 1.05) and, for windows, over the visible pairs' fraction "
                   "(target <= 1.10)",
           "device": device, "commit": env["COMMIT"], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "timing": f"attn run --json: CUDA-event median of {env['ITERS']} launches after 5 warm-up ones; "
                     f"{env['ROUNDS']} rounds, the order reversed every other round; median over rounds",
           "command": f"CONFIGS={env['CONFIGS']} ROUNDS={env['ROUNDS']} bash bench/device/feature-costs.sh",
           "configs": res}, open(os.path.join(env["OUTDIR"], env["NAME"] + ".json"), "w"), indent=1)
PY
