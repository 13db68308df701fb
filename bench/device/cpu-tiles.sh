#!/usr/bin/env bash
# On the lent GPU machine (its CPU cores): cpu-flash's 128-row query blocks against 64-row ones
# (ATTN_CPU_TILES=64x64) and PyTorch's fused CPU SDPA, f32, short sequences (where the planner's
# choice between them matters), alternating for 5 rounds; prints the median of the rounds.
# Expects the release `attn` in .device/bin (`cargo xtask bundle`); writes $OUT/*.jsonl.
set -u
g=(--dtypes f32 --dims 64,128 --seqs 512,1024 --masks none,causal --batch 1 --heads 16 --threads 16)
for r in 1 2 3 4 5; do
  .device/bin/attn bench --backend cpu-flash "${g[@]}" >> "$OUT/default.jsonl" 2>/dev/null
  ATTN_CPU_TILES=64x64 .device/bin/attn bench --backend cpu-flash "${g[@]}" >> "$OUT/bm64.jsonl" 2>/dev/null
  python3 bench/peers/torch_cpu.py "${g[@]}" >> "$OUT/torch.jsonl" 2>/dev/null
done
python3 - <<'PY'
import json, os, statistics as st
out = os.environ["OUT"]
def load(n):
    d = {}
    for l in open(f"{out}/{n}.jsonl"):
        r = json.loads(l); d.setdefault((r["head_dim"], r["seq"], r["causal"]), []).append(r["gflops"])
    return d
a, b, t = load("default"), load("bm64"), load("torch")
for k in sorted(a):
    print(k, "default", round(st.median(a[k])), "bm64", round(st.median(b[k])), "torch", round(st.median(t[k])),
          "ratios", round(st.median(a[k]) / st.median(t[k]), 2), round(st.median(b[k]) / st.median(t[k]), 2))
PY
