#!/usr/bin/env python3
"""Merges decode-bulk.sh's runs (bulk-r*.jsonl, cpasync-r*.jsonl, sdpa-r*.jsonl and the
splits-*.jsonl of ATTN_CUDA_DECODE_SPLITS=33, in one folder) into one self-describing JSON on
stdout: per row, each copy path's and cuDNN's median time per round and their mean, K/V GB/s,
the share of the read roofline (torch.sum's bytes / time, same run) each reaches, bulk over
cp.async (cp.async time / bulk time, >1: bulk is faster) and each path against cuDNN (cuDNN
time / attn time).
Usage: decode_bulk_report.py FOLDER COMMIT"""
import glob, json, os, sys

folder, commit = sys.argv[1], sys.argv[2]
key = lambda r: (r["batch"], r["heads_q"], r["heads_kv"], r["seq_q"], r["seq_k"], r["head_dim"])
mean = lambda xs: sum(xs) / len(xs) if xs else None


def runs(pattern):
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, pattern))):
        for line in open(path):
            r = json.loads(line)
            found.setdefault(key(r) if "batch" in r else r["roofline"], []).append(r)
    return found


bulk, cpasync, sdpa = runs("bulk-r*.jsonl"), runs("cpasync-r*.jsonl"), runs("sdpa-r*.jsonl")
split_bulk, split_cpasync = runs("splits-bulk.jsonl"), runs("splits-cpasync.jsonl")
roof = {name: [r["gbps"] for r in sdpa.pop(name, [])] for name in ("sum", "copy")}
read_roof = mean(roof["sum"])
device = next((r["device"] for r in runs("sdpa-r*.jsonl").get("sum", [])), None)


def side(row, name, us_list, kv, extra=None):
    if not us_list:
        row[name] = "not run"
        return None
    us = mean(us_list)
    row[f"{name}_us_rounds"] = us_list
    row[f"{name}_us"] = round(us, 2)
    row[f"{name}_kv_gbps"] = round(kv / us / 1e3, 1)
    row[f"{name}_of_read_roofline"] = round(kv / us / 1e3 / read_roof, 3) if read_roof else None
    if extra:
        row.update(extra)
    return us


rows = []
for k in bulk:
    b, hq, hkv, sq, sk, d = k
    kv = 2 * b * hkv * sk * d * 2
    row = {"batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk, "head_dim": d}
    ub = side(row, "bulk", [r["us"] for r in bulk[k]], kv,
              {"bulk_kernel": bulk[k][0]["kernel"], "split": bulk[k][0]["split"]})
    uc = side(row, "cpasync", [r["us"] for r in cpasync.get(k, [])], kv,
              {"cpasync_kernel": cpasync[k][0]["kernel"]} if k in cpasync else None)
    ud = side(row, "cudnn", [r["cudnn"]["us"] for r in sdpa.get(k, []) if "us" in r.get("cudnn", {})], kv)
    text = f"b{b} hq{hq} hkv{hkv} sq{sq} sk{sk} d{d}: bulk {ub:8.1f}"
    if uc:
        row["bulk_speedup_vs_cpasync"] = round(uc / ub, 3)
        text += f" | cp.async {uc:8.1f} (bulk x{uc / ub:.3f})"
    if ud:
        row["bulk_speedup_vs_cudnn"] = round(ud / ub, 3)
        text += f" | cudnn {ud:8.1f}: bulk x{ud / ub:.3f}"
        if uc:
            row["cpasync_speedup_vs_cudnn"] = round(ud / uc, 3)
            text += f", cp.async x{ud / uc:.3f}"
    if read_roof:
        text += " | of roofline " + " / ".join(
            f"{row.get(n + '_of_read_roofline', 0):.3f}" for n in ("bulk", "cpasync", "cudnn"))
    for name, found in (("splits33_bulk", split_bulk), ("splits33_cpasync", split_cpasync)):
        if k in found:
            us = found[k][0]["us"]
            row[f"{name}_us"] = us
            row[f"{name}_of_read_roofline"] = round(kv / us / 1e3 / read_roof, 3) if read_roof else None
            text += f" | {name} {us:.1f}"
    row["text"] = text
    rows.append(row)
print(json.dumps({
    "what": "decode family K/V copy paths on sm_90: bulk copies (one cp.async.bulk per K/V row, mbarrier per stage) "
            "vs 16-byte cp.async (the path before), and PyTorch SDPA cuDNN, bf16, BHSD, no mask",
    "commit": commit, "device": device,
    "command": "bash <bundle>/decode-bulk.sh on the GPU machine (bench/device/decode-bulk.sh's header), then "
               "bench/device/decode_bulk_report.py",
    "timing": "CUDA-event medians of 50 calls each behind an untimed twin; two interleaved rounds (bulk, cp.async, SDPA; "
              "cp.async, bulk, SDPA), the mean; the splits33 columns: one run each with ATTN_CUDA_DECODE_SPLITS=33 "
              "after the rounds; K/V GB/s = K and V bytes / time",
    "roofline_gbps": {"read_sum": roof["sum"], "copy_read_write": roof["copy"]},
    "rows": rows}, indent=1))
