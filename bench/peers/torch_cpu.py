#!/usr/bin/env python3
"""PyTorch's CPU attention on the same grid as `attn bench`, as JSON lines in the same format.

The peer users would pick on a machine without a GPU: torch.nn.functional.scaled_dot_product_attention
with the fused flash kernel forced (SDPBackend.FLASH_ATTENTION). Timed with perf_counter around
each call (CPU work is synchronous), median of --iters after --warmup. Accuracy: the same number
of rows as ours checked against a float64 evaluation of the same inputs.
"""
import argparse, json, sys, time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqs", default="512,1024,2048,4096")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-warmup-ms", type=float, default=200)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--check-rows", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    types = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    for dt in a.dtypes.split(","):
        for d in map(int, a.dims.split(",")):
            for s in map(int, a.seqs.split(",")):
                for mask in a.masks.split(","):
                    causal = mask == "causal"
                    shape = (a.batch, a.heads, s, d)
                    q, k, v = (torch.randn(shape).to(types[dt]) for _ in range(3))
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        # At least --warmup calls and --min-warmup-ms, as attn's measure::time.
                        start, done = time.perf_counter(), 0
                        while done < a.warmup or time.perf_counter() - start < a.min_warmup_ms / 1e3:
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            done += 1
                        times = []
                        for _ in range(a.iters):
                            t = time.perf_counter()
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            times.append(time.perf_counter() - t)
                    times.sort()
                    med = times[len(times) // 2]
                    flops = 4 * a.batch * a.heads * s * s * d / (2 if causal else 1)
                    rel, mx = error_vs_f64(q, k, v, out, causal, a.check_rows)
                    row = dict(impl="torch-sdpa-cpu-flash", kernel=f"torch {torch.__version__}", dtype=dt,
                               batch=a.batch, heads=a.heads, seq=s, head_dim=d, causal=causal,
                               threads=a.threads, median_ms=med * 1e3, min_ms=times[0] * 1e3,
                               max_ms=times[-1] * 1e3, runs=len(times), gflops=flops / med / 1e9,
                               rel_l2=rel, max_abs=mx)
                    print(json.dumps(row), flush=True)
                    print(f"torch {dt:>5} d{d:<3} s{s:<6} {mask:<6} {med*1e3:9.3f} ms {row['gflops']:8.1f} GFLOP/s",
                          file=sys.stderr, flush=True)


def error_vs_f64(q, k, v, out, causal, rows):
    """Relative L2 and max-abs error of `out` on `rows` query rows spread over (batch, head, seq)."""
    b, h, s, d = q.shape
    total = b * h * s
    picks = sorted({r * (total - 1) // max(rows - 1, 1) for r in range(rows)})
    num = den = 0.0
    mx = 0.0
    for r in picks:
        bi, hi, i = r // (h * s), (r // s) % h, r % s
        qr = q[bi, hi, i].double()
        kk, vv = k[bi, hi].double(), v[bi, hi].double()
        sc = (kk @ qr) / d ** 0.5
        if causal:
            sc[i + 1:] = float("-inf")
        ref = torch.softmax(sc, 0) @ vv
        diff = out[bi, hi, i].double() - ref
        num += float(diff @ diff)
        den += float(ref @ ref)
        mx = max(mx, float(diff.abs().max()))
    return (num / den) ** 0.5, mx


if __name__ == "__main__":
    main()
