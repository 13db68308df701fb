#!/usr/bin/env bash
# On the lent GPU machine: the Hopper backward's forms (ATTN_CUDA_SM90_BWD, backward::Form) timed
# against each other in one run. (a) each form's gradients verified (`attn verify --grad --quick`,
# both modes); (b) backward_bench for every form in turn, ROUNDS rounds (the forms interleaved), and
# PyTorch SDPA's backward once on the same shapes; bench/device/backward_forms_report.py prints each
# row's median TFLOP/s by form and mode.
# Usage: `cargo xtask bundle` here, then on the GPU machine (carry .device)
# `bash bench/device/backward-forms.sh`; FORMS (default `writers:2:40 red:2:40 red:3:24`),
# DIMS (default 64,128), MAX_SEQ (default 16384), ITERS (default 10), ROUNDS (default 1), PEERS (default 1).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=.device/bin
forms=${FORMS:-writers:2:40 red:2:40 red:3:24}
dims=${DIMS:-64,128}
max_seq=${MAX_SEQ:-16384}
iters=${ITERS:-10}
rounds=${ROUNDS:-1}
{
  nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader
  echo "commit: $(cat .device/COMMIT 2>/dev/null)"
  for form in $forms; do
    for det in "" --deterministic; do
      echo "== $form: attn verify --grad --quick --backend cuda $det"
      ATTN_CUDA_SM90_BWD=$form timeout 120 "$bin/attn" verify --grad --quick --backend cuda $det 2>&1 | tail -1
    done
  done
  for round in $(seq "$rounds"); do
    for form in $forms; do
      echo "== round $round: $form"
      ATTN_CUDA_SM90_BWD=$form timeout 200 "$bin/backward_bench" "$iters" "$max_seq" "$dims" \
        | sed "s/^{/{\"form\": \"$form\", \"round\": $round, /" | tee -a "$out/attn.jsonl"
    done
  done
  if [[ ${PEERS:-1} == 1 ]]; then
    echo "== torch"
    timeout 200 python3 bench/peers/torch_sdpa_backward.py --iters "$iters" --max-seq "$max_seq" --dims "$dims" | tee -a "$out/torch.jsonl"
  fi
  python3 bench/device/backward_forms_report.py "$out"
} 2>&1 | tee "$out/log.txt"
