#!/usr/bin/env python3
"""Merges decode.sh's rounds (attn-r*.jsonl, sdpa-r*.jsonl in a folder) into one self-describing
JSON on stdout: per row, attn's and each SDPA backend's median time per round, their mean, K/V
GB/s, attn's ratio to cuDNN (cuDNN time / attn time, >1 is faster) and the share of the
read roofline (torch.sum's bytes/time) each reaches."""
import glob, json, os, sys

folder, commit, command = sys.argv[1], sys.argv[2], sys.argv[3]
key = lambda r: (r["batch"], r["heads_q"], r["heads_kv"], r["seq_q"], r["seq_k"], r["head_dim"])
attn, sdpa, roof = {}, {}, {"sum": [], "copy": []}
device = None
for path in sorted(glob.glob(os.path.join(folder, "attn-r*.jsonl"))):
    for line in open(path):
        r = json.loads(line)
        attn.setdefault(key(r), []).append(r)
for path in sorted(glob.glob(os.path.join(folder, "sdpa-r*.jsonl"))):
    for line in open(path):
        r = json.loads(line)
        if "roofline" in r:
            roof[r["roofline"]].append(r["gbps"])
            device = r["device"]
        else:
            sdpa.setdefault(key(r), []).append(r)
mean = lambda xs: sum(xs) / len(xs) if xs else None
read_roof = mean(roof["sum"])
rows = []
for k, runs in attn.items():
    b, hq, hkv, sq, sk, d = k
    kv = 2 * b * hkv * sk * d * 2
    a_us = mean([r["us"] for r in runs])
    row = {"batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk, "head_dim": d,
           "kernel": runs[0]["kernel"], "split": runs[0]["split"],
           "attn_us_rounds": [r["us"] for r in runs], "attn_us": round(a_us, 2),
           "attn_kv_gbps": round(kv / a_us / 1e3, 1),
           "attn_of_read_roofline": round(kv / a_us / 1e3 / read_roof, 3) if read_roof else None}
    text = f"b{b} hq{hq} hkv{hkv} sq{sq} sk{sk} d{d}: attn {a_us:8.1f} us {kv / a_us / 1e3:6.0f} GB/s"
    for name in ("cudnn", "flash"):
        peer = [r[name]["us"] for r in sdpa.get(k, []) if "us" in r.get(name, {})]
        if peer:
            p_us = mean(peer)
            row[f"{name}_us_rounds"] = peer
            row[f"{name}_us"] = round(p_us, 2)
            row[f"{name}_kv_gbps"] = round(kv / p_us / 1e3, 1)
            row[f"{name}_of_read_roofline"] = round(kv / p_us / 1e3 / read_roof, 3) if read_roof else None
            row[f"speedup_vs_{name}"] = round(p_us / a_us, 3)
            text += f" | {name} {p_us:8.1f} us {kv / p_us / 1e3:6.0f} GB/s x{p_us / a_us:.2f}"
        else:
            errs = [r[name]["error"] for r in sdpa.get(k, []) if "error" in r.get(name, {})]
            row[name] = errs[0] if errs else "not run"
    row["text"] = text
    rows.append(row)
print(json.dumps({
    "what": "decode: attn's decode family (split-KV, GQA rows packed) vs PyTorch SDPA cuDNN and flash, bf16, BHSD, no mask",
    "commit": commit, "device": device, "command": command,
    "timing": "CUDA-event medians of 50 calls each behind an untimed twin, two alternating rounds (attn, SDPA, attn, SDPA); "
              "K/V GB/s = K and V bytes / time; speedup = peer time / attn time",
    "roofline_gbps": {"read_sum": roof["sum"], "copy_read_write": roof["copy"]},
    "rows": rows}, indent=1))
