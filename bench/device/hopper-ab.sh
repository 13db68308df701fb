#!/usr/bin/env bash
# On the lent H100, in one call: two builds of attn (an experiment and the one before it) on the
# same `attn run` configurations, ROUNDS rounds (default 3) interleaved, the builds' order flipped
# each round; each run a CUDA-event median of ITERS launches (default 20) after 5 warm-up ones.
# Stage in .device-rev/: attn.gz (the experiment's stripped release attn), attn-old.gz (the build
# before). CONFIGS: a file of lines `name | attn run flags` (default bench/device/hopper-ab.txt),
# the flags led by any NAME=VALUE environment settings (e.g. ATTN_CUDA_FAMILY=ampere);
# VERIFY: attn verify arguments run on the new build first (e.g. "--family window"; none by default).
# Writes $OUT/rows.jsonl (every run), $OUT/summary.txt and $OUT/$NAME.json (default hopper-ab):
# per configuration and build, the median over rounds and each round's time.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
w=/tmp/ab-bins; mkdir -p $w
for f in .device-rev/attn.gz .device-rev/attn-old.gz; do b=$(basename "${f%.gz}"); gunzip -c "$f" > $w/$b; chmod +x $w/$b; done
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  if [[ -n ${VERIFY:-} ]]; then
    echo "== new build: attn verify --backend cuda $VERIFY"
    timeout 200 $w/attn verify --backend cuda $VERIFY 2>&1 | tail -4
  fi
} 2>&1 | tee "$out/summary.txt"
NEW=$w/attn OLD=$w/attn-old CONFIGS=${CONFIGS:-bench/device/hopper-ab.txt} ROUNDS=${ROUNDS:-3} ITERS=${ITERS:-20} \
NAME=${NAME:-hopper-ab} WHAT=${WHAT:-} OUTDIR=$out python3 - <<'PY' 2>&1 | tee -a "$out/summary.txt"
import json, os, statistics, subprocess, time
env = os.environ
configs = []
for line in open(env["CONFIGS"]):
    line = line.split("#", 1)[0].strip()
    if line:
        name, flags = (x.strip() for x in line.split("|", 1))
        words = flags.split()
        sets = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
        configs.append((name, [w for w in words if w.split("=", 1)[0] not in sets], sets))
bins = {"new": env["NEW"], "old": env["OLD"]}
rows, times, kernels = [], {}, {}
for r in range(int(env["ROUNDS"])):
    order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
    for name, flags, sets in configs:
        for who in order:
            cmd = [bins[who], "run", "--backend", "cuda", "--iters", env["ITERS"], "--warmup", "5", "--json"] + flags
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **sets})
            if p.returncode != 0:
                print(f"{name} {who} FAILED: {p.stderr[-300:]}", flush=True)
                continue
            j = json.loads(p.stdout)
            t = j["timing"]["median_s"]
            times.setdefault((name, who), []).append(t)
            kernels[(name, who)] = j["plan"]["kernel"]
            rows.append({"round": r, "config": name, "build": who, "median_s": t, "kernel": j["plan"]["kernel"],
                         "accuracy": j.get("accuracy")})
            print(f"round {r} {name:28s} {who:3s} {t*1e3:9.3f} ms  {j['plan']['kernel']}", flush=True)
with open(os.path.join(env["OUTDIR"], "rows.jsonl"), "w") as f:
    for row in rows:
        f.write(json.dumps(row) + "\n")
res = []
for name, _, _ in configs:
    e = {"config": name}
    for who in ["old", "new"]:
        if (name, who) in times:
            e[who] = {"median_ms": 1e3 * statistics.median(times[(name, who)]),
                      "rounds_ms": [1e3 * t for t in times[(name, who)]], "kernel": kernels[(name, who)]}
    if "old" in e and "new" in e:
        e["new_over_old"] = e["new"]["median_ms"] / e["old"]["median_ms"]
    res.append(e)
    print(f"{name:28s} " + "  ".join(f"{w} {e[w]['median_ms']:8.3f} ms" for w in ["old", "new"] if w in e)
          + (f"  new/old {e['new_over_old']:.3f}" if "new_over_old" in e else ""))
json.dump({"what": env["WHAT"], "device": subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                                         capture_output=True, text=True).stdout.strip(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "timing": f"attn run --json: CUDA-event median of {env['ITERS']} launches after 5 warm-up ones; "
                     f"{env['ROUNDS']} rounds, builds' order flipped each round; median over rounds",
           "command": f"CONFIGS={env['CONFIGS']} ROUNDS={env['ROUNDS']} bash bench/device/hopper-ab.sh",
           "configs": res}, open(os.path.join(env["OUTDIR"], env["NAME"] + ".json"), "w"), indent=1)
PY
