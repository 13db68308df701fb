#!/usr/bin/env bash
# On the lent GPU machine: settings of the CUDA backward (each an environment assignment of its
# knobs, e.g. the Hopper form ATTN_CUDA_SM90_BWD=red:2:40 or ATTN_CUDA_BWD_DQ_COPIES=4, or several
# joined by commas: ATTN_CUDA_SM90_BWD=planes:2:40,ATTN_CUDA_BWD_DQ_COPIES=4; BIN=.device/base runs
# the binaries `ATTN_BASE=<commit> cargo xtask bundle-base` built at another commit) timed against
# each other in one run. (a) each setting's gradients verified (`attn verify --grad --quick`, the
# modes timed); (b) backward_bench under every setting in turn, ROUNDS rounds (the settings
# interleaved), and PyTorch SDPA's backward once on the same shapes (PEERS=1);
# bench/device/backward_ab_report.py prints each row's median TFLOP/s by setting and mode.
# Usage: `cargo xtask bundle` here, then on the GPU machine (carry .device)
# `SETTINGS="A=x A=y" bash bench/device/backward-ab.sh`; MODES (both, default or deterministic;
# default both), DIMS (default 64,128), MAX_SEQ (default 16384), MIN_SEQ (default 1024; a base
# bundled before it times every length), ITERS (default 10), ROUNDS (default 1), PEERS (default 1),
# BUDGET_S (default 420: no bench or peer run starts past it, so that the call ends with its report
# inside the device's 600 s).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
source bench/device/clocks.sh  # the GPU's clocks during the timings: $out/clocks.csv
bin=.device/bin
settings=${SETTINGS:?a list of environment assignments, e.g. ATTN_CUDA_SM90_BWD=red:2:40}
modes=${MODES:-both}
dims=${DIMS:-64,128}
max_seq=${MAX_SEQ:-16384}
min_seq=${MIN_SEQ:-1024}
iters=${ITERS:-10}
rounds=${ROUNDS:-1}
budget=${BUDGET_S:-420}
late() { (( SECONDS > budget )) && echo "== skipped past BUDGET_S=$budget s: $1"; }
# The binaries' folder a setting names (BIN=...), or the bundle's.
bin_of() { local b=$bin a; for a in ${1//,/ }; do [[ $a == BIN=* ]] && b=${a#BIN=}; done; echo "$b"; }
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total,power.limit --format=csv,noheader
  echo "commit: $(cat .device/COMMIT 2>/dev/null)$([[ -f .device/base/COMMIT ]] && echo ", base $(cat .device/base/COMMIT)")"
  for setting in $settings; do
    for det in "" --deterministic; do
      [[ $modes == default && -n $det ]] && continue
      [[ $modes == deterministic && -z $det ]] && continue
      echo "== $setting: attn verify --grad --quick --backend cuda $det"
      env ${setting//,/ } timeout 120 "$(bin_of "$setting")/attn" verify --grad --quick --backend cuda $det 2>&1 | tail -1
    done
  done
  clocks_start "$out/clocks.csv"
  for round in $(seq "$rounds"); do
    for setting in $settings; do
      late "round $round of $setting" && continue
      echo "== round $round: $setting"
      env ${setting//,/ } timeout 200 "$(bin_of "$setting")/backward_bench" "$iters" "$max_seq" "$dims" "$modes" "$min_seq" \
        | sed "s|^{|{\"setting\": \"$setting\", \"round\": $round, |" | tee -a "$out/attn.jsonl"
    done
  done
  if [[ ${PEERS:-1} == 1 ]] && ! late "the peers"; then
    echo "== torch"
    timeout 200 python3 bench/peers/torch_sdpa_backward.py --iters "$iters" --max-seq "$max_seq" --dims "$dims" | tee -a "$out/torch.jsonl"
  fi
  clocks_stop
  python3 bench/device/backward_ab_report.py "$out"
} 2>&1 | tee "$out/log.txt"
