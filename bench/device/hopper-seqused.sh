#!/usr/bin/env bash
# On the lent H100, in one call: per-sequence key counts (seqused_k) on the Hopper family, whose
# sequence variants clear V's rows past a sequence's keys (clear_v_past_keys), and the Ampere/Ada
# family's barrier before it stages O in a block that walks no key tile. attn verify (kv-cache,
# varlen with the default family; those and window, empty-rows, causal-offset on Ampere/Ada; the
# device-resident quick grid), compute-sanitizer memcheck on two cache prefills (D=128, 256),
# chunked prefill from a cache (`attn run --kv-cache`) on each family in 2 interleaved rounds,
# and packed varlen prefill (`attn bench --varlen 128`) against the attn at .device-old/attn.gz
# (the commit before) in 3 interleaved rounds. Expects `cargo xtask bundle` output in .device/.
# Writes the verify JSON, kvcache-timing.jsonl and varlen-ab.jsonl under $OUT
# (bench/results/h100-hopper-seqused.json keeps them). STEPS=wider (a second call) instead: the
# verify families the two changes touch (Ampere/Ada forced: standard, causal-offset, odd-lengths,
# gqa, head-dims, layouts, alibi, softcap; default: varlen, alibi, softcap, window) and the
# Ampere/Ada family's dense causal kernels against the commit before's, 3 interleaved rounds.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
a=.device/bin/attn; old=/tmp/attn-old
[[ -f .device-old/attn.gz ]] && gunzip -c .device-old/attn.gz > $old && chmod +x $old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat .device/COMMIT; echo
if [[ ${STEPS:-} == wider ]]; then
  v() { local name=$1 t=$2; shift 2; echo "== $name (t=$SECONDS)"; timeout $t $a verify --backend cuda "$@" --json > "$out/$name.json" 2> "$out/$name.err"; echo "exit $?"; tail -1 "$out/$name.err"; }
  ATTN_CUDA_FAMILY=ampere v ampere-core 150 --family standard --family causal-offset --family odd-lengths --family gqa --family head-dims --family layouts --family alibi --family softcap
  v default-seqs-features 150 --family varlen --family alibi --family softcap --family window
  [[ -x $old ]] || exit 0
  for round in 1 2 3; do
    for who in old new; do
      bin=$old; [[ $who == new ]] && bin=$a
      ATTN_CUDA_FAMILY=ampere timeout 80 $bin bench --backend cuda --dtypes bf16 --iters 20 --dims 64,128,256 --seqs 1024,4096,16384 --tokens 16384 --model-dim 2048 --masks causal --check-rows 4 2>/dev/null \
        | grep '^{' | sed "s/^{/{\"who\":\"$who\",\"round\":$round,/" >> "$out/ampere-ab.jsonl"
    done
  done
  exit 0
fi
v() { local name=$1 t=$2; shift 2; echo "== $name (t=$SECONDS)"; timeout $t $a verify --backend cuda "$@" --json > "$out/$name.json" 2> "$out/$name.err"; echo "exit $?"; tail -1 "$out/$name.err"; }
v default-kvcache-varlen 150 --family kv-cache --family varlen
ATTN_CUDA_FAMILY=ampere v ampere-kvcache-varlen-window-empty 150 --family kv-cache --family varlen --family window --family empty-rows --family causal-offset
echo "== resident quick kv-cache varlen (t=$SECONDS)"
timeout 60 $a verify --quick --backend cuda --resident --family kv-cache --family varlen 2>&1 | tail -1
kv="--backend cuda -b 4 --heads 8 --kv-heads 2 --seq-q 200 --seq-k 700 --varlen 100 --kv-cache"
for dd in 128 256; do
  echo "== memcheck: attn run $kv -d $dd (t=$SECONDS)"
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $a run $kv -d $dd --iters 1 --warmup 0 --check-rows 64 2>&1 | grep -E "ERROR SUMMARY|kernel|accuracy|error" | head -4
done
echo "== kv-cache chunked prefill timing: Hopper (default) vs Ampere/Ada (t=$SECONDS)"
for shape in "-b 16 --heads 32 --kv-heads 8 -d 128 --seq-q 1024 --seq-k 16384 --varlen 2048" \
             "-b 16 --heads 32 --kv-heads 8 -d 128 --seq-q 512 --seq-k 8192 --varlen 1024 --no-causal" \
             "-b 8 --heads 16 --kv-heads 16 -d 64 --seq-q 2048 --seq-k 16384 --varlen 4096"; do
  for round in 1 2; do
    for fam in "" ampere; do
      r=$(ATTN_CUDA_FAMILY=$fam timeout 60 $a run --backend cuda $shape --kv-cache --iters 30 --check-rows 32 2>&1 | grep -E "kernel |time |speed|accuracy" | tr -s ' ' | tr '\n' '|')
      echo "{\"shape\":\"$shape\",\"family\":\"${fam:-default}\",\"round\":$round,\"out\":\"$r\"}" | tee -a "$out/kvcache-timing.jsonl"
    done
  done
done
[[ -x $old ]] || { echo "(no .device-old/attn.gz: no A/B)"; exit 0; }
echo "== varlen prefill A/B: the commit before vs this one, 3 rounds (t=$SECONDS)"
for round in 1 2 3; do
  for hk in "16 16" "32 8"; do
    set -- $hk
    for who in old new; do
      bin=$old; [[ $who == new ]] && bin=$a
      timeout 60 $bin bench --backend cuda --dtypes bf16 --heads $1 --kv-heads $2 --dims 128 --masks none,causal --seqs 4096 --batch 64 --varlen 128 --iters 20 --check-rows 4 2>/dev/null \
        | grep '^{' | sed "s/^{/{\"who\":\"$who\",\"round\":$round,\"hq\":$1,/" >> "$out/varlen-ab.jsonl"
    done
  done
done
python3 - "$out" <<'PY'
import json, sys, statistics
rows=[json.loads(l) for l in open(sys.argv[1]+"/varlen-ab.jsonl")]
t={}
for r in rows: t.setdefault((r["hq"], r["mask"]),{}).setdefault(r["who"],[]).append(r["median_ms"])
for k,x in sorted(t.items()):
    o=statistics.median(x.get("old",[0])); n=statistics.median(x.get("new",[0]))
    print(k, "old", x.get("old"), "new", x.get("new"), "new/old %.3f" % (n/o if o else 0))
PY
echo "(t=$SECONDS)"
