#!/usr/bin/env bash
# On the lent GPU machine: the wgpu kernel's tuning knobs against each other, bench step only
# (f32 and f16 or $DTYPES, D=64/128 or $DIMS, S=$SEQS). CONFIGS lists configurations, each a comma-separated list of
# knob settings (docs/tuning.md), e.g.
#   CONFIGS="ATTN_WGPU_KEY_GROUPS=1,ATTN_WGPU_CHECKS=bounds ATTN_WGPU_ROW_THREADS=16 default"
# One line per shape and configuration; files under $OUT/<configuration>/.
# Carry .device and .gl as for wgpu.sh; about 60 s per configuration at one sequence length.
set -u
for cfg in ${CONFIGS:-default}; do
  echo "=== $cfg"
  tag=$(echo "$cfg" | tr ',=' '-_')
  settings=(); [[ $cfg != default ]] && IFS=, read -ra settings <<< "$cfg"
  env "${settings[@]}" OUT="$OUT/$tag" STEPS="bench" DTYPES="${DTYPES:-f32,f16}" DIMS="${DIMS:-64,128}" SEQS="${SEQS:-4096}" \
    ITERS="${ITERS:-5}" bash bench/device/wgpu.sh > /dev/null 2>&1
  python3 - "$OUT/$tag/wgpu/attn-wgpu.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    mask = "causal" if r["causal"] else "none"
    print(f"{r['dtype']} D={r['head_dim']} S={r['seq']} {mask:<6} {r['gflops'] / 1e3:6.2f} TFLOP/s "
          f"(runs {r['min_ms']:.2f}-{r['max_ms']:.2f} ms) rel_l2 {r['rel_l2']:.1e} {r['kernel']}")
PY
done
