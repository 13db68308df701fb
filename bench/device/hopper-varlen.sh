#!/usr/bin/env bash
# On the lent H100, in one call: sequences of their own lengths on the Hopper family (ATTN_SEQS).
#   verify    attn verify --backend cuda on the families with sequences and the features they
#             compose with (varlen, kv-cache, alibi, window, softcap), full grid, default family
#             choice (Hopper for varlen prefill on sm_90) and with its device-resident path
#             (--resident: the index arrays in device memory); the resident tests.
#   memcheck  compute-sanitizer memcheck on three small Hopper varlen calls: D=128 causal GQA 4:1
#             with ALiBi, D=64 without a mask, D=256 causal (plans printed, kernels named).
#   bench     bench/device/issue33-prefill.sh with ONLY=varlen: 64 sequences of 128..4096 tokens,
#             D=128, heads 16:16 then 32:8, causal and not, against attn dense at the same token
#             count (Hopper and Ampere/Ada) and SDPA cuDNN on the padded batch.
#   ab        the dense Hopper kernels of the previous commit's attn (.device-old/attn.gz, where
#             carried) against this one's, three interleaved rounds (h100-hopper-seqs-ab.json).
# Expects `cargo xtask bundle` output in .device/. Writes $OUT/summary.txt, $OUT/log.txt and
# $OUT/h100-varlen-prefill.json. STEPS (default "verify bench ab") picks the parts; ONLY the
# prefill script's steps (default "varlen").
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
bin=.device/bin
attn=$bin/attn
families="--family varlen --family kv-cache --family alibi --family window --family softcap"
steps=${STEPS:-verify bench ab}
[[ $steps == *verify* ]] && {
  cat .device/COMMIT; echo
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "== attn verify --backend cuda (default family choice) $families"
  timeout 200 $attn verify --backend cuda $families 2>&1 | tail -4
  echo "== attn verify --backend cuda --resident $families"
  timeout 200 $attn verify --backend cuda --resident $families 2>&1 | grep -E "cuda-resident|passed|failed|FAIL" | tail -6
  echo "== tests/resident.rs"
  timeout 120 $bin/test-cuda-resident --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED"
  for args in "--varlen 40 --alibi -b 5 --seq 300 --heads 8 --kv-heads 2 --head-dim 128" \
              "--varlen 1 -b 4 --seq 400 --heads 4 --head-dim 64 --no-causal" \
              "--varlen 100 -b 3 --seq 350 --heads 4 --kv-heads 2 --head-dim 256"; do
    echo "== memcheck: attn run --backend cuda $args"
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $attn run --backend cuda $args \
      --iters 1 --warmup 0 --check-rows 64 2>&1 | grep -E "ERROR SUMMARY|kernel|accuracy|error" | head -6
  done
} 2>&1 | tee "$out/summary.txt"
if [[ $steps == *bench* ]]; then
  ONLY=${ONLY:-varlen} BUDGET=${BUDGET:-200} bash bench/device/issue33-prefill.sh
  rm -f "$out/h100-head-dims.json"
fi
# The dense Hopper kernels before and after ATTN_SEQS (whose helpers moved their PTX about): the
# previous commit's attn (.device-old/attn.gz, where carried) and this one, rounds interleaved.
if [[ $steps == *ab* && -f .device-old/attn.gz ]]; then
  gunzip -c .device-old/attn.gz > /tmp/attn-old && chmod +x /tmp/attn-old
  flags="bench --backend cuda --dtypes bf16 --iters 20 --dims 64,128,256 --seqs 4096,16384 --tokens 16384 --model-dim 2048 --masks none,causal --check-rows 4"
  for round in 1 2 3; do
    for who in old new; do
      bin=/tmp/attn-old; [[ $who == new ]] && bin=$attn
      timeout 100 $bin $flags 2>/dev/null | grep '^{' | sed "s/^{/{\"who\":\"$who\",\"round\":$round,/" >> "$out/ab-rows.jsonl"
    done
  done
  python3 - "$out" <<'PY'
import json, sys, statistics
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/ab-rows.jsonl")]
table = {}
for r in rows:
    table.setdefault((r["head_dim"], r["seq"], r["mask"]), {}).setdefault(r["who"], []).append(r)
res = []
for (d, s, m), x in sorted(table.items()):
    o = statistics.median(r["median_ms"] for r in x.get("old", []))
    n = statistics.median(r["median_ms"] for r in x.get("new", []))
    res.append({"head_dim": d, "seq": s, "mask": m, "old_ms": o, "new_ms": n, "new_over_old_time": n / o,
                "kernel_new": x["new"][0]["kernel"], "kernel_old": x["old"][0]["kernel"],
                "rounds": len(x["new"]), "rel_l2_new": x["new"][0]["rel_l2"]})
    print(f"d{d} s{s} {m:6s} old {o:.3f} ms new {n:.3f} ms  new/old {n/o:.3f}  {x['new'][0]['kernel']}")
json.dump({"what": "dense Hopper kernels before (76a37de) and after the sequence variants (ATTN_SEQS), same call, "
                   "3 interleaved rounds, median of the rounds' CUDA-event medians (attn bench, 20 calls each)",
           "rows": res}, open(f"{out}/h100-hopper-seqs-ab.json", "w"), indent=1)
PY
fi
