#!/usr/bin/env bash
# On the lent H100, in one call: ALiBi on the Hopper family walking each piece's key tiles from
# the block's diagonal back, then on past it (ATTN_DIAGONAL_FIRST, with the speculative softmax),
# against a commit before (forward, without it), and against no bias.
#   verify    the new attn: attn verify --backend cuda --family alibi --family varlen --family
#             window (full grid)
#             and the quick grid; compute-sanitizer memcheck on a causal ALiBi call at D=64 (192-row
#             blocks over 112-key tiles: rows whose diagonal lies past the first tile walked).
#   timing    attn bench, bf16, MASKS (default causal; e.g. none,causal), D=64/128, S=4096/16384,
#             16384 tokens, heads 2048/D, with and without --alibi, old and new binaries, ROUNDS
#             rounds (default 3; the order flipped each round), CUDA-event medians of 20 calls.
# Stage in .device-rev/: attn.gz (this commit's release attn), attn-old.gz (the commit before).
# Writes $OUT/summary.txt, $OUT/rows.jsonl and $OUT/$NAME.json (default h100-hopper-alibi-reverse).
# Also used for later A/Bs of the ALiBi variants: VERIFY=alibi verifies only the alibi family
# (full grid) and skips the quick grid; OLD_NONE=0 skips the old binary without a bias (where the
# two binaries' variants without ALiBi are the same PTX, the new one's stands for both); WHAT and
# NAME describe the JSON.
set -uo pipefail
dir=.device-rev; out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
w=/tmp/rev; mkdir -p $w
for f in $dir/*.gz; do b=$(basename "${f%.gz}"); gunzip -c "$f" > $w/$b; chmod +x $w/$b; done
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  if [[ ${VERIFY:-full} == alibi ]]; then
    echo "== verify full grid: alibi"
    timeout 150 $w/attn verify --backend cuda --family alibi 2>&1 | tail -3
  else
    echo "== verify full grid: alibi, varlen"
    timeout 150 $w/attn verify --backend cuda --family alibi --family varlen --family window 2>&1 | tail -3
    echo "== verify quick grid"
    timeout 90 $w/attn verify --backend cuda --quick 2>&1 | tail -2
  fi
  for mask in "" --no-causal; do
    echo "== memcheck: ALiBi ${mask:---causal}, D=64, S=700, GQA 8:2"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $w/attn run --backend cuda --alibi -b 2 --seq 700 \
      --heads 8 --kv-heads 2 --head-dim 64 $mask --iters 1 --warmup 0 --check-rows 64 2>&1 | grep -E "ERROR SUMMARY|kernel|accuracy|error" | head -5
  done
} 2>&1 | tee "$out/summary.txt"
flags="bench --backend cuda --dtypes bf16 --iters 20 --dims 64,128 --seqs 4096,16384 --tokens 16384 --model-dim 2048 --masks ${MASKS:-causal} --check-rows 4"
for round in $(seq 1 ${ROUNDS:-3}); do
  order="old new"; (( round % 2 == 0 )) && order="new old"
  for who in $order; do
    for bias in alibi none; do
      [[ $who == old && $bias == none && ${OLD_NONE:-1} == 0 ]] && continue
      extra=""; [[ $bias == alibi ]] && extra="--alibi"
      bin=$w/attn; [[ $who == old ]] && bin=$w/attn-old
      timeout 100 $bin $flags $extra 2>/dev/null | grep '^{' \
        | sed "s/^{/{\"who\":\"$who\",\"round\":$round,\"bias\":\"$bias\",/" >> "$out/rows.jsonl"
    done
  done
done
CMD="MASKS=${MASKS:-causal} ROUNDS=${ROUNDS:-3} VERIFY=${VERIFY:-full} OLD_NONE=${OLD_NONE:-1} " \
NAME=${NAME:-h100-hopper-alibi-reverse} WHAT=${WHAT:-} python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, os, sys, statistics
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/rows.jsonl")]
t = {}
for r in rows:
    t.setdefault((r["head_dim"], r["seq"], r["mask"]), {}).setdefault((r["who"], r["bias"]), []).append(r)
res = []
for (d, s, mask), x in sorted(t.items()):
    ms = {k: statistics.median(r["median_ms"] for r in v) for k, v in x.items()}
    ms.setdefault(("old", "none"), ms[("new", "none")])  # OLD_NONE=0: the same kernels
    row = {"head_dim": d, "seq": s, "mask": mask, "ms": {f"{w}_{b}": m for (w, b), m in ms.items()},
           "kernel_new_alibi": x[("new", "alibi")][0]["kernel"], "rel_l2_new_alibi": x[("new", "alibi")][0]["rel_l2"],
           "rounds": len(x[("new", "alibi")]),
           "alibi_slower_new": ms[("new", "alibi")] / ms[("new", "none")] - 1,
           "alibi_slower_old": ms[("old", "alibi")] / ms[("old", "none")] - 1,
           "new_over_old_alibi_time": ms[("new", "alibi")] / ms[("old", "alibi")],
           "new_over_old_none_time": ms[("new", "none")] / ms[("old", "none")]}
    res.append(row)
    print(f"d{d} s{s} {mask}: ALiBi slower than none: new {100*row['alibi_slower_new']:.1f}% old {100*row['alibi_slower_old']:.1f}%;"
          f" new/old alibi {row['new_over_old_alibi_time']:.3f} none {row['new_over_old_none_time']:.3f}")
json.dump({"what": os.environ["WHAT"] or
                   "ALiBi on the Hopper family, key tiles from the block's diagonal back then on past it, with the "
                   "speculative softmax (new), against forward without it (old), each against no bias; bf16, D=64/128, "
                   "S=4096/16384, 16384 tokens, heads 2048/D",
           "timing": "attn bench CUDA-event medians of 20 calls; rounds with the order flipped each round; median of rounds",
           "command": os.environ["CMD"] + "bash bench/device/hopper-alibi-reverse.sh", "rows": res},
          open(f"{out}/{os.environ['NAME']}.json", "w"), indent=1)
PY
