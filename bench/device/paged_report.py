#!/usr/bin/env python3
"""Merges paged.sh's rounds (attn-r*.jsonl from paged_bench, sdpa.jsonl from
torch_sdpa_decode.py, in a folder) into one self-describing JSON on stdout: per row attn's
median time per round and their mean, K/V GB/s, the ratio to the dense BSHD row of the same
batch (paged / dense time: the issue's target is <= 1.05 at pages of 64 keys and more) and
cuDNN's time on the dense BHSD equivalent."""
import glob, json, os, sys

folder, commit, command = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for path in sorted(glob.glob(os.path.join(folder, "attn-r*.jsonl"))):
    for line in open(path):
        r = json.loads(line)
        runs.setdefault((r["batch"], r["layout"]), []).append(r)
sdpa, device = {}, None
for line in open(os.path.join(folder, "sdpa.jsonl")):
    r = json.loads(line)
    if "roofline" in r:
        device = r["device"]
    else:
        sdpa[r["batch"]] = r
mean = lambda xs: sum(xs) / len(xs)
rows = []
for (b, layout), rs in runs.items():
    r0 = rs[0]
    us = mean([r["us"] for r in rs])
    kv = 2 * b * r0["heads_kv"] * r0["seq_k"] * r0["head_dim"] * 2
    dense = runs.get((b, "bshd"))
    ratio = us / mean([r["us"] for r in dense]) if dense else None
    cudnn = sdpa.get(b, {}).get("cudnn", {}).get("us")
    row = {"batch": b, "heads_q": r0["heads_q"], "heads_kv": r0["heads_kv"], "seq_q": r0["seq_q"],
           "seq_k": r0["seq_k"], "head_dim": r0["head_dim"], "layout": layout, "kernel": r0["kernel"],
           "split": r0["split"], "attn_us_rounds": [r["us"] for r in rs], "attn_us": round(us, 2),
           "attn_kv_gbps": round(kv / us / 1e3, 1),
           "time_over_dense_bshd": round(ratio, 3) if ratio else None,
           "cudnn_dense_bhsd_us": cudnn,
           "cudnn_over_attn": round(cudnn / us, 3) if cudnn else None}
    row["text"] = (f"b{b} {layout:8s}: attn {us:8.1f} us {kv / us / 1e3:6.0f} GB/s"
                   + (f", {ratio:.3f}x dense bshd" if ratio else "")
                   + (f", cuDNN (dense bhsd) {cudnn:8.1f} us" if cudnn else ""))
    rows.append(row)
print(json.dumps({
    "what": "decode from a paged KV cache vs dense K/V: bf16, GQA 32:8, D=128, seq_q=1, 32k keys per "
            "sequence, no mask; attn's decode family through the host-copy path (inputs and index arrays "
            "on the device once), CUDA-event medians of each call behind an untimed twin, rounds "
            "interleaved; PyTorch SDPA cuDNN on the dense BHSD equivalent in the same run",
    "device": device, "commit": commit, "command": command,
    "kv_bytes": "K and V bytes read per call (2 * batch * heads_kv * seq_k * head_dim * 2)",
    "rows": rows}, indent=1))
