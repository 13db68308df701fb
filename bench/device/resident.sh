#!/usr/bin/env bash
# On the lent GPU machine: issue 32's device-resident CUDA calls. The GPU tests of
# crates/attn-cuda/tests/resident.rs (host-path bits for both families, 8 threads x 2 streams,
# no device memory per call, the raw entry, typed errors), once more under compute-sanitizer's
# memcheck; attn verify's full grid through the device API (`--resident`) next to the host-copy
# path; and the overhead example (bare kernel against a call through the device API, host time
# per call). Expects `cargo xtask bundle` output in .device/. Writes $OUT/summary.txt and
# $OUT/overhead.jsonl.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_REQUIRE_CUDA=on
bin=.device/bin
{
  cat .device/COMMIT; echo
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "== tests/resident.rs"
  timeout 300 $bin/test-cuda-resident --test-threads 1 2>&1 | grep -E "^test |test result|panicked|SKIPPED"
  echo "== the same under compute-sanitizer memcheck (the raw entry and the bad calls)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $bin/test-cuda-resident --test-threads 1 \
    the_raw_entry bad_calls 2>&1 | grep -E "ERROR SUMMARY|test result|panicked"
  echo "== attn verify --backend cuda --resident (full grid)"
  timeout 300 $bin/attn verify --backend cuda --resident 2>&1 | tail -4
  echo "== overhead (bf16, D=128, causal and not)"
  timeout 300 $bin/resident_overhead > "$out/overhead.jsonl" 2> "$out/overhead.err"; echo "exit $?"
  cat "$out/overhead.jsonl"; tail -3 "$out/overhead.err"
} 2>&1 | tee "$out/summary.txt"
