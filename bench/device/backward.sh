#!/usr/bin/env bash
# On the lent GPU machine: issue 34's backward. (a) verify: `attn verify --grad` on cuda (quick and
# full gradient grids, default and deterministic modes) and compute-sanitizer (memcheck,
# racecheck, synccheck) on the gradient grid's standard and varlen families (every variant);
# (b) bench: attn's backward
# (crates/attn-cuda/examples/backward_bench.rs, both modes, and the 10-run determinism check)
# and PyTorch SDPA's backward (bench/peers/torch_sdpa_backward.py, cuDNN and flash) on the same
# shapes, in two alternating rounds, then bench/device/backward_report.py writes
# $OUT/$NAME.json (NAME default h200-backward); (c) ncu: one main-pass launch's throughput,
# occupancy, warp states and stall sources a head dim (NCU_DIMS), and the three launches' times;
# (d) accuracy: attn's gradients
# and PyTorch's against fp64 on the same inputs (crates/attn/examples/backward_dump.rs,
# bench/peers/accuracy_backward.py).
# Usage: `cargo xtask bundle` here, then on the GPU machine (carry .device)
# `bash bench/device/backward.sh [verify,ncu,accuracy,bench]`; MAX_SEQ (default 16384), ITERS (default 20),
# DIMS (the bench's head dims, default 64,128; 256 too), ROUNDS (default 2), SAN_SETTINGS (the
# sanitizers' settings, default the default ones), SAN_MODES (the sanitizers' modes: both, the
# default or deterministic; default both).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
source bench/device/clocks.sh  # the GPU's clocks during the timings: $out/clocks.csv
bin=.device/bin
parts=${1:-verify,bench}
max_seq=${MAX_SEQ:-16384}
iters=${ITERS:-20}
dims=${DIMS:-64,128}
rounds=${ROUNDS:-2}
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,power.limit --format=csv,noheader
  echo "commit: $(cat .device/COMMIT 2>/dev/null)"
  if [[ $parts == *verify* ]]; then
    echo "== attn verify --grad --quick --backend cuda"
    timeout 120 "$bin/attn" verify --grad --quick --backend cuda 2>&1 | tail -4
    echo "== attn verify --grad --quick --backend cuda --deterministic"
    timeout 120 "$bin/attn" verify --grad --quick --backend cuda --deterministic 2>&1 | tail -4
    echo "== the same on the Ampere/Ada family's main pass (ATTN_CUDA_FAMILY=ampere; sm_90 runs the Hopper one)"
    ATTN_CUDA_FAMILY=ampere timeout 120 "$bin/attn" verify --grad --quick --backend cuda 2>&1 | tail -1
    ATTN_CUDA_FAMILY=ampere timeout 120 "$bin/attn" verify --grad --quick --backend cuda --deterministic 2>&1 | tail -1
    echo "== attn verify --grad --backend cuda (full grid)"
    timeout 240 "$bin/attn" verify --grad --backend cuda --json > "$out/verify-grad-full.json" 2> "$out/verify-grad-full.err"
    python3 -c "import json,sys; d=json.load(open('$out/verify-grad-full.json')); print(d['verdict']); [print('FAIL', r['case'], r['outcome'].get('reason')) for r in d['results'] if r['outcome']['status']=='fail']"
    echo "== attn verify --grad --backend cuda --deterministic (full grid)"
    timeout 240 "$bin/attn" verify --grad --backend cuda --deterministic 2>&1 | tail -1
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    # Every variant: the quick grid's standard family (D=64, f16 and bf16), the full grid's
    # varlen family (D=128 and 64, f16 and bf16, every feature at once) and the head-dims family
    # (D=256).
    # SAN_SETTINGS: environment assignments to run the sanitizers under, one after another (e.g.
    # the Hopper forms and dQ copies: ATTN_CUDA_SM90_BWD=red:3:24 ATTN_CUDA_BWD_DQ_COPIES=4;
    # several at once joined by commas).
    for setting in ${SAN_SETTINGS:-ATTN_CUDA_BWD_DQ_COPIES=1}; do
      for tool in memcheck racecheck synccheck; do
        for det in "" --deterministic; do
          [[ ${SAN_MODES:-both} == default && -n $det ]] && continue
          [[ ${SAN_MODES:-both} == deterministic && -z $det ]] && continue
          echo "== $setting: compute-sanitizer $tool $det (gradient grid: standard, varlen and head-dims families)"
          env ${setting//,/ } timeout 180 "$san" --tool $tool --error-exitcode 3 "$bin/attn" verify --grad --backend cuda \
            --family standard --family varlen --family head-dims $det 2>&1 | grep -E "SUMMARY|verdict" | tail -2
        done
      done
    done
  fi
  if [[ $parts == *accuracy* ]]; then
    echo "== accuracy: attn's gradients and SDPA's (cuDNN, flash) against fp64, same inputs"
    dump=/tmp/grad-dump; rm -rf "$dump"  # not under \$OUT: the inputs are large
    timeout 120 "$bin/backward_dump" "$dump" 2>&1 | tail -1
    timeout 200 python3 bench/peers/accuracy_backward.py "$dump" > "$out/accuracy.jsonl"
  fi
  if [[ $parts == *ncu* ]]; then
    # NCU_DIMS (default 128): the first main-pass launch of each head dim (S=1024, batch 16, 2048/D
    # heads, no mask); its pipes, shared memory (bank conflicts included), warp states, scheduler
    # and the SASS lines the warps stall at most (SourceCounters).
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for d in $(echo "${NCU_DIMS:-128}" | tr , ' '); do
      echo "== ncu: the first main-pass launch at D=$d, S=1024 (no mask)"
      timeout 200 "$ncu" -k "regex:^attn_bwd(_sm90)?$" -c 1 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section SourceCounters \
        "$bin/backward_bench" 1 1024 "$d" default 2>&1 | grep -vE '^\{' | tail -150 | tee "$out/ncu-d$d.txt"
      # And the time and DRAM throughput of each of the three launches (pre-pass, main, conversion):
      # at S=1k the row passes are a tenth of the backward by the bytes they move.
      echo "== ncu: the three launches' times at D=$d, S=1024 (no mask)"
      timeout 120 "$ncu" -k "regex:^attn_bwd" -c 3 --metrics gpu__time_duration.sum,dram__bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        "$bin/backward_bench" 1 1024 "$d" default 2>&1 | grep -E "attn_bwd|gpu__time|dram__" | tee "$out/ncu-launches-d$d.txt"
    done
  fi
  if [[ $parts == *bench* ]]; then
    clocks_start "$out/clocks.csv"
    for round in $(seq "$rounds"); do
      echo "== round $round: attn"
      timeout 280 "$bin/backward_bench" "$iters" "$max_seq" "$dims" | tee -a "$out/attn.jsonl"
      echo "== round $round: torch"
      timeout 200 python3 bench/peers/torch_sdpa_backward.py --iters "$iters" --max-seq "$max_seq" --dims "$dims" | tee -a "$out/torch.jsonl"
    done
    clocks_stop
    name=${NAME:-h200-backward}
    python3 bench/device/backward_report.py "$out" "$name" "$(cat .device/COMMIT)" "$parts" > "$out/$name.json"
  fi
} 2>&1 | tee "$out/log.txt"
