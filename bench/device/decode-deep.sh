#!/usr/bin/env bash
# On the lent H100: the decode family's ring depth on the bandwidth-bound rows (issue 33). Each
# tile setting (ATTN_CUDA_DECODE_TILES: keys per chunk, stages, the L2 hint) times the rows of
# decode-deep-rows.txt in one decode_bench process (CUDA-event medians of 50 calls, each behind
# an untimed twin), the settings interleaved over 3 rounds, with PyTorch SDPA cuDNN and the
# read roofline (torch.sum) once per round. Expects decode_bench and attn in bin/ next to this
# script (or .device/bin/); the setting `base` times $BASE, another build's decode_bench. A
# setting `<tiles>+<persist>` also sets ATTN_CUDA_DECODE_PERSIST (e.g. `32:3+on`, `default+off`).
# Writes $OUT/deep.jsonl, $OUT/sdpa-r*.jsonl and prints medians.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$here/bin; [[ -d $bin ]] || bin=.device/bin
peer=$here/torch_sdpa_decode.py; [[ -f $peer ]] || peer=bench/peers/torch_sdpa_decode.py
rows=$here/decode-deep-rows.txt
grep -v '^#' "$rows" | awk '$6 == 128' > /tmp/rows128.txt
grep -v '^#' "$rows" | awk '$6 == 64' > /tmp/rows64.txt
d128=(${D128:-default 32:3:l2 16:6:l2 16:4:l2})
d64=(${D64:-default 32:4:l2 32:6:l2 64:3:l2})
# A setting `base` runs $BASE (another build's decode_bench, e.g. the commit before a kernel
# change) with its default tiles.
run() {  # $1 setting, $2 rows, $3 timeout, $4 round
  local t=${1%%+*} b=$bin/decode_bench label=$1 persist=
  [[ $1 == *+* ]] && persist=${1#*+}
  [[ $t == default ]] && t=
  [[ $t == base ]] && t= && b=${BASE:?BASE: the other build\'s decode_bench}
  ATTN_CUDA_DECODE_PERSIST=$persist ATTN_CUDA_DECODE_TILES=$t timeout "$3" "$b" "$2" 50 2>&1 |
    sed "s/^{/{\"tiles\":\"$label\",\"round\":$4,/" | tee -a "$out/deep.jsonl" | grep -v '^{' | head -3
}
for round in 1 2 3; do
  for t in "${d128[@]}"; do run "$t" /tmp/rows128.txt 90 $round; done
  for t in "${d64[@]}"; do run "$t" /tmp/rows64.txt 60 $round; done
  timeout 90 python3 "$peer" "$rows" --iters 50 --backends cudnn --roofline-gib 4 > "$out/sdpa-r$round.jsonl"
done
python3 - "$out" <<'PY'
import json, sys, statistics, glob
out = sys.argv[1]
t, cu, roof = {}, {}, []
for l in open(out + "/deep.jsonl"):
    if not l.startswith("{"): continue
    r = json.loads(l); k = (r["batch"], r["heads_kv"], r["seq_q"], r["seq_k"], r["head_dim"])
    t.setdefault(k, {}).setdefault(r["tiles"], []).append((r["us"], r["kv_gbps"], r["kernel"], r["split"][:14]))
for f in sorted(glob.glob(out + "/sdpa-r*.jsonl")):
    for l in open(f):
        r = json.loads(l)
        if r.get("roofline") == "sum": roof.append(r["gbps"]); continue
        if "cudnn" not in r: continue
        k = (r["batch"], r["heads_kv"], r["seq_q"], r["seq_k"], r["head_dim"]); cu.setdefault(k, []).append(r["cudnn"]["us"])
rf = statistics.median(roof) if roof else float("nan")
print("read roofline (torch.sum) GB/s:", roof)
for k, x in t.items():
    c = statistics.median(cu[k]) if k in cu else float("nan")
    line = []
    for tiles, v in x.items():
        us = statistics.median(a[0] for a in v); gb = statistics.median(a[1] for a in v)
        line.append(f"{tiles} {us:.1f}us {gb/rf:.3f}roof x{c/us:.3f} {v[0][2][-12:]} {v[0][3]}")
    print(k, f"cudnn {c:.1f}us", " | ".join(line))
PY
