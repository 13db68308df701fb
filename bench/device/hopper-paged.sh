#!/usr/bin/env bash
# On the lent H100, in one call: the Hopper family on a paged KV cache (its `_paged` variants load
# each key tile a TMA box of rows at a time from the pages the block table names; before, paged
# prefill ran on the Ampere/Ada family). (a) attn verify, quick grid: the paged, kv-cache and
# varlen families with the default family choice (Hopper for the prefill rows) and the paged
# family with Ampere/Ada forced; the device-resident quick grid's paged rows; (b)
# compute-sanitizer memcheck on paged prefills at D=64 (pages of 16, causal), 128 (48, no mask),
# 256 (256, causal), racecheck and synccheck on D=128 pages of 16; (c) chunked prefill from a
# cache (`attn run --json`): dense slots with per-sequence key counts (--kv-cache) against pages
# of 16, 64 and 256 keys on Hopper, and pages of 64 on Ampere/Ada, the same key counts
# (--varlen), 2 interleaved rounds; (d) the full grid's paged family; PARTS=d64: D=64's paged
# chunked prefill on its default 112-key tiles against 64- and 128-key tiles (ATTN_CUDA_SM90_TILES),
# writing paged-d64.jsonl (h100-hopper-paged-d64.json). The other variants' PTX is
# what it was (checked here with the cubin example), so no A/B of them. Expects `cargo xtask
# bundle` output in .device/. Writes verify JSON and paged.jsonl under $OUT
# (bench/results/h100-hopper-paged.json keeps what they show).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
a=.device/bin/attn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat .device/COMMIT; echo
parts=${PARTS:-verify,sanitize,time,full}

# `attn run --json`'s output on stdin -> one JSON object: kernel, time, speed, error.
run_row() {
  python3 -c '
import json,sys
t=sys.stdin.read()
try:
    d=json.loads(t[t.index("{"):]); m=d["timing"]; a=d["accuracy"]
    print(json.dumps({"kernel":d["plan"]["kernel"],"median_ms":m["median_s"]*1e3,"gflops":d["gflops"],"rel_l2":a["rel_l2"],"max_abs":a["max_abs"]}))
except Exception: print(json.dumps({"error":t[-300:]}))'
}
v() { local name=$1 t=$2; shift 2; echo "== $name (t=$SECONDS)"; timeout $t $a verify --backend cuda "$@" --json > "$out/$name.json" 2> "$out/$name.err"; echo "exit $?"; tail -2 "$out/$name.err"; }
if [[ $parts == *verify* ]]; then
  v default-quick-paged-kvcache-varlen 100 --quick --family paged --family kv-cache --family varlen
  ATTN_CUDA_FAMILY=ampere v ampere-quick-paged 60 --quick --family paged
  echo "== resident quick paged (t=$SECONDS)"
  timeout 60 $a verify --quick --backend cuda --resident --family paged 2>&1 | tail -1
  $a plan --backend cuda -b 16 --heads 32 --kv-heads 8 -d 128 --seq-q 1024 --seq-k 16384 --varlen 2048 --page-size 16 2>&1 | grep -iE "kernel|paged|family" | head -6
fi

if [[ $parts == *sanitize* ]]; then
  small="--backend cuda -b 4 --heads 8 --kv-heads 2 --seq-q 200 --seq-k 700 --varlen 100 --iters 1 --warmup 0 --check-rows 64 --lse"
  for cfg in "-d 64 --page-size 16" "-d 128 --page-size 48 --no-causal" "-d 256 --page-size 256"; do
    echo "== memcheck: attn run $cfg (t=$SECONDS)"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $a run $small $cfg 2>&1 | grep -E "ERROR SUMMARY|kernel |accuracy|rel_l2|error" | head -4
  done
  for tool in racecheck synccheck; do
    echo "== $tool: attn run -d 128 --page-size 16 (t=$SECONDS)"
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $a run $small -d 128 --page-size 16 2>&1 | grep -E "ERROR SUMMARY|kernel |error" | head -4
  done
fi

if [[ $parts == *time* ]]; then
  echo "== chunked prefill from a cache: dense slots vs pages (t=$SECONDS)"
  for shape in "-b 16 --heads 32 --kv-heads 8 -d 128 --seq-q 1024 --seq-k 16384 --varlen 2048" \
               "-b 16 --heads 32 --kv-heads 8 -d 128 --seq-q 512 --seq-k 8192 --varlen 1024 --no-causal" \
               "-b 8 --heads 16 --kv-heads 16 -d 64 --seq-q 2048 --seq-k 16384 --varlen 4096" \
               "-b 8 --heads 8 --kv-heads 8 -d 256 --seq-q 1024 --seq-k 8192 --varlen 2048"; do
    for round in 1 2; do
      for cfg in "dense:--kv-cache" "page16:--page-size 16" "page64:--page-size 64" "page256:--page-size 256" "ampere-page64:--page-size 64"; do
        name=${cfg%%:*}; flags=${cfg#*:}; fam=""; [[ $name == ampere* ]] && fam=ampere
        [[ $name == ampere* && $round == 2 ]] && continue  # the family before, once
        r=$(ATTN_CUDA_FAMILY=$fam timeout 60 $a run --backend cuda $shape $flags --iters 20 --check-rows 8 --json 2>&1 | run_row)
        echo "{\"shape\":\"$shape\",\"cache\":\"$name\",\"round\":$round,\"run\":$r}" | tee -a "$out/paged.jsonl"
      done
    done
  done
fi

if [[ $parts == *d64* ]]; then
  # D=64's default tiles hold 112 keys, so a paged tile goes in 16-row boxes whatever the page
  # size; tiles of 128 or 64 keys (ATTN_CUDA_SM90_TILES, spill-free as paged builds) take boxes
  # of 64 or 128 rows from pages of 64 or more.
  echo "== D=64 paged: key tiles (t=$SECONDS)"
  for mask in "" "--no-causal"; do
    shape="-b 8 --heads 16 --kv-heads 16 -d 64 --seq-q 2048 --seq-k 16384 --varlen 4096 $mask"
    for round in 1 2; do
      for cfg in "dense::--kv-cache" "page64::--page-size 64" "page64:128:3:2:--page-size 64" "page64:64:4:3:--page-size 64" \
                 "page256:128:3:2:--page-size 256" "page256:64:4:3:--page-size 256" "page16:128:3:2:--page-size 16" "dense:128:3:2:--kv-cache"; do
        name=${cfg%%:*}; rest=${cfg#*:}; flags=${rest##*:}; tiles=${rest%:*}
        r=$(env ${tiles:+ATTN_CUDA_SM90_TILES=$tiles} timeout 60 $a run --backend cuda $shape $flags --iters 20 --check-rows 8 --json 2>&1 | run_row)
        echo "{\"shape\":\"$shape\",\"cache\":\"$name\",\"tiles\":\"${tiles:-default}\",\"round\":$round,\"run\":$r}" | tee -a "$out/paged-d64.jsonl"
      done
    done
  done
fi

if [[ $parts == *full* ]]; then
  v default-full-paged 150 --family paged
fi
echo "(t=$SECONDS)"
