#!/usr/bin/env bash
# On the lent H100, in one call: which key tiles serve ALiBi best on the Hopper family, where the
# default tiles (those of the same problem without a bias) leave ALiBi more than 5% slower than
# no bias. For each row (bf16, batch·S = 16384, heads 2048/D, as hopper-alibi-reverse.sh's),
# `attn run --json` without a bias on the default tiles, with ALiBi on the default tiles and with
# ALiBi on each candidate (ATTN_CUDA_SM90_TILES=keys:stages:consumers), ROUNDS rounds (default 2;
# the candidates' order reversed each round); CUDA-event medians of ITERS calls (default 30).
# Expects `cargo xtask bundle` output in .device/. Writes $OUT/rows.jsonl and
# $OUT/h100-hopper-alibi-tiles.json (per row and tiles: the median over rounds, and the time
# against no bias).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
a=.device/bin/attn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat .device/COMMIT; echo
# head dim, S, mask flag, candidate tiles
rows=${ROWS:-"128 4096 causal 128:2:2,112:2:2,96:2:2,80:3:3
128 4096 none 112:2:2,96:2:2,144:2:2,64:3:3
128 16384 none 128:2:2,112:2:2,160:2:2
64 4096 none 128:2:3,96:3:3,64:4:3,128:2:2
64 16384 none 128:2:3,96:3:3,64:4:3"}
for round in $(seq 1 ${ROUNDS:-2}); do
  while read -r d s mask cands; do
    [[ -z $d ]] && continue
    flags="--backend cuda -b $((16384 / s)) --heads $((2048 / d)) -d $d --seq $s --iters ${ITERS:-30} --warmup 30 --check-rows 4 --json"
    [[ $mask == none ]] && flags="$flags --no-causal"
    list="none:default alibi:default"
    for t in ${cands//,/ }; do list="$list alibi:$t"; done
    (( round % 2 == 0 )) && list=$(echo $list | tr ' ' '\n' | tac | tr '\n' ' ')
    for item in $list; do
      bias=${item%%:*}; tiles=${item#*:}
      extra=""; [[ $bias == alibi ]] && extra="--alibi"
      if [[ $tiles == default ]]; then env=""; else env="ATTN_CUDA_SM90_TILES=$tiles"; fi
      env $env timeout 60 $a run $flags $extra 2>&1 | python3 -c '
import json,sys
t=sys.stdin.read(); r={"d":int(sys.argv[1]),"s":int(sys.argv[2]),"mask":sys.argv[3],"bias":sys.argv[4],"tiles":sys.argv[5],"round":int(sys.argv[6])}
try:
    x=json.loads(t[t.index("{"):]); r.update(kernel=x["plan"]["kernel"], ms=x["timing"]["median_s"]*1e3, rel_l2=x["accuracy"]["rel_l2"])
except Exception: r["error"]=t[-300:]
print(json.dumps(r))' $d $s $mask $bias $tiles $round | tee -a "$out/rows.jsonl"
    done
  done <<< "$rows"
done
python3 - "$out" <<'PY'
import json, sys, statistics
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/rows.jsonl")]
t = {}
for r in rows:
    if "ms" in r: t.setdefault((r["d"], r["s"], r["mask"]), {}).setdefault((r["bias"], r["tiles"]), []).append(r)
res = []
for (d, s, mask), x in sorted(t.items()):
    base = statistics.median(r["ms"] for r in x[("none", "default")])
    for (bias, tiles), v in sorted(x.items()):
        ms = statistics.median(r["ms"] for r in v)
        res.append({"head_dim": d, "seq": s, "mask": mask, "bias": bias, "tiles": tiles, "kernel": v[0]["kernel"],
                    "ms": ms, "over_none_default": ms / base, "rounds": len(v), "rel_l2": v[0]["rel_l2"]})
        print(f"d{d} s{s} {mask:6} {bias:5} {tiles:8} {v[0]['kernel']:55} {ms:.4f} ms  x{ms / base:.3f}")
json.dump({"what": "ALiBi on the Hopper family on other key tiles than the default (those without a bias), against no "
                   "bias on the default tiles; bf16, batch*S = 16384, heads 2048/D",
           "timing": "attn run --json, CUDA-event medians of ITERS calls each; median over rounds (candidates' order "
                     "reversed each round)",
           "command": "bash bench/device/hopper-alibi-tiles.sh", "rows": res},
          open(f"{out}/h100-hopper-alibi-tiles.json", "w"), indent=1)
PY
