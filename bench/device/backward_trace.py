#!/usr/bin/env python3
"""Reads the CSVs a traced build of the Hopper backward writes (ATTN_CUDA_SM90_TRACE=<folder>:
crates/attn-cuda/src/backward/run.rs's Workspace::write_trace; the slots are
kernels/flash_bwd_sm90.cu's TraceSlot) and prints, per file: each role's waits as a share of its
time (means over the CTAs) and its cycles a step (the MMA warps' own work by phase too, since the
trace has 15 slots); how busy the SMs were over the launch; and, for
the first (kv head, sequence), each key block's start, end and turn waits (the deterministic
mode's chain). Usage: backward_trace.py FOLDER_OR_CSV..."""
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROLES = {0: "mma0", 1: "mma1", 2: "producer", 3: "writer0", 4: "writer1"}
WAITS = {
    "mma": {2: "Q/dO landed", 3: "S product", 4: "dP product", 5: "dS barrier", 6: "dQ product",
            7: "dQ out", 8: "dV/dK products", 10: "(work) S/dP issue", 11: "(work) exponentials",
            12: "(work) packing", 13: "(work) dS stores", 14: "(work) dQ/dK/dV issue"},
    "producer": {2: "free stage"},
    "writer": {2: "turn", 3: "part", 4: "part read", 5: "landed+counted", 6: "(work) fence after the turn",
               7: "(work) adds' issue"},
}


def kind(role):
    return "mma" if role < 2 else "producer" if role == 2 else "writer"


def report(path):
    rows = defaultdict(dict)
    reader = csv.DictReader(open(path))
    slots = sum(1 for name in reader.fieldnames if name.startswith("s"))  # 10 before the MMA work slots
    for r in reader:
        rows[int(r["cta"])][int(r["row"])] = [int(r[f"s{i}"]) for i in range(slots)]
    ctas = {c: r for c, r in rows.items() if 5 in r and r[5][1] > 0}
    print(f"== {path.name}: {len(ctas)} CTAs")
    for role, name in ROLES.items():
        have = [r[role] for r in ctas.values() if role in r and r[role][1] > r[role][0]]
        if not have:
            continue
        total = [x[1] - x[0] for x in have]
        steps = sum(x[9] for x in have)
        shares = ", ".join(
            f"{label} {100 * statistics.mean(x[i] / t for x, t in zip(have, total)):.1f}%"
            for i, label in WAITS[kind(role)].items() if i < slots)
        per_step = sum(total) / steps if steps else float("nan")
        print(f"  {name:9} {per_step:8.0f} cycles a step ({steps} steps): {shares}")
    start = min(r[5][0] for r in ctas.values())
    end = max(r[5][1] for r in ctas.values())
    by_sm = defaultdict(int)
    for r in ctas.values():
        by_sm[r[5][2]] += r[5][1] - r[5][0]
    busy = statistics.mean(v / (end - start) for v in by_sm.values())
    durations = [r[5][1] - r[5][0] for r in ctas.values()]
    print(f"  launch {(end - start) / 1e3:.1f} us on {len(by_sm)} SMs, each busy {100 * busy:.1f}% of it; "
          f"CTA {min(durations) / 1e3:.1f}-{max(durations) / 1e3:.1f} us (mean {statistics.mean(durations) / 1e3:.1f})")
    first = sorted((r[5][3], r) for r in ctas.values() if r[5][4] == 0 and r[5][5] == 0)
    if first:
        print("  kv head 0 of sequence 0: key block, start and end (us from the launch's start), "
              "turn waits of writer 0 (cycles a step)")
        pick = first if len(first) <= 16 else first[:8] + first[-8:]
        for n, r in pick:
            w = r.get(3)
            turn = w[2] / w[9] if w and w[9] else 0
            print(f"    {n:5} {(r[5][0] - start) / 1e3:9.1f} {(r[5][1] - start) / 1e3:9.1f} {turn:9.0f}")


for arg in sys.argv[1:]:
    p = Path(arg)
    for f in sorted(p.glob("backward-*.csv")) if p.is_dir() else [p]:
        report(f)
