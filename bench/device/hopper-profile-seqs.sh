#!/usr/bin/env bash
# On the lent GPU machine: Nsight Compute on one launch of the Hopper kernel at each of
# several sequence lengths (PROFILE_SEQS, default 4096 16384; D=128 without a mask unless
# PROFILE_D / PROFILE_MASK say otherwise, batch x heads = 16384/S x 2048/D), with the sections
# that say where a launch's time goes: speed of light, compute (tensor pipe) and memory (L2 hit
# rate, L2 and DRAM throughput), warp states. Why does S=4096 run slower per key tile than
# S=16384 when both have 2048 tiles? Expects `cargo xtask bundle` output in .device/ (carry it).
# Writes $OUT/profile-seqs/ (reports, details pages, summary.txt).
set -uo pipefail
out=${OUT:-/tmp/out}/profile-seqs; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export ATTN_CUDA_FAMILY=hopper
attn=.device/bin/attn
d=${PROFILE_D:-128}; c=; [[ ${PROFILE_MASK:-none} == none ]] && c=--no-causal
for seq in ${PROFILE_SEQS:-4096 16384}; do
  for split in ${PROFILE_SPLIT:-on}; do
    name="d$d-s$seq-${PROFILE_MASK:-none}-split-$split"
    ATTN_CUDA_SM90_SPLIT=$split timeout 200 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats -k regex:attn_fwd_sm90 \
      --launch-skip 2 --launch-count 1 -o "$out/$name" $attn run --backend cuda -d $d --seq $seq \
      --batch $((16384 / seq)) --heads $((2048 / d)) $c --iters 3 --warmup 0 --check-rows 8 > "$out/$name.log" 2>&1
    echo "$name: ncu exit $?"
    ncu -i "$out/$name.ncu-rep" --page details > "$out/$name-details.txt" 2>&1
  done
done
# The lines that differ in kind between the runs, side by side.
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import glob, os, re, sys
keys = ["Duration", "SM Frequency", "DRAM Frequency", "Compute (SM) Throughput", "Memory Throughput",
        "L1/TEX Hit Rate", "L2 Hit Rate", "L2 Cache Throughput", "DRAM Throughput", "Executed Ipc Active",
        "Issue Slots Busy", "Warp Cycles Per Issued Instruction", "Max Bandwidth", "Mem Busy",
        "L2 Compression", "Mem Pipes Busy", "SM Busy"]
files = sorted(glob.glob(os.path.join(sys.argv[1], "*-details.txt")))
table = {}
for f in files:
    for line in open(f):
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) >= 3 and any(parts[0].startswith(k) for k in keys):
            table.setdefault(parts[0], {})[os.path.basename(f)[:-12]] = parts[-1] + " " + parts[-2]
names = [os.path.basename(f)[:-12] for f in files]
print("metric".ljust(40) + "".join(n.ljust(34) for n in names))
for k, v in table.items():
    print(k.ljust(40) + "".join(v.get(n, "-").ljust(34) for n in names))
PY
tar -czf "${OUT:-/tmp/out}/profile-seqs.tgz" -C "${OUT:-/tmp/out}" profile-seqs
