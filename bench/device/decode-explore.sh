#!/usr/bin/env bash
# On the lent GPU machine: the decode family's tiles and split counts against each other
# (ATTN_CUDA_DECODE_TILES, ATTN_CUDA_DECODE_SPLITS) on the rows where it trailed cuDNN, with the
# default timed first and last. Bundle as for decode.sh. Prints one JSON line per (setting, row).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$here/bin; [[ -d $bin ]] || bin=.device/bin
rows=$(mktemp)
printf '%s\n' "8 32 8 1 32768 128" "128 32 8 1 4096 128" "1 32 8 1 131072 128" "1 32 32 1 32768 128" \
  "32 32 8 1 4096 64" "1 32 8 1 4096 128" > "$rows"
one=$(mktemp)
for setting in "" ATTN_CUDA_DECODE_TILES=16:3:l2 ATTN_CUDA_DECODE_TILES=16:2 ATTN_CUDA_DECODE_TILES=16:4 \
  ATTN_CUDA_DECODE_TILES=32:2 ATTN_CUDA_DECODE_TILES=32:2:l2 ""; do
  echo "== ${setting:-default}"
  env ${setting:-ATTN_X=1} timeout 60 "$bin/decode_bench" "$rows" 30 | sed "s/^{/{\"setting\": \"${setting:-default}\", /"
done
for spec in "1 32 8 1 131072 128:33" "1 32 8 1 131072 128:66" "1 32 8 1 131072 128:128" "1 32 32 1 32768 128:16" \
  "1 32 32 1 32768 128:33" "8 32 8 1 32768 128:8" "128 32 8 1 4096 128:2" "1 32 8 1 4096 128:16"; do
  echo "${spec%%:*}" > "$one"
  ATTN_CUDA_DECODE_SPLITS=${spec##*:} timeout 30 "$bin/decode_bench" "$one" 30 | sed "s/^{/{\"setting\": \"splits=${spec##*:}\", /"
done
