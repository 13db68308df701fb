#!/usr/bin/env bash
# On the lent GPU machine: how many workgroups the Vulkan driver keeps resident per SM, by
# workgroup memory. fma_peak with one dependent scalar FMA chain per invocation (latency-bound, so the
# time of 132·k workgroups of 64 invocations steps up where k passes the number resident per
# SM), for each size in BYTES. Carry .device and .gl; about a minute. Table on stdout and in
# $OUT/residency.txt.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
source bench/device/vulkan-env.sh
sms=${SMS:-132}
for bytes in ${BYTES:-0 8192 12288 16384 18432 24576 24592 32768 36864 49152}; do
  line="bytes $bytes:"
  for k in 1 2 3 4 5 6 7 8 9 10; do
    ms=$(timeout 60 .device/bin/fma_peak $((sms * k)) "$bytes" 0 64 | sed -n 's/.* \([0-9.]*\) ms each.*/\1/p')
    line="$line k=$k ${ms:-?}"
  done
  echo "$line"
done | tee "$out/residency.txt"
