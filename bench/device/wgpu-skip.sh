#!/usr/bin/env bash
# On the lent GPU machine, in one call: f32 with the stages that no row sees skipped
# (ATTN_WGPU_SKIP_UNSEEN=1, `Variant::skip_unseen`) against the default, at D=64/128, S=$SEQS
# (1024-8192 causal, 2048 without a mask), in $ROUNDS interleaved rounds; $CONFIGS (as for
# wgpu-explore.sh) replaces the two configurations, $MASKS runs the same sequences for each mask.
# Verifies the full grid with each configuration but the default first (VERIFY=0: not).
# Carry .device and .gl as for wgpu.sh; about 4 minutes at the defaults.
set -u
final=${OUT:-/tmp/out}
source bench/device/vulkan-env.sh
configs=${CONFIGS:-default ATTN_WGPU_SKIP_UNSEEN=1}
mkdir -p "$final/verify"
if [[ ${VERIFY:-1} == 1 ]]; then
  for cfg in $configs; do
    [[ $cfg == default ]] && continue
    tag=$(echo "$cfg" | tr ',=' '-_'); IFS=, read -ra settings <<< "$cfg"
    env "${settings[@]}" timeout 120 .device/bin/attn verify --backend wgpu > "$final/verify/$tag.txt" 2>&1
    echo "verify $cfg exit $?"; tail -n 1 "$final/verify/$tag.txt"
  done
fi
for round in $(seq 1 "${ROUNDS:-3}"); do
  if [[ -n ${MASKS:-} ]]; then
    OUT="$final/r$round" DTYPES=f32 DIMS=${DIMS:-64,128} SEQS=${SEQS:-2048} MASKS=$MASKS ITERS=10 \
      CONFIGS="$configs" bash bench/device/wgpu-explore.sh | sed "s/^/round $round: /"
    continue
  fi
  OUT="$final/r$round" DTYPES=f32 DIMS=${DIMS:-64,128} SEQS=${SEQS:-1024,2048,4096,8192} MASKS=causal ITERS=10 \
    CONFIGS="$configs" bash bench/device/wgpu-explore.sh | sed "s/^/round $round: /"
  OUT="$final/r$round-none" DTYPES=f32 DIMS=${DIMS:-64,128} SEQS=2048 MASKS=none ITERS=10 \
    CONFIGS="$configs" bash bench/device/wgpu-explore.sh | sed "s/^/round $round: /"
done
cd "$final" && tar -czf skip.tgz verify r* && rm -rf verify r[0-9]*
