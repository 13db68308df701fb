#!/usr/bin/env bash
# On the lent H100, in one call (about 4 minutes): every head dim on the Hopper family, checked and
# timed (issue 33: head dims between the kernels' own run the next kernel padded, ATTN_PAD).
#   check  at once, while nothing is timed: `attn verify --backend cuda --family head-dims` and
#          the quick grid on the default family; `attn plan` of a few head dims (which family,
#          which kernel); compute-sanitizer memcheck on two small padded problems whose sequence
#          is no multiple of the tiles (D=80 causal, D=200 not: rows before 0 stored from
#          registers, the split tail's merge, D=256's register stores).
#   time   alone: `attn bench`, bf16, S=4096, batch 16384/S, heads 2048/D rounded down, causal and
#          not, the native 64, 128, 256 first, then the other multiples of 8 (as many as the time
#          leaves); then 32 and 96 on the Ampere/Ada family (natively compiled there) to compare.
# Writes $OUT/$NAME.json (default h100-head-dims.json: what bench/results/ keeps: each dim's TFLOP/s and the ratio to
# the next native dim's TFLOP/s scaled by D / D_next, target >= 0.9; the checks' verdicts), the raw
# rows and logs. (The device tool brings back only a few files: the verdicts are in log.txt.)
# Expects the release `attn` at $ATTN (default: attn next to this script) and COMMIT next to it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
attn=${ATTN:-$here/attn}
[[ -x $attn ]] || { gunzip -kf "$attn.gz" 2>/dev/null; chmod +x "$attn"; }
commit=$(cat "$here/COMMIT" 2>/dev/null || echo unknown)
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/log.txt"

# ---- check (concurrently; nothing is timed here)
timeout 100 "$attn" verify --backend cuda --family head-dims > "$out/verify-head-dims.txt" 2>&1 &
timeout 100 "$attn" verify --backend cuda --quick > "$out/verify-quick.txt" 2>&1 &
sanitize() {  # label, attn run flags...
  local label=$1; shift
  timeout 100 "$san" --tool memcheck --error-exitcode 9 "$attn" run --backend cuda --dtype bf16 --seq 300 --heads 2 \
    --batch 1 --iters 1 --warmup 0 --check-rows 8 "$@" > "$out/memcheck-$label.txt" 2>&1
  echo "memcheck $label exit $?" >> "$out/memcheck.txt"
}
sanitize d80-causal -d 80 &
sanitize d200-none -d 200 --no-causal &
sanitize d136-causal -d 136 &
( for d in 8 32 80 96 136 200 248; do echo "== plan d=$d causal, S=4096"; timeout 60 "$attn" plan --backend cuda \
    --dtype bf16 -d $d --seq 4096 --heads $((2048 / d)) --batch 4 2>&1; done ) > "$out/plans.txt" &
wait
echo "checks done at $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
cat "$out/memcheck.txt" | tee -a "$out/log.txt"
tail -n 4 "$out/verify-head-dims.txt" "$out/verify-quick.txt" | tee -a "$out/log.txt"
grep -h "ERROR SUMMARY" "$out"/memcheck-*.txt | tee -a "$out/log.txt"

# ---- time (alone)
dims="64,128,256,80,200,8,96,32,136,248,120,72,40,16,24,48,56,88,104,112,144,152,160,168,176,184,192,208,216,224,232,240"
common=(bench --backend cuda --dtypes bf16 --iters 10 --check-rows 4 --seqs 4096 --tokens 16384 --model-dim 2048
        --masks none,causal)
left=$(( 215 - ($(date +%s) - t0) ))
echo "timing with $left s left" | tee -a "$out/log.txt"
timeout $(( left > 20 ? left - 15 : 5 )) "$attn" "${common[@]}" --dims "$dims" > "$out/bench-default.jsonl" 2>> "$out/log.txt"
left=$(( 225 - ($(date +%s) - t0) ))
(( left > 8 )) && ATTN_CUDA_FAMILY=ampere timeout $left "$attn" "${common[@]}" --dims 32,96 \
  > "$out/bench-ampere.jsonl" 2>> "$out/log.txt"

COMMIT=$commit OUTDIR=$out DIMS=$dims python3 - <<'PY' 2>&1 | tee -a "$out/log.txt"
import json, os, time
out = os.environ["OUTDIR"]
def rows(name):
    try:
        return [json.loads(l) for l in open(os.path.join(out, name)) if l.startswith("{")]
    except OSError:
        return []
