#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32's default shapes with K blocks fetched in groups of
# 8 key quads × 4 dim quads per 32 lanes (ATTN_WGPU_K_FETCH=grouped: a warp's K loads touch 8
# rows instead of 32) against the default, at S=2048/4096/8192, none and causal, after
# `attn verify` (full grid) with the setting. Carry .device and .gl as for wgpu.sh; about 4
# minutes. The setting was removed after its run (924e55f) found it slower.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_K_FETCH=grouped timeout 120 $attn verify --backend wgpu > "$final/verify/grouped.txt" 2>&1
echo "verify K_FETCH=grouped exit $?"; tail -n 1 "$final/verify/grouped.txt"
OUT="$final/seqs" DTYPES=f32 DIMS=64,128 SEQS=2048,4096,8192 CONFIGS="default ATTN_WGPU_K_FETCH=grouped" \
  bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf kfetch.tgz verify seqs && rm -rf verify seqs
