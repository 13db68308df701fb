#!/usr/bin/env bash
# On the lent GPU machine: the Hopper kernel under several knob settings, verified and timed
# against each other in one call. CONFIGS lists "label=SETTING,SETTING..." ("base" with nothing
# for the defaults), e.g.
#   CONFIGS="base q1=ATTN_CUDA_SM90_QSLOTS=1 top=ATTN_CUDA_SM90_BLOCKS=top
#            t64=ATTN_CUDA_SM90_TILES=64:3:3,ATTN_CUDA_SM90_SPLIT=off"
# Each non-base configuration runs `attn verify` first (the quick grid; the full grid for those
# in VERIFY_FULL, and again on 3 CTAs with ATTN_CUDA_SM90_GRID=3; base only when VERIFY_FULL
# names it), then all of them are timed in
# ROUNDS interleaved rounds on SHAPES ("d:seqs:masks ...", default D=64 and 128, S=2048-16384,
# both masks; bf16, batch x heads = 16384/S x 2048/D). Each timed call is behind an untimed
# twin (the default lead). PEERS="cudnn,flash" also times those PyTorch SDPA backends on the same
# shapes in every round (bench/peers/torch_sdpa_gpu.py, its calls behind the same twin), before
# the configurations in even rounds and after them in odd ones, and the summary gives each
# configuration's ratio to cuDNN. Expects `cargo xtask bundle` output in .device/ (carry it).
# A setting BIN=path runs that binary instead of .device/bin/attn (an earlier commit's, built
# and bundled alongside), e.g. CONFIGS="old=BIN=.device/bin/attn-old new".
# Writes $OUT/knobs.tgz with summary.txt.
set -uo pipefail
final=${OUT:-/tmp/out}; out=$final/knobs; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper
cat .device/COMMIT > "$out/gpu.txt"; nvidia-smi --query-gpu=name,driver_version --format=csv >> "$out/gpu.txt"
configs=${CONFIGS:-base}
source bench/device/configs.sh  # label, settings, binary
for c in $configs; do
  l=$(label "$c"); grid=(--quick); [[ " ${VERIFY_FULL:-} " == *" $l "* ]] && grid=()
  [[ $c != *=* && ${#grid[@]} -gt 0 ]] && continue  # the defaults: verified only when named
  env $(settings "$c") timeout 150 $(binary "$c") verify --backend cuda --json "${grid[@]}" > "$out/verify-$l.json" \
    2> "$out/verify-$l.log"
  echo "verify $l (${grid[*]:-full grid}): exit $? $(python3 -c "import json; print(json.load(open('$out/verify-$l.json'))['verdict'])" 2>/dev/null)"
  if ((${#grid[@]} == 0)); then
    env $(settings "$c") ATTN_CUDA_SM90_GRID=3 timeout 150 $(binary "$c") verify --backend cuda --json > "$out/verify-$l-grid3.json" \
      2> "$out/verify-$l-grid3.log"
    echo "verify $l (full, 3 CTAs): exit $? $(python3 -c "import json; print(json.load(open('$out/verify-$l-grid3.json'))['verdict'])" 2>/dev/null)"
  fi
done
shapes=${SHAPES:-64:2048,4096,8192,16384:none,causal 128:2048,4096,8192,16384:none,causal}
peers() {  # round
  [[ -z ${PEERS:-} ]] && return
  local i=0
  for shape in $shapes; do
    IFS=: read -r d seqs masks <<< "$shape"; i=$((i + 1))
    timeout 150 python3 bench/peers/torch_sdpa_gpu.py --backends "$PEERS" --dtypes bf16 --dims $d --seqs $seqs \
      --masks $masks --tokens 16384 --model-dim 2048 > "$out/peers-d$d-s$i-r$1.jsonl" 2> "$out/peers-d$d-s$i-r$1.log"
  done
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  ((round % 2 == 0)) && peers $round
  for c in $configs; do
    l=$(label "$c"); i=0
    for shape in $shapes; do
      IFS=: read -r d seqs masks <<< "$shape"; i=$((i + 1))  # i: the shape's place, in file names
      env $(settings "$c") timeout 150 $(binary "$c") bench --backend cuda --warmup 5 --iters 30 --check-rows 8 --dtypes bf16 \
        --dims $d --seqs $seqs --masks $masks --tokens 16384 --model-dim 2048 \
        > "$out/attn-$l-d$d-s$i-r$round.jsonl" 2> "$out/attn-$l-d$d-s$i-r$round.log"
    done
  done
  ((round % 2 == 1)) && peers $round
done
python3 - "$out" $(for c in $configs; do label "$c"; done) <<'PY' | tee "$out/summary.txt"
import glob, json, re, sys
out, labels = sys.argv[1], sys.argv[2:]
got = {}
for p in sorted(glob.glob(f"{out}/attn-*.jsonl") + glob.glob(f"{out}/peers-*.jsonl")):
    name = p.split("/")[-1]
    l = re.match(r"attn-(.+)-d\d+-s\d+-r\d+\.jsonl", name).group(1) if name.startswith("attn-") else None
    for line in open(p):
        r = json.loads(line)
        if "gflops" in r:
            key = (r["head_dim"], r["seq"], "causal" if r["causal"] else "none")
            got.setdefault(key, {}).setdefault(l or r["impl"], []).append(r["gflops"] / 1e3)
labels += sorted({l for row in got.values() for l in row if l.startswith("sdpa-")})
mean = lambda xs: sum(xs) / len(xs)
ref = "sdpa-cudnn" if "sdpa-cudnn" in labels else labels[0]
print("D S mask | " + " | ".join(labels) + f" | ratios to {ref} (means of the rounds, TFLOP/s per round)")
for k in sorted(got):
    row = got[k]
    cells = " | ".join(" / ".join(f"{x:.1f}" for x in row.get(l, [])) for l in labels)
    ratios = " ".join(f"{l} {mean(row[l]) / mean(row[ref]):.3f}" if l in row and ref in row else "-"
                      for l in labels if l != ref)
    print(f"{k[0]} {k[1]} {k[2]} | {cells} | {ratios}")
PY
tar -czf "$final/knobs.tgz" -C "$final" knobs
