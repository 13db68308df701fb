#!/usr/bin/env bash
# On the lent H100: the decode family on packed (varlen) sequences (issue 33). (a) attn verify on
# the quick grid's varlen, paged, kv-cache and decode families through the host-copy and
# device-resident paths, the full grid's varlen family, compute-sanitizer memcheck on the quick
# varlen grid, the resident and append test binaries; (b) decode with packed keys of random
# lengths (`attn run --varlen MIN --seq-q 1`: one query a sequence, keys drawn from MIN..=seq-k),
# causal only with 4 queries, on the decode family (the default) and on the prefill families (ATTN_CUDA_DECODE=off, the
# path these problems took before), ROUNDS (default 3) interleaved rounds of `attn run`
# (CUDA-event medians), both paths in each round.
# Expects bin/attn, bin/test-cuda-resident and bin/test-cuda-append next to this script.
# Writes $OUT/summary.txt and $OUT/runs.txt (one line per run: round, path, row, kernel, time).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$here/bin
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
rows=(
  "-b 16 --heads 32 --kv-heads 8 --seq-q 1 --seq-k 32768 --varlen 16384 -d 128 --no-causal"
  "-b 64 --heads 32 --kv-heads 8 --seq-q 1 --seq-k 4096 --varlen 1024 -d 128 --no-causal"
  "-b 8 --heads 32 --kv-heads 8 --seq-q 4 --seq-k 32768 --varlen 8192 -d 128"
  "-b 8 --heads 32 --kv-heads 32 --seq-q 1 --seq-k 16384 --varlen 4096 -d 128 --no-causal"
  "-b 64 --heads 32 --kv-heads 8 --seq-q 1 --seq-k 8192 --varlen 512 -d 64 --no-causal"
)
{
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
  echo "commit: $(cat "$here/COMMIT" 2>/dev/null)"
  echo "== attn verify --resident --quick: varlen, paged, kv-cache, decode"
  timeout 150 "$bin/attn" verify --backend cuda --resident --quick --family varlen --family paged --family kv-cache \
    --family decode 2>&1 | tail -4
  echo "== attn verify --family varlen (full grid)"
  timeout 150 "$bin/attn" verify --backend cuda --family varlen 2>&1 | tail -3
  echo "== memcheck: quick varlen grid"
  timeout 120 "$san" --tool memcheck --error-exitcode 3 "$bin/attn" verify --quick --backend cuda --family varlen 2>&1 |
    grep -E "ERROR SUMMARY|verdict" | head -3
  for t in resident append; do
    echo "== test-cuda-$t"
    ATTN_REQUIRE_CUDA=on timeout 120 "$bin/test-cuda-$t" --test-threads 1 2>&1 | grep -E "test result|panicked" -A2
  done
  echo "== plan of the first row"
  "$bin/attn" plan --backend cuda ${rows[0]} 2>&1 | head -14
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for i in "${!rows[@]}"; do
      for path in decode prefill; do
        knob=; [[ $path == prefill ]] && knob=off
        line=$(ATTN_CUDA_DECODE=$knob timeout 60 "$bin/attn" run --backend cuda ${rows[$i]} --iters 30 --warmup 3 2>&1)
        kernel=$(echo "$line" | awk '$1 == "kernel" {print $2; exit}')
        ms=$(echo "$line" | awk '$1 == "time" {print $2; exit}')
        acc=$(echo "$line" | awk '$1 == "accuracy" {print $0; exit}' | sed 's/^ *//')
        echo "$round $path $i $kernel $ms | $acc" | tee -a "$out/runs.txt"
      done
    done
  done
  python3 - "$out/runs.txt" "${rows[@]}" <<'PY'
import statistics, sys
runs, rows = {}, sys.argv[2:]
for line in open(sys.argv[1]):
    head = line.split("|")[0].split()
    if len(head) < 5: continue
    rnd, path, i, kernel, ms = head[:5]
    runs.setdefault((int(i), path), []).append((float(ms), kernel))
for i, row in enumerate(rows):
    d, p = runs.get((i, "decode"), []), runs.get((i, "prefill"), [])
    if not d or not p: continue
    md, mp = statistics.median(x[0] for x in d), statistics.median(x[0] for x in p)
    print(f"{row}: decode {md:.3f} ms ({d[0][1]}) | prefill families {mp:.3f} ms ({p[0][1]}) | {mp / md:.2f}x")
PY
} 2>&1 | tee "$out/summary.txt"
