#!/usr/bin/env bash
# On the lent H100, in one call: ALiBi, packed (varlen) sequences, a paged KV cache and
# per-sequence key counts on the CUDA backend.
#   sanitize  compute-sanitizer memcheck on one small packed + paged + ALiBi case (and one packed
#             keys + window + soft-cap + ALiBi case), on the Ampere/Ada family and on the default
#             choice (on sm_90 the Hopper family defers these problems to the Ampere/Ada one)
#   verify    attn verify --backend cuda, the full grid (families alibi, varlen, paged, kv-cache
#             among the rest), ATTN_CUDA_FAMILY=ampere and the default
# Expects the release `attn` at $ATTN (default .device/bin/attn). Writes $OUT/sequences.tgz (every
# log, the verify JSONs) and $OUT/h100-cuda-sequences.json, the self-describing result that
# bench/results/ keeps, rewritten after each step so that a step cut short keeps the ones before.
set -uo pipefail
final=${OUT:-/tmp/out}; out=/tmp/sequences; mkdir -p "$out" "$final"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
attn=${ATTN:-.device/bin/attn}
commit=$(cat "${COMMIT_FILE:-.device/COMMIT}" 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

summarize() {
  echo "step $1 done at ${SECONDS}s" >> "$out/steps.txt"
  tar -czf "$final/sequences.tgz" -C /tmp sequences
  OUTDIR="$out" FINAL="$final" COMMIT="$commit" python3 - <<'PY'
import json, os, glob, datetime
out, final = os.environ["OUTDIR"], os.environ["FINAL"]
families = ("alibi", "varlen", "paged", "kv-cache")
verify = {}
for path in sorted(glob.glob(f"{out}/verify-*.json")):
    fam = path.rsplit("-", 1)[1][:-5]
    try:
        r = json.load(open(path))
    except Exception as e:
        verify[fam] = {"error": f"unreadable: {e}"}
        continue
    ours = [c for c in r.get("results", []) if c["family"] in families]
    verify[fam] = {
        "verdict": r.get("verdict"),
        "sequence_and_alibi_cases": {s: sum(c["outcome"]["status"] == s for c in ours)
                                     for s in ("pass", "fail", "skip")},
        "worst_ratio_sequence_and_alibi": max((c["worst_ratio"] for c in ours
                                               if c["outcome"]["status"] == "pass"), default=None),
        "cases": {c["case"]: [c["outcome"]["status"], round(c["worst_ratio"], 4)] for c in ours},
        "failed_any_family": [c["case"] for c in r.get("results", []) if c["outcome"]["status"] == "fail"],
    }
def lines(name):
    p = f"{out}/{name}"
    return open(p).read().split("\n")[:-1] if os.path.exists(p) else []
result = {
    "what": "ALiBi, packed (varlen) queries and keys, a paged KV cache and per-sequence key counts on the "
            "CUDA backend (Ampere/Ada kernel, ATTN_SEQS / ATTN_ALIBI variants): attn verify's full grid "
            "(families alibi, varlen, paged, kv-cache checked against the f64 reference) on the "
            "Ampere/Ada family and on the default family choice, and compute-sanitizer memcheck",
    "device": open(f"{out}/gpu.txt").read().strip(),
    "commit": os.environ["COMMIT"],
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "command": "bash bench/device/sequences.sh (ATTN=<release attn from this commit>)",
    "verify": verify,
    "sanitizer": lines("sanitizer.log"),
    "device_steps_s": lines("steps.txt"),
}
json.dump(result, open(f"{final}/h100-cuda-sequences.json", "w"), indent=1)
PY
}

: > "$out/sanitizer.log"
for fam in ampere default; do
  envs=(); [ "$fam" = ampere ] && envs=(ATTN_CUDA_FAMILY=ampere)
  for c in "paged-varlen-alibi|--dtype bf16 -d 128 --batch 3 --seq 300 --heads 4 --kv-heads 2 --varlen 20 --page-size 32 --alibi --lse" \
           "packed-window-softcap-alibi|--dtype f16 -d 64 --batch 4 --seq 200 --heads 4 --kv-heads 1 --varlen 1 --no-causal --window 24,8 --softcap 20 --alibi --lse"; do
    name=${c%%|*}; flags=${c#*|}
    echo "== memcheck $fam $name: $flags"
    env "${envs[@]}" timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $attn run --backend cuda \
      $flags --iters 1 --warmup 0 --check-rows 300 > "$out/sanitizer-$fam-$name.txt" 2>&1
    rc=$?
    echo "memcheck $fam $name: exit $rc, $(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$out/sanitizer-$fam-$name.txt"), $(grep -o '"kernel": *"[^"]*"' "$out/sanitizer-$fam-$name.txt" | head -1)" | tee -a "$out/sanitizer.log"
    grep -iE 'max_abs|rel_l2|error|mismatch' "$out/sanitizer-$fam-$name.txt" | head -4
  done
done
summarize sanitize

for fam in ampere default; do
  envs=(); [ "$fam" = ampere ] && envs=(ATTN_CUDA_FAMILY=ampere)
  echo "== verify (cuda, $fam)"
  env "${envs[@]}" timeout ${VERIFY_TIMEOUT:-150} $attn verify --backend cuda --json > "$out/verify-$fam.json" 2> "$out/verify-$fam.log"
  echo "verify $fam exit $?"
  summarize "verify-$fam"
  python3 -c "
import json; r = json.load(open('$out/verify-$fam.json')); print(r.get('verdict'))
for c in r.get('results', []):
    o = c['outcome']
    if c['family'] in ('alibi', 'varlen', 'paged', 'kv-cache') or o['status'] == 'fail':
        print(f\"  {o['status']:4s} {c['worst_ratio']:6.3f}  {c['case']}  {o.get('reason', '')[:100]}\")
" || tail -5 "$out/verify-$fam.log"
done
