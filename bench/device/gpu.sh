#!/usr/bin/env bash
# On the lent GPU machine, in one call: attn verify on CUDA, compute-sanitizer on a small case
# of every variant, our kernel and PyTorch SDPA (cuDNN, flash, efficient) on the standard grid,
# the batch x heads scaling check, and accuracy next to the peers on the same inputs.
# Expects `cargo xtask bundle` output in .device/. Writes under $OUT. Steps can be chosen with
# STEPS="verify sanitize bench scaling accuracy memory" (default: all). RANKS="0 1 2" also verifies and
# benchmarks the lower-ranked tile configurations of each head dim (ATTN_CUDA_RANK), default "0".
set -uo pipefail
# Everything is written under $out/gpu/ and packed into $out/gpu.tgz after each step, so that one
# file carries it all back (and a step cut short by a time limit keeps the ones before it).
final=${OUT:-/tmp/out}; out=$final/gpu; mkdir -p "$out"
pack() { echo "step $1 done at ${SECONDS}s" >> "$out/steps.txt"; tar -czf "$final/gpu.tgz" -C "$final" gpu; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# This script measures the Ampere/Ada family, which the backend no longer picks on sm_90 by
# itself (bench/device/hopper.sh measures the Hopper family).
export ATTN_CUDA_FAMILY=${ATTN_CUDA_FAMILY:-ampere}
attn=.device/bin/attn
steps=${STEPS:-verify sanitize bench scaling accuracy memory}
ranks=${RANKS:-0}
GRID=(--dtypes ${DTYPES:-bf16,f16} --dims ${DIMS:-64,128,256} --seqs ${SEQS:-512,1024,2048,4096,8192,16384}
      --masks none,causal --tokens 16384 --model-dim 2048)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
$attn backends | tee -a "$out/gpu.txt"
has() { [[ " $steps " == *" $1 "* ]]; }

if has verify; then
  for rank in $ranks; do
    echo "== verify (cuda, tile rank $rank)"
    ATTN_CUDA_RANK=$rank timeout 300 $attn verify --backend cuda --json > "$out/verify-cuda-r$rank.json" 2> "$out/verify-cuda-r$rank.log"
    echo "verify exit $?"; python3 -c "import json; print(json.load(open('$out/verify-cuda-r$rank.json'))['verdict'])" 2>/dev/null || tail -5 "$out/verify-cuda-r$rank.log"
  done
fi
pack verify
if has sanitize; then
  echo "== compute-sanitizer (memcheck, racecheck) on every variant, small cases"
  : > "$out/sanitizer.log"
  for dt in ${SAN_DTYPES:-bf16 f16}; do for d in 32 64 96 128 256; do for c in "" --no-causal; do
    for tool in memcheck racecheck; do
      r=$(timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $attn run --backend cuda --dtype $dt -d $d \
          --seq 150 --heads 2 --batch 1 $c --iters 1 --warmup 0 --check-rows 4 --json 2>&1 | tail -3 | tr '\n' ' ')
      echo "$tool $dt d$d ${c:-causal}: exit $? $(echo "$r" | grep -o 'ERROR SUMMARY: [0-9]* error[s]*')" | tee -a "$out/sanitizer.log"
    done
  done; done; done
fi
pack sanitize
if has bench; then
  for rank in $ranks; do
    echo "== bench: attn cuda (tile rank $rank)"
    ATTN_CUDA_RANK=$rank $attn bench --backend cuda "${GRID[@]}" --warmup 5 --iters 30 --check-rows 16 \
      > "$out/attn-cuda-r$rank.jsonl" 2> "$out/attn-cuda-r$rank.log"
    tail -3 "$out/attn-cuda-r$rank.log"
  done
  echo "== bench: pytorch sdpa"
  python3 bench/peers/torch_sdpa_gpu.py "${GRID[@]}" > "$out/sdpa.jsonl" 2> "$out/sdpa.log"
  cat > "$out/meta.json" <<META
{"suite": "gpu", "device": "$(nvidia-smi --query-gpu=name --format=csv,noheader)", "commit": "$(cat .device/COMMIT)",
 "date": "$(date -u +%FT%TZ)", "command": "STEPS=\"$steps\" RANKS=\"$ranks\" DTYPES=${DTYPES:-bf16,f16} DIMS=${DIMS:-64,128,256} SEQS=${SEQS:-512,1024,2048,4096,8192,16384} bash bench/device/gpu.sh",
 "torch": "$(python3 -c 'import torch; print(torch.__version__, torch.backends.cudnn.version())')"}
META
  for rank in $ranks; do
    python3 bench/report.py --unit TFLOP/s --ours "$out/attn-cuda-r$rank.jsonl" --peer "$out/sdpa.jsonl" --meta "$out/meta.json" \
      --out "$out/gpu-results-r$rank.json" > "$out/gpu-table-r$rank.md"
    echo "-- tile rank $rank"; cat "$out/gpu-table-r$rank.md"
  done
fi
pack bench
if has scaling; then
  echo "== scaling: time must grow no faster than batch x heads"
  for bh in "1 8" "4 16" "8 16"; do set -- $bh
    $attn bench --backend cuda --dtypes bf16 --dims 64 --seqs 512 --masks none --batch $1 --heads $2 --iters 50 --check-rows 4 2>/dev/null
  done > "$out/scaling.jsonl"
  python3 - "$out/scaling.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = rows[0]
for r in rows:
    work = r["batch"] * r["heads"] / (base["batch"] * base["heads"])
    t = r["median_ms"] / base["median_ms"]
    print(f"B={r['batch']} H={r['heads']}: work x{work:.0f}, time x{t:.2f} ({r['median_ms']:.3f} ms)")
PY
fi
pack scaling

if has memory; then
  echo "== device memory per call at S=16384 (cuMemGetInfo around the allocations, fresh process)"
  for d in 64 128; do
    $attn bench --backend cuda --dtypes bf16 --dims $d --seqs 16384 --masks causal --tokens 16384 --model-dim 2048 \
      --iters 3 --warmup 1 --check-rows 4 2>/dev/null
  done > "$out/memory.jsonl"
  python3 - "$out/memory.jsonl" <<'PY' | tee "$out/memory.txt"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    tensors = 4 * r["batch"] * r["heads"] * r["seq"] * r["head_dim"] * 2  # q, k, v, o in 16 bits
    print(f"B={r['batch']} H={r['heads']} S={r['seq']} D={r['head_dim']}: measured {r['device_bytes']} B, "
          f"q+k+v+o {tensors} B, ratio {r['device_bytes'] / tensors:.3f} (S x S scores would be "
          f"{r['batch'] * r['heads'] * r['seq'] ** 2 * 4} B)")
PY
fi
pack memory
if has accuracy; then
  echo "== accuracy next to the peers, same inputs"
  for s in 1024 4096; do
    $attn bench --backend cuda --dtypes bf16,f16 --dims 64,128 --seqs $s --masks none,causal --tokens 16384 --model-dim 2048 \
      --iters 1 --warmup 0 --check-rows 1 --dump /tmp/dump > /dev/null 2>&1
  done
  python3 bench/peers/accuracy_gpu.py /tmp/dump > "$out/accuracy.jsonl" 2> "$out/accuracy.log"; cat "$out/accuracy.log"
fi
pack accuracy
