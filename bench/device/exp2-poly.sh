#!/usr/bin/env bash
# On the lent GPU machine: the Hopper kernel with part of its softmax's exponentials on the FMA
# pipe (a polynomial) instead of the multi-function unit (ATTN_CUDA_SM90_EXP2_POLY = how many of
# every four 8-key chunks, `exp2_poly` in kernels/flash_fwd_sm90.cu). Verifies the forced
# settings (POLY_VERIFY: full grid for the last, quick for the others), then times POLYS in
# ROUNDS interleaved rounds on bf16 D=64 (S=2048, 4096, 16384, both masks) and D=128 (S=4096,
# no mask). Expects `cargo xtask bundle` output in .device/ (carry it). Writes $OUT/exp2-poly.tgz.
set -uo pipefail
final=${OUT:-/tmp/out}; out=$final/exp2-poly; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper
attn=.device/bin/attn
cat .device/COMMIT > "$out/gpu.txt"; nvidia-smi --query-gpu=name,driver_version --format=csv >> "$out/gpu.txt"
verify=(${POLY_VERIFY:-1 2})
for k in "${verify[@]}"; do
  grid=--quick; [[ $k == "${verify[-1]}" ]] && grid=
  ATTN_CUDA_SM90_EXP2_POLY=$k timeout 150 $attn verify --backend cuda --json $grid > "$out/verify-poly$k.json" \
    2> "$out/verify-poly$k.log"
  echo "verify poly $k ${grid:-full}: exit $? $(python3 -c "import json; print(json.load(open('$out/verify-poly$k.json'))['verdict'])" 2>/dev/null)"
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  for k in ${POLYS:-0 1 2}; do
    for shape in "64 2048,4096,16384 none,causal" "128 4096 none"; do
      read -r d seqs masks <<< "$shape"
      ATTN_CUDA_SM90_EXP2_POLY=$k timeout 120 $attn bench --backend cuda --warmup 5 --iters 30 --check-rows 8 \
        --dtypes bf16 --dims $d --seqs $seqs --masks $masks --tokens 16384 --model-dim 2048 \
        > "$out/attn-d$d-poly$k-r$round.jsonl" 2> "$out/attn-d$d-poly$k-r$round.log"
    done
  done
done
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import glob, json, os, re, sys
out = sys.argv[1]
got = {}
for p in sorted(glob.glob(f"{out}/attn-*.jsonl")):
    k, r = re.search(r"poly(\d)-r(\d)", p).groups()
    for l in open(p):
        row = json.loads(l)
        if "gflops" in row:
            key = (row["head_dim"], row["seq"], "causal" if row["causal"] else "none")
            got.setdefault(key, {}).setdefault(k, []).append((row["gflops"] / 1e3, row["rel_l2"]))
print("D S mask | " + " | ".join(f"poly {k}" for k in sorted({k for v in got.values() for k in v})))
for key in sorted(got):
    cells = " | ".join(" / ".join(f"{t:.1f}" for t, _ in got[key][k]) + f" (rel L2 {max(e for _, e in got[key][k]):.1e})"
                       for k in sorted(got[key]))
    print(f"{key[0]} {key[1]} {key[2]} | {cells}")
PY
tar -czf "$final/exp2-poly.tgz" -C "$final" exp2-poly
