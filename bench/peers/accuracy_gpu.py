#!/usr/bin/env python3
"""Error of attn's output and of PyTorch SDPA's cuDNN and flash backends against an fp64
reference, on the same inputs (the .npy files `attn bench --dump DIR` writes).

For each dumped shape: load q, k, v (raw 16-bit bits -> bf16/f16), run each SDPA backend on them,
compute the fp64 reference on the GPU for a sample of query rows, and report max-abs and relative
L2 error of each. FlashAttention's acceptance rule: ours must be at most 2x the peers' error.
"""
import argparse, glob, json, os, sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def load(stem, name, dtype, shape):
    raw = np.load(f"{stem}.{name}.npy")
    return torch.from_numpy(raw.view(np.int16)).view(TYPES[dtype]).reshape(shape).cuda()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--rows", type=int, default=256)
    a = ap.parse_args()
    for meta_path in sorted(glob.glob(os.path.join(a.dir, "*.json"))):
        meta = json.load(open(meta_path))
        stem = meta_path[:-5]
        shape = (meta["batch"], meta["heads"], meta["seq"], meta["head_dim"])
        q, k, v, o = (load(stem, n, meta["dtype"], shape) for n in "qkvo")
        causal = meta["causal"]
        outs = {meta["impl"]: o}
        for name, be in [("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)]:
            with sdpa_kernel([be]):
                outs[name] = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        # fp64 reference on sampled (batch*head, row) pairs.
        b, h, s, d = shape
        g = torch.Generator().manual_seed(0)
        picks = torch.randint(0, b * h * s, (a.rows,), generator=g)
        errs = {n: [0.0, 0.0, 0.0] for n in outs}
        for idx in picks.tolist():
            bi, hi, i = idx // (h * s), (idx // s) % h, idx % s
            qr = q[bi, hi, i].double()
            sc = (k[bi, hi].double() @ qr) * meta["scale"]
            if causal:
                sc[i + 1:] = float("-inf")
            ref = torch.softmax(sc, 0) @ v[bi, hi].double()
            for n, out in outs.items():
                diff = out[bi, hi, i].double() - ref
                e = errs[n]
                e[0] = max(e[0], diff.abs().max().item())
                e[1] += (diff @ diff).item()
                e[2] += (ref @ ref).item()
        row = dict(dtype=meta["dtype"], head_dim=d, seq=s, causal=causal, rows=a.rows,
                   errors={n: dict(max_abs=e[0], rel_l2=(e[1] / e[2]) ** 0.5) for n, e in errs.items()})
        ours = row["errors"][meta["impl"]]["max_abs"]
        peer = min(row["errors"][n]["max_abs"] for n in outs if n != meta["impl"])
        row["ours_over_best_peer_max_abs"] = ours / peer if peer > 0 else float("inf")
        print(json.dumps(row), flush=True)
        print(f"{meta['dtype']} d{d} s{s} causal={causal}: " +
              ", ".join(f"{n} max {e['max_abs']:.2e} relL2 {e['rel_l2']:.2e}" for n, e in row["errors"].items()) +
              f"  ours/best peer max-abs {row['ours_over_best_peer_max_abs']:.2f} (must be <= 2)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
