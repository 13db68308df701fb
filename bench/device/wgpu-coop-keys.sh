#!/usr/bin/env bash
# On the lent GPU machine, in one call: the cooperative-matrix kernel with 16-key tiles
# (ATTN_WGPU_COOP_KEYS=16: 1.5 KiB of workgroup memory per 16 rows instead of 3, so twice the
# subgroups fit in the 48 KiB per SM the driver keeps resident) with 16, 32 and 64 rows, against
# the default (16 rows, 32-key tiles), f16 at S=512/4096, D=64/128; f32 D=64 at S=512/1024 beside
# them. Verifies the full grid with 16-key tiles first. Carry .device and .gl as for wgpu.sh;
# about 6 minutes.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
attn=.device/bin/attn
mkdir -p "$final/verify"
ATTN_WGPU_COOP_KEYS=16 timeout 150 $attn verify --backend wgpu > "$final/verify/keys16.txt" 2>&1
echo "verify COOP_KEYS=16 exit $?"; tail -n 1 "$final/verify/keys16.txt"
OUT="$final/f16" DTYPES=f16 DIMS=64,128 SEQS=512,4096 CONFIGS="default ATTN_WGPU_COOP_KEYS=16 \
ATTN_WGPU_COOP_KEYS=16,ATTN_WGPU_COOP_ROWS=32 ATTN_WGPU_COOP_KEYS=16,ATTN_WGPU_COOP_ROWS=64" \
  bash bench/device/wgpu-explore.sh
OUT="$final/f32" DTYPES=f32 DIMS=64 SEQS=512,1024 bash bench/device/wgpu-explore.sh
cd "$final" && tar -czf coop-keys.tgz verify f16 f32 && rm -rf verify f16 f32
