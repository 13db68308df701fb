#!/usr/bin/env python3
"""decode-ab.sh's report: per row, this build's and the base's median time over the rounds (each
round's figure a CUDA-event median of 50 calls), new/base, cuDNN's median and cuDNN/new, and the
share of the read roofline (torch.sum) each reaches. Writes OUT/decode-ab.json."""
import glob, json, statistics, sys

out, commit, base_commit = sys.argv[1], sys.argv[2], sys.argv[3]
key = lambda r: (r["batch"], r["heads_q"], r["heads_kv"], r["seq_q"], r["seq_k"], r["head_dim"])
times, cudnn, roof = {}, {}, []
for line in open(out + "/ab.jsonl"):
    r = json.loads(line)
    times.setdefault(key(r), {}).setdefault(r["build"], []).append(r["us"])
    times[key(r)].setdefault("split", {})[r["build"]] = r["split"]
for f in sorted(glob.glob(out + "/sdpa-r*.jsonl")):
    for line in open(f):
        r = json.loads(line)
        if r.get("roofline") == "sum":
            roof.append(r["gbps"])
        elif "cudnn" in r:
            cudnn.setdefault(key(r), []).append(r["cudnn"]["us"])
roofline = statistics.median(roof)
rows = []
for k, t in times.items():
    b, hq, hkv, sq, sk, d = k
    gb = 2 * b * hkv * sk * d * 2 / 1e9
    new, old, cu = (statistics.median(x) for x in (t["new"], t["base"], cudnn[k]))
    rows.append({
        "batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk, "head_dim": d,
        "new_us_rounds": t["new"], "base_us_rounds": t["base"], "cudnn_us_rounds": cudnn[k],
        "new_over_base": round(new / old, 4), "cudnn_over_new": round(cu / new, 3), "cudnn_over_base": round(cu / old, 3),
        "new_of_read_roofline": round(gb / (new * 1e-6) / roofline, 3), "base_of_read_roofline": round(gb / (old * 1e-6) / roofline, 3),
        "cudnn_of_read_roofline": round(gb / (cu * 1e-6) / roofline, 3),
        "new_grid": t["split"]["new"], "base_grid": t["split"]["base"],
    })
    print(f"b{b} hq{hq} hkv{hkv} sq{sq} sk{sk} d{d}: new {new:8.1f} us base {old:8.1f} us new/base {new/old:.3f} | "
          f"cudnn {cu:8.1f} us x{cu/new:.3f} (base x{cu/old:.3f}) | roof new {rows[-1]['new_of_read_roofline']:.3f} "
          f"base {rows[-1]['base_of_read_roofline']:.3f} cudnn {rows[-1]['cudnn_of_read_roofline']:.3f}")
json.dump({
    "what": "the decode family of one build against another's on bench/device/decode-rows.txt (bf16, BHSD, no mask), with PyTorch SDPA cuDNN in each round",
    "commit": commit, "base": base_commit, "command": "bash bench/device/decode-ab.sh",
    "timing": "CUDA-event medians of 50 calls each behind an untimed twin; per row the median over rounds (the builds' order swapped in even rounds, cuDNN after both); GB/s of K and V",
    "read_roofline_gbps": roof, "rows": rows,
}, open(out + "/decode-ab.json", "w"), indent=1)
