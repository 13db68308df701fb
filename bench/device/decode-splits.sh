#!/usr/bin/env bash
# On the lent H100: the decode family's split count, the plan's (default) against a forced one
# (ATTN_CUDA_DECODE_SPLITS, the count that fills one CTA per SM where the default filled every
# CTA slot), on seven rows, 3 interleaved rounds (decode_bench: CUDA-event medians of 50 calls).
# Expects `cargo xtask bundle` output in .device/. Writes $OUT/splits.jsonl and prints the ratios.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
b=.device/bin/decode_bench
rows=("1 32 8 1 32768 64:16" "8 32 8 1 32768 64:2" "1 32 8 4 32768 64:16" "1 32 8 16 32768 128:8" "8 32 8 16 4096 128:1" "32 32 8 1 4096 64:1" "16 32 8 1 8192 64:1")
for round in 1 2 3; do
  for r in "${rows[@]}"; do
    echo "${r%%:*}" > /tmp/row.txt
    for s in "" "${r##*:}"; do
      ATTN_CUDA_DECODE_SPLITS=$s timeout 30 $b /tmp/row.txt 50 2>/dev/null | sed "s/^{/{\"forced\":\"${s:-default}\",\"round\":$round,/" >> "$out/splits.jsonl"
    done
  done
done
python3 - "$out" <<'PY'
import json,sys,statistics
t={}
for l in open(sys.argv[1]+"/splits.jsonl"):
    r=json.loads(l); k=(r["batch"],r["seq_q"],r["seq_k"],r["head_dim"])
    t.setdefault(k,{}).setdefault("default" if r["forced"]=="default" else "alt",[]).append((r.get("us") or r.get("median_us"), r.get("split","")[:24]))
for k,x in t.items():
    d=statistics.median(v[0] for v in x["default"]); a=statistics.median(v[0] for v in x["alt"])
    print(k, "default", x["default"][0][1], [v[0] for v in x["default"]], "alt", x["alt"][0][1], [v[0] for v in x["alt"]], "alt/default %.3f" % (a/d))
PY
