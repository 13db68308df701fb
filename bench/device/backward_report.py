#!/usr/bin/env python3
"""Issue 34's backward timings as one self-describing JSON: reads the attn.jsonl and torch.jsonl
that bench/device/backward.sh writes (rounds appended), takes each contender's median over the
rounds per shape, and gives attn's ratios to PyTorch SDPA's cuDNN and flash (FlashAttention-2)
backwards, the deterministic mode's cost, and the determinism checks; where OUT_DIR/clocks.csv holds
the GPU's samples (bench/device/clocks.sh), each contender's median SM clock and power during the
row, and the reasons the driver gave for holding the clocks down (or'ed).
Usage: backward_report.py OUT_DIR NAME COMMIT [PARTS] > NAME.json (PARTS: what backward.sh ran, as
it was given them; default verify,ncu,bench)
"""
import json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clocks  # noqa: E402

out, name, commit = sys.argv[1], sys.argv[2], sys.argv[3]
parts = sys.argv[4] if len(sys.argv) > 4 else "verify,ncu,bench"
samples = clocks.load(f"{out}/clocks.csv")
runs, states, checks, device = {}, {}, [], None
for f in ("attn.jsonl", "torch.jsonl"):
    for line in open(f"{out}/{f}"):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "determinism" in r:
            checks.append(r)
        elif "tflops" in r:
            device = r.get("device", device)
            runs.setdefault((r["head_dim"], r["seq"], r["causal"]), {}).setdefault(r["impl"], []).append(r["tflops"])
            state = clocks.during(samples, r["t0"], r["t1"]) if "t0" in r else None
            if state:
                states.setdefault((r["head_dim"], r["seq"], r["causal"]), {}).setdefault(r["impl"], []).append(state)
# What the call verified, and ncu's summary of one main-pass launch, as the log has them.
log = []
try:
    keep = ("== ", "verdict", "=========", "Duration", "Memory Throughput", "L1/TEX Cache Throughput",
            "L2 Cache Throughput", "Compute (SM) Throughput", "Issue Slots Busy", "Achieved Occupancy",
            "Theoretical Occupancy", "Warp Cycles Per Issued")
    log = [l.strip() for l in open(f"{out}/log.txt") if l.strip().startswith(keep)
           and not l.startswith("{") and "round" not in l]
except FileNotFoundError:
    pass
rows = []
for (d, s, causal), by in sorted(runs.items()):
    med = {k: statistics.median(v) for k, v in by.items()}
    row = {"head_dim": d, "seq": s, "batch": 16384 // s, "heads": 2048 // d, "causal": causal,
           "tflops": {k: round(v, 1) for k, v in med.items()}}
    a = med.get("attn")
    if a:
        for peer in ("cudnn", "flash"):
            if med.get(peer):
                row[f"attn_over_{peer}"] = round(a / med[peer], 3)
        if med.get("attn-deterministic"):
            row["deterministic_over_default"] = round(med["attn-deterministic"] / a, 3)
    seen = states.get((d, s, causal), {})
    if seen:
        row["gpu"] = {k: {"sm_mhz": statistics.median(x["sm_mhz"] for x in v),
                          "power_w": statistics.median(x["power_w"] for x in v),
                          "clock_reasons": sorted({x["clock_reasons"] for x in v if "clock_reasons" in x})}
                      for k, v in seen.items()}
    rows.append(row)
print(json.dumps({
    "name": name,
    "what": "backward pass (dQ, dK, dV from dO, O, LSE), bf16 BHSD, batch = 16384/S, heads = 2048/D; "
            "TFLOP/s = 2.5 x 4 B H S^2 D / time, halved for causal; attn = the CUDA backward (on sm_90 the "
            "Hopper family's main pass, kernels/flash_bwd_sm90.cu: TMA, wgmma, warp-specialized), its three "
            "launches timed with CUDA events; peers = PyTorch SDPA "
            "torch.autograd.grad through the output (forward excluded); medians over rounds",
    "device": device, "commit": commit,
    "command": f"cargo xtask bundle; bash bench/device/backward.sh {parts} (on the GPU machine)",
    "rows": rows, "determinism": checks, "verification_and_ncu": log,
}, indent=1))
