#!/usr/bin/env bash
# On the lent H100, after the issue-33 merges (resident-extras, hopper-alibi, hopper-dims), in one
# call: attn verify's full grid on the host-copy path (default family choice); the quick grid's
# index-array, head-dims and window families through the device-resident calls; the resident
# tests of the index arrays (valid and corrupt) under compute-sanitizer memcheck; then ALiBi on
# the Hopper family with and without the speculative softmax, against no bias, two interleaved
# rounds of `attn bench` (bf16, D=64/128, S=4096/16384, 16384 tokens, heads 2048/D).
# Stage in .device-final/: attn.gz (release attn of the commit checked), attn-nospec.gz (the same
# with hopper-alibi-nospec merged: SPECULATE off under ALiBi), test-cuda-resident.gz (the
# attn-cuda `resident` test binary), COMMIT. Writes $OUT/summary.txt and the bench rows.
set -uo pipefail
dir=.device-final; out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
w=/tmp/final; mkdir -p $w
for f in $dir/*.gz; do b=$(basename "${f%.gz}"); gunzip -c "$f" > $w/$b; chmod +x $w/$b; done
{
echo "commit $(cat $dir/COMMIT)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== verify full grid, host copies, default family (t=${SECONDS})"
ATTN_REQUIRE_CUDA=on timeout 130 $w/attn verify --backend cuda --json > $out/verify-full.json 2> $out/verify-full.err; echo "exit $?"
tail -2 $out/verify-full.err
echo "== verify --resident quick, index-array families + head-dims (t=${SECONDS})"
ATTN_REQUIRE_CUDA=on timeout 45 $w/attn verify --quick --backend cuda --resident --family alibi --family varlen --family paged --family kv-cache --family decode --family head-dims --family window --json > $out/verify-resident.json 2> $out/verify-resident.err; echo "exit $?"
tail -2 $out/verify-resident.err
echo "== resident tests under memcheck (index arrays, corrupt ones, ALiBi on Hopper) (t=${SECONDS})"
ATTN_REQUIRE_CUDA=on timeout 45 compute-sanitizer --tool memcheck --error-exitcode 9 $w/test-cuda-resident --test-threads 1 index_arrays corrupt_index > $out/sanitizer.txt 2>&1; echo "exit $?"
grep -E "ERROR SUMMARY|test result|panicked" $out/sanitizer.txt | head
echo "== resident tests (t=${SECONDS})"
ATTN_REQUIRE_CUDA=on timeout 30 $w/test-cuda-resident --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED" | head
echo "== ALiBi timing (t=${SECONDS})"
} 2>&1 | tee $out/summary.txt
args=(bench --backend cuda --dtypes bf16 --dims 64,128 --seqs 4096,16384 --tokens 16384 --model-dim 2048 --masks none,causal --iters 15 --warmup 3 --min-warmup-ms 100 --check-rows 4)
for round in 1 2; do
  [[ $SECONDS -gt 290 ]] && break
  timeout 40 $w/attn "${args[@]}" > $out/plain-$round.jsonl 2>/dev/null
  timeout 40 $w/attn "${args[@]}" --alibi > $out/alibi-spec-$round.jsonl 2>/dev/null
  timeout 40 $w/attn-nospec "${args[@]}" --alibi > $out/alibi-nospec-$round.jsonl 2>/dev/null
  echo "round $round done t=${SECONDS}" | tee -a $out/summary.txt
done
python3 - $out <<'PY' | tee -a $out/summary.txt
import json, sys, glob, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for f in sorted(glob.glob(f"{out}/*-[12].jsonl")):
    kind = f.rsplit("/",1)[1].rsplit("-",1)[0]
    for l in open(f):
        try: r = json.loads(l)
        except Exception: continue
        t[(kind, r["head_dim"], r["seq"], r["mask"])].append((r["median_ms"], r["kernel"], r["rel_l2"]))
for key in sorted({k[1:] for k in t}):
    p = min(x[0] for x in t[("plain",)+key]) if t[("plain",)+key] else None
    row = [f"D={key[0]} S={key[1]} {key[2]}: plain {p} ms"]
    for kind in ("alibi-spec", "alibi-nospec"):
        v = t[(kind,)+key]
        if v and p:
            m = min(x[0] for x in v)
            row.append(f"{kind} {m} ms ({(m/p-1)*100:+.1f}%) rel_l2 {max(x[2] for x in v):.2e} {v[0][1]}")
    print(" | ".join(row))
PY
python3 - $out <<'PY' >> $out/summary.txt
import json, sys
for name in ("verify-full", "verify-resident"):
    try:
        r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except Exception as e:
        print(name, "unreadable", e); continue
    st = {}
    for x in r["results"]:
        st[x["outcome"]["status"]] = st.get(x["outcome"]["status"], 0) + 1
    print(name, st, "worst", round(max((x["worst_ratio"] for x in r["results"]), default=0), 3),
          [x["case"] for x in r["results"] if x["outcome"]["status"] == "fail"])
PY
echo "total ${SECONDS}s"
