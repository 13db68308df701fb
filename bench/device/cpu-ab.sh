#!/usr/bin/env bash
# On the lent GPU machine (its CPU cores): two builds of attn's CPU path, A (.device/bin/attn-base)
# and B (.device/bin/attn), next to PyTorch's fused CPU SDPA, same shapes and thread count,
# alternating A, B, PyTorch for $ROUNDS rounds; each row is reported at its median round. Also
# `attn verify` of cpu-flash with B (its AVX-512 kernel: the development machine may lack it) and
# PyTorch's f32 GEMM rate on the same threads (what the cores reach on a plain matrix product).
# Writes $OUT/cpu-ab.json, $OUT/cpu-ab.md and the raw JSON lines.
# Making A (`cargo xtask bundle` makes only B): build the other commit in a worktree, e.g.
#   git worktree add /tmp/a <commit> && (cd /tmp/a && cargo build --release -p attn)
#   cp /tmp/a/target/release/attn .device/bin/attn-base && strip .device/bin/attn-base
#   echo <commit> > .device/COMMIT-base
set -uo pipefail
[[ -x .device/bin/attn-base ]] || { echo "no .device/bin/attn-base (build A first: see the header)"; exit 2; }
out=${OUT:-/tmp/out}; mkdir -p "$out"
threads=${THREADS:-16}; rounds=${ROUNDS:-5}
grid=(--dtypes ${DTYPES:-f32} --dims ${DIMS:-64,128} --seqs ${SEQS:-512,1024,2048,4096} --masks none,causal --batch 1 --heads 16)
lscpu | grep -E "Model name|^CPU\(s\)|Thread" | tee "$out/cpu.txt"
echo "B: $(cat .device/COMMIT); A: $(cat .device/COMMIT-base 2>/dev/null)" | tee -a "$out/cpu.txt"
timeout 120 .device/bin/attn verify --backend cpu-flash --quick 2>&1 | tail -3 | tee -a "$out/cpu.txt"
python3 - "$threads" <<'PY' | tee -a "$out/cpu.txt"
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
for _ in range(3): a @ b
ts = []
for _ in range(7):
    t = time.perf_counter(); a @ b; ts.append(time.perf_counter() - t)
ts.sort(); print(f"torch f32 GEMM 4096^3, {sys.argv[1]} threads: {2 * 4096**3 / ts[3] / 1e9:.0f} GFLOP/s")
PY
for f in a b torch; do : > "$out/$f.jsonl"; done
for r in $(seq "$rounds"); do
  echo "round $r"
  .device/bin/attn-base bench --backend cpu-flash --threads "$threads" "${grid[@]}" >> "$out/a.jsonl" 2>/dev/null
  .device/bin/attn bench --backend cpu-flash --threads "$threads" "${grid[@]}" >> "$out/b.jsonl" 2>/dev/null
  python3 bench/peers/torch_cpu.py --threads "$threads" "${grid[@]}" >> "$out/torch.jsonl" 2>/dev/null
done
python3 - "$out" <<'PY' | tee "$out/cpu-ab.md"
import json, sys, statistics as st
out = sys.argv[1]
def load(n):
    d = {}
    for l in open(f"{out}/{n}.jsonl"):
        if l.startswith("{"):
            r = json.loads(l); d.setdefault((r["dtype"], r["head_dim"], r["seq"], r["causal"]), []).append(r["gflops"])
    return d
a, b, t = load("a"), load("b"), load("torch")
rows = []
print("| dtype | D | S | mask | A | B | PyTorch | A/PyTorch | B/PyTorch | B/A |\n|---|---|---|---|---|---|---|---|---|---|")
for k in sorted(b):
    ma, mb, mt = (st.median(x[k]) if k in x else float("nan") for x in (a, b, t))
    rows.append({"dtype": k[0], "head_dim": k[1], "seq": k[2], "causal": k[3], "a": a.get(k), "b": b[k], "torch": t.get(k)})
    print(f"| {k[0]} | {k[1]} | {k[2]} | {'causal' if k[3] else 'none'} | {ma:.1f} | {mb:.1f} | {mt:.1f} | "
          f"{ma / mt:.2f}x | {mb / mt:.2f}x | {mb / ma:.2f}x |")
json.dump(rows, open(f"{out}/cpu-ab.json", "w"), indent=1)
PY
