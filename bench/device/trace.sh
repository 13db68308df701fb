#!/usr/bin/env bash
# On the lent GPU machine: per-piece timelines of the Hopper kernel (a traced build,
# ATTN_CUDA_SM90_TRACE), next to the same shapes untraced, to see where a CTA's cycles go.
# TRACE_SHAPES "d:seqs:masks ..." (default 64:2048,8192:none 64:2048:causal; a mask is none,
# causal or windowN, the window (N, 0)), bf16, the standard grid's batch and heads (16384 tokens,
# or one sequence where S is longer; model dim 2048). TRACE_CONFIGS "label=VAR=value,VAR=value
# ..." (default: base, the defaults; BIN=<path> runs another binary) runs each shape under each;
# the configurations named in TRACE_VERIFY are first verified (`attn verify`, full grid, and on 3 CTAs). Expects
# `cargo xtask bundle` output in .device/ (carry it). Writes $OUT/trace/ (the CSVs, the runs'
# JSON lines and logs, runs.txt, summary.txt from bench/device/trace.py).
set -uo pipefail
out=${OUT:-/tmp/out}/trace; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper
source bench/device/configs.sh  # label, settings, binary
# A mask of the shapes: none, causal, or windowN (the window (N, 0): N keys back, causal).
mask_args() { [[ $1 == window* ]] && echo "--masks window --window ${1#window},0" || echo "--masks $1"; }
for config in ${TRACE_CONFIGS:-base}; do
  label=$(label "$config")
  if [[ " ${TRACE_VERIFY:-} " == *" $label "* ]]; then
    env $(settings "$config") timeout 200 $(binary "$config") verify --backend cuda --json > "$out/verify-$label.json" 2> "$out/verify-$label.log"
    echo "verify $label (full grid): exit $? $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['verdict'])" "$out/verify-$label.json" 2>&1 | tail -1)"
    env $(settings "$config") ATTN_CUDA_SM90_GRID=3 timeout 200 $(binary "$config") verify --backend cuda --json > "$out/verify-$label-grid3.json" 2> "$out/verify-$label-grid3.log"
    echo "verify $label (full grid, 3 CTAs): exit $? $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['verdict'])" "$out/verify-$label-grid3.json" 2>&1 | tail -1)"
  fi
  for shape in ${TRACE_SHAPES:-64:2048,8192:none 64:2048:causal}; do
    IFS=: read -r d seqs masks <<< "$shape"
    for seq in ${seqs//,/ }; do
      for mask in ${masks//,/ }; do
        tag=$label-d$d-s$seq-$mask
        run() {  # $1: what; the rest: more environment for the run
          local what=$1; shift
          env $(settings "$config") "$@" timeout 120 $(binary "$config") bench --backend cuda --warmup 5 --iters 30 --check-rows 8 \
            --dtypes bf16 --dims $d --seqs $seq $(mask_args "$mask") --tokens $(( seq > 16384 ? seq : 16384 )) --model-dim 2048 \
            > "$out/$what-$tag.jsonl" 2> "$out/$what-$tag.log"
          echo "$what $tag: rc $? $(python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(round(r['gflops']/1e3,1), 'TFLOP/s')" "$out/$what-$tag.jsonl" 2>&1 | tail -1)"
        }
        run plain
        run traced ATTN_CUDA_SM90_TRACE="$out/$tag"
      done
    done
  done
done | tee "$out/runs.txt"
for f in "$out"/*/trace-*.csv; do python3 bench/device/trace.py "$f"; done | tee "$out/summary.txt"
