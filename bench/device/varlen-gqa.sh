#!/usr/bin/env bash
# On the lent H100: issue 33's varlen prefill target on GQA 32:8 (D=128, bf16), the row that sat
# at the edge of 0.95 in one round: 64 sequences of seeded lengths uniform in 128..4096 (`attn
# bench --varlen 128`) against the dense batch of the same token count (64 x 2089), causal and
# not, ROUNDS (default 3) rounds with the four runs interleaved in each; TFLOP/s by
# FlashAttention's convention per sequence (attn bench's `gflops`). Expects bin/attn next to
# this script. Writes $OUT/varlen-gqa.jsonl and prints per row each round's TFLOP/s and the
# ratio of the medians.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
attn=$here/bin/attn
base=(bench --backend cuda --dtypes bf16 --iters 20 --check-rows 4 --heads 32 --kv-heads 8 --dims 128 --batch 64)
for round in $(seq 1 "${ROUNDS:-3}"); do
  for mask in causal none; do
    for shape in "varlen:--seqs 4096 --varlen 128" "dense:--seqs 2089"; do
      timeout 120 "$attn" "${base[@]}" --masks "$mask" ${shape#*:} 2>/dev/null |
        sed "s/^{/{\"round\":$round,\"shape\":\"${shape%%:*}\",/" >> "$out/varlen-gqa.jsonl"
    done
  done
done
python3 - "$out/varlen-gqa.jsonl" <<'PY'
import json, statistics, sys
t = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    t.setdefault((r["mask"], r["shape"]), []).append((r["gflops"] / 1e3, r["kernel"], r["tokens"], r["rel_l2"]))
for mask in ("causal", "none"):
    v, d = t.get((mask, "varlen"), []), t.get((mask, "dense"), [])
    if not v or not d: continue
    mv, md = statistics.median(x[0] for x in v), statistics.median(x[0] for x in d)
    print(f"32:8 {mask}: varlen {[round(x[0], 1) for x in v]} TFLOP/s ({v[0][1]}, {v[0][2]} tokens, rel_l2 {v[0][3]:.1e}) | "
          f"dense {[round(x[0], 1) for x in d]} ({d[0][1]}, {d[0][2]} tokens) | varlen/dense {mv / md:.3f}")
PY
