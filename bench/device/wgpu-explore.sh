#!/usr/bin/env bash
# On the lent GPU machine: the wgpu kernel's tuning knobs against each other, bench step only
# (f32 and f16, D=64/128, S=$SEQS). CONFIGS lists key-groups:checks[:chunk] triples: micro-tile
# width (ATTN_WGPU_KEY_GROUPS), naga's run-time checks (ATTN_WGPU_CHECKS) and K/V stage width
# (ATTN_WGPU_CHUNK, optional). One line per shape and configuration; files under $OUT/kg*-*/.
# Carry .device and .gl as for wgpu.sh; about 50 s per configuration at one sequence length.
set -u
for cfg in ${CONFIGS:-"1:bounds" "2:bounds" "2:none" "1:none"}; do
  IFS=: read -r kg checks chunk <<< "$cfg"
  echo "=== key groups $kg, checks $checks, chunk ${chunk:-any}"
  tag=kg$kg-$checks${chunk:+-c$chunk}
  ATTN_WGPU_KEY_GROUPS=$kg ATTN_WGPU_CHECKS=$checks ATTN_WGPU_CHUNK=${chunk:-} OUT=$OUT/$tag STEPS="bench" DTYPES=f32,f16 \
    DIMS=64,128 SEQS=${SEQS:-4096} ITERS=${ITERS:-5} bash bench/device/wgpu.sh > /dev/null 2>&1
  python3 - "$OUT/$tag/wgpu/attn-wgpu.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    mask = "causal" if r["causal"] else "none"
    print(f"{r['dtype']} D={r['head_dim']} S={r['seq']} {mask:<6} {r['gflops'] / 1e3:6.2f} TFLOP/s "
          f"(runs {r['min_ms']:.2f}-{r['max_ms']:.2f} ms) rel_l2 {r['rel_l2']:.1e} {r['kernel']}")
PY
done
