#!/usr/bin/env bash
# On the lent GPU machine, in one call: the full wgpu run (wgpu.sh) at this commit, then the
# causal rows at S=2048 and 4096 again with the binary of the commit before it
# (.device/bin/attn-base, copied there by hand from that commit's `cargo xtask bundle`), whose
# causal blocks start longest first within each head rather than across heads. Carry .device
# and .gl as for wgpu.sh; about 9 minutes (timeout_s=600).
set -u
final=${OUT:-/tmp/out}
bash bench/device/wgpu.sh
rm -rf "$final/wgpu"  # packed into wgpu.tgz; only 8 files come back
echo "== causal rows with the previous order (.device/bin/attn-base)"
ATTN_BIN=.device/bin/attn-base OUT="$final/base" STEPS=bench DTYPES=f32,f16 SEQS=2048,4096 MASKS=causal \
  bash bench/device/wgpu.sh > /dev/null 2>&1
python3 - "$final/base/wgpu/attn-wgpu.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"base {r['dtype']} D={r['head_dim']} S={r['seq']} causal {r['gflops'] / 1e3:6.2f} TFLOP/s "
          f"(runs {r['min_ms']:.2f}-{r['max_ms']:.2f} ms) {r['kernel']}")
PY
tar -czf "$final/base.tgz" -C "$final" base && rm -rf "$final/base"
