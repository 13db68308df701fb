#!/usr/bin/env python3
"""Gradient error of attn's CUDA backward and of PyTorch SDPA's backward (cuDNN, flash) against an
fp64 reference, on the same inputs: the .npy files crates/attn/examples/backward_dump.rs writes
(q, k, v, dO in bf16 as raw bits, attn's dq, dk, dv). Each peer runs its own forward and backward
on q, k, v and dO; the reference is autograd of the same attention in float64. Reports each
gradient's relative L2 error and max abs error, and ours over the best peer's (the issue's rule:
at most 2x).
"""
import argparse, glob, json, os, sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def load(stem, name, shape):
    raw = np.load(f"{stem}.{name}.npy")
    return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16).reshape(shape).cuda()


def grads(q, k, v, d_o, causal, scale, backend=None):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    if backend is None:  # fp64 math
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    else:
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return torch.autograd.grad(o, (q, k, v), d_o)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    a = ap.parse_args()
    for meta_path in sorted(glob.glob(os.path.join(a.dir, "*.json"))):
        meta = json.load(open(meta_path))
        stem = meta_path[:-5]
        shape = (meta["batch"], meta["heads"], meta["seq"], meta["head_dim"])
        q, k, v, d_o = (load(stem, n, shape) for n in ("q", "k", "v", "do"))
        causal, scale = meta["causal"], meta["scale"]
        with sdpa_kernel([SDPBackend.MATH]):
            ref = grads(q.double(), k.double(), v.double(), d_o.double(), causal, scale)
        outs = {"attn": tuple(load(stem, n, shape) for n in ("dq", "dk", "dv"))}
        for name, be in [("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)]:
            outs[name] = grads(q, k, v, d_o, causal, scale, be)
        errors = {}
        for name, gs in outs.items():
            errors[name] = {}
            for gname, g, r in zip(("dq", "dk", "dv"), gs, ref):
                diff = g.double() - r
                errors[name][gname] = {"rel_l2": (diff.norm() / r.norm()).item(), "max_abs": diff.abs().max().item()}
        row = dict(dtype="bf16", batch=shape[0], heads=shape[1], seq=shape[2], head_dim=shape[3], causal=causal,
                   errors=errors, device=torch.cuda.get_device_name())
        row["ours_over_best_peer_rel_l2"] = {
            gname: errors["attn"][gname]["rel_l2"] / min(errors[n][gname]["rel_l2"] for n in outs if n != "attn")
            for gname in ("dq", "dk", "dv")}
        print(json.dumps(row), flush=True)
        print(f"d{shape[3]} s{shape[2]} causal={causal}: ours/best peer rel L2 " +
              ", ".join(f"{g} {x:.2f}" for g, x in row["ours_over_best_peer_rel_l2"].items()) + " (must be <= 2)",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