default, ampere = rows("bench-default.jsonl"), rows("bench-ampere.jsonl")
NATIVE = [64, 128, 256]
by = {(r["head_dim"], r["mask"]): r for r in default}
drows = []
for (d, mask), r in sorted(by.items()):
    nxt = min(x for x in NATIVE if x >= d)
    ref = by.get((nxt, mask))
    row = {"head_dim": d, "mask": mask, "batch": r["batch"], "heads": r["heads"], "kernel": r["kernel"],
           "ms": r["median_ms"], "tflops": r["gflops"] / 1e3, "rel_l2": r["rel_l2"], "next_native": nxt}
    if ref and d != nxt:
        row["ratio_to_next_scaled"] = r["gflops"] / (ref["gflops"] * d / nxt)
    amp = [a for a in ampere if (a["head_dim"], a["mask"]) == (d, mask)]
    if amp:
        row["ampere_family"] = {"kernel": amp[0]["kernel"], "ms": amp[0]["median_ms"], "tflops": amp[0]["gflops"] / 1e3}
    drows.append(row)
common = ("attn bench --backend cuda --dtypes bf16 --iters 10 --check-rows 4 --seqs 4096 --tokens 16384 "
          "--model-dim 2048 --masks none,causal")
meta = {"what": "every head dim (multiples of 8 from 8 to 256; those timed) on CUDA's default family, bf16, S=4096, "
                "batch 16384/S, heads 2048/D rounded down; TFLOP/s and the ratio to the next native head dim's "
                "TFLOP/s scaled by D/D_next (target >= 0.9)",
        "device": None, "commit": os.environ["COMMIT"],
        "date": os.environ.get("DATE") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "bash bench/device/hopper-head-dims.sh",
        "commands": [common + " --dims " + os.environ["DIMS"], "ATTN_CUDA_FAMILY=ampere " + common + " --dims 32,96"],
        "native": {"hopper (sm_90 default)": NATIVE},
        "routing": "on sm_90 the Hopper family (flash_sm90_*) runs every multiple of 8 up to 256: 64, 128 and 256 "
                   "natively, the others on the next one's kernel padded (_pad: TMA loads zeros past the head dim, "
                   "stores stop at it); ampere_family: the same shape with ATTN_CUDA_FAMILY=ampere",
        "timing": "attn bench: CUDA-event median of 10 calls per row, one process, one round",
        "rows": drows}
lines = open(os.path.join(out, "log.txt")).read().splitlines()
meta["device"] = lines[1].split(",")[0] if len(lines) > 1 else "unknown"
# The checks' verdicts as the log has them: memcheck exits and error summaries, verify's last lines.
checks = lines[lines.index(next(l for l in lines if l.startswith("checks done"))):] if any(
    l.startswith("checks done") for l in lines) else []
checks = checks[:next((i for i, l in enumerate(checks) if l.startswith("timing with")), len(checks))]
meta["verification"] = {
    "what": "before the timing, at once: attn verify --backend cuda --family head-dims; attn verify --backend "
            "cuda --quick (default family); compute-sanitizer --tool memcheck on attn run --backend cuda --dtype "
            "bf16 --seq 300 --heads 2 --batch 1 --check-rows 8 at D=80 causal, D=136 causal, D=200 --no-causal",
    "log": [l for l in checks if l.strip()]}
meta = {k: meta[k] for k in ["what", "device", "commit", "date", "command", "commands", "native", "routing",
                             "timing", "verification", "rows"]}
json.dump(meta, open(os.path.join(out, os.environ.get("NAME", "h100-head-dims") + ".json"), "w"), indent=1)
for r in drows:
    ratio = "ratio %.3f" % r["ratio_to_next_scaled"] if "ratio_to_next_scaled" in r else ""
    amp = " | ampere %.1f TF" % r["ampere_family"]["tflops"] if "ampere_family" in r else ""
    print("d%-3d %-6s h%-3d %8.3f ms %6.1f TF %s %s%s" % (r["head_dim"], r["mask"], r["heads"], r["ms"], r["tflops"],
                                                    ratio, r["kernel"], amp))
PY
echo "done at $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
