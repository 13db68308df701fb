#!/usr/bin/env bash
# On the lent GPU machine: the SM clock and power while one shape runs for seconds on end, to
# tell a kernel that loses cycles from one that runs at a lower clock. The Hopper kernel,
# bf16 D=SUSTAIN_DIM (default 128) with mask SUSTAIN_MASK (default none), at each of
# SUSTAIN_SEQS (default 4096 16384), each for about
# 3 s of back-to-back calls (attn bench, the default lead: each timed call behind an untimed
# one), with nvidia-smi sampling clocks and power every 50 ms. Expects `cargo xtask bundle`
# output in .device/ (carry it). Writes $OUT/sustained/ (clocks-S.csv, attn-S.jsonl, summary.txt).
set -uo pipefail
out=${OUT:-/tmp/out}/sustained; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper
attn=.device/bin/attn
for seq in ${SUSTAIN_SEQS:-4096 16384}; do
  iters=$((2000 * 4096 / seq)); ((iters < 200)) && iters=200
  # The inputs and the reference rows first, then the timed calls: the clock log starts with the
  # warm-up (--min-warmup-ms 500) so that it covers the calls only.
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,nounits -lms 50 \
    > "$out/clocks-$seq.csv" 2>&1 &
  smi=$!
  timeout 120 $attn bench --backend cuda --warmup 5 --min-warmup-ms 500 --iters $iters --check-rows 8 --dtypes bf16 \
    --dims ${SUSTAIN_DIM:-128} --seqs $seq --masks ${SUSTAIN_MASK:-none} --tokens 16384 --model-dim 2048 > "$out/attn-$seq.jsonl" 2> "$out/attn-$seq.log"
  kill $smi
done
python3 - "$out" ${SUSTAIN_SEQS:-4096 16384} <<'PY' | tee "$out/summary.txt"
import json, sys
out, seqs = sys.argv[1], sys.argv[2:]
for seq in seqs:
    samples = []
    for line in open(f"{out}/clocks-{seq}.csv"):
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((float(parts[1]), float(parts[2]), parts[3]))
        except (ValueError, IndexError):
            pass
    # Under load: the samples drawing more than 300 W (the rest are the host's preparation).
    busy = [s for s in samples if s[1] > 300]
    row = [json.loads(l) for l in open(f"{out}/attn-{seq}.jsonl")][0]
    mhz = sorted(s[0] for s in busy); watts = sorted(s[1] for s in busy)
    reasons = sorted({s[2] for s in busy})
    mid = lambda xs: xs[len(xs) // 2] if xs else float("nan")
    print(f"S={seq}: {row['gflops'] / 1e3:.1f} TFLOP/s over {row['runs']} calls; {len(busy)} samples under load: "
          f"SM clock median {mid(mhz):.0f} MHz (min {mhz[0] if mhz else 0:.0f}), power median {mid(watts):.0f} W, "
          f"throttle reasons {reasons}")
PY
