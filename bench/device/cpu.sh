#!/usr/bin/env bash
# On the lent GPU machine (its CPU cores): attn's CPU path next to PyTorch's fused CPU SDPA, same
# shapes, same thread count. The two alternate for $ROUNDS rounds and each shape is reported at its
# median round, so drift of a shared machine hits both alike. Expects the release `attn` binary in
# .device/bin (made by `cargo xtask bundle`). Writes under $OUT.
set -euo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
grid=(--dtypes ${DTYPES:-f32,bf16} --dims 64,128 --seqs 512,1024,2048,4096 --masks none,causal --batch 1 --heads 16)
{ lscpu; grep -o -E 'avx512[a-z_0-9]*|amx[a-z_0-9]*|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > "$out/cpu.txt"
grep -E "Model name|^CPU\(s\)|L2" "$out/cpu.txt"
.device/bin/attn backends
: > "$out/attn-cpu.jsonl"; : > "$out/torch-cpu.jsonl"
for r in $(seq "$rounds"); do
  echo "round $r"
  .device/bin/attn bench --backend cpu-flash --threads "$threads" "${grid[@]}" >> "$out/attn-cpu.jsonl" 2>/dev/null
  python3 bench/peers/torch_cpu.py --threads "$threads" "${grid[@]}" >> "$out/torch-cpu.jsonl" 2>/dev/null
done
model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
cat > "$out/meta.json" <<META
{"suite": "cpu", "device": "$model, $threads threads (the CPU of the lent H100 machine)",
 "commit": "$(cat .device/COMMIT)", "date": "$(date -u +%FT%TZ)",
 "command": "ROUNDS=$rounds THREADS=$threads DTYPES=${DTYPES:-f32,bf16} bash bench/device/cpu.sh",
 "torch": "$(python3 -c 'import torch; print(torch.__version__)')"}
META
python3 bench/report.py --ours "$out/attn-cpu.jsonl" --peer "$out/torch-cpu.jsonl" --meta "$out/meta.json" \
  --out "$out/cpu-results.json" | tee "$out/cpu-table.md"
