#!/usr/bin/env python3
"""PyTorch SDPA's backward (cuDNN and flash backends) on issue 34's grid, as JSON lines: bf16
BHSD, batch = 16384 / S, heads = 2048 / D, D in {64, 128}, S from 1k to 16k, causal and not
(S_q = S_k, so PyTorch's top-left causal is the same mask as attn's bottom-right). Timed: the
gradients of q, k, v from dO through the SDPA output (`torch.autograd.grad`, retain_graph), the
forward excluded, CUDA events around each call, median of --iters after a 100 ms warm-up.
TFLOP/s by FlashAttention's convention: 2.5 x 4 B H S^2 D, halved for causal. The shapes
crates/attn-cuda/examples/backward_bench.rs times.
"""
import argparse, json, time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def median_ms(fn, iters):
    start = time.perf_counter()
    while time.perf_counter() - start < 0.1:
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--max-seq", type=int, default=16384)
    ap.add_argument("--dims", default="64,128", help="head dims, a comma list")
    a = ap.parse_args()
    torch.manual_seed(1)
    dev = torch.cuda.get_device_name()
    for d in (int(x) for x in a.dims.split(",")):
        for s in (1024, 2048, 4096, 8192, 16384):
            if s > a.max_seq:
                continue
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                d_o = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
                flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                for name, backend in BACKENDS.items():
                    try:
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            t0 = time.time()  # t0, t1: the GPU's clock then (bench/device/clocks.py)
                            ms = median_ms(lambda: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True), a.iters)
                            t1 = time.time()
                        row = {"impl": name, "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": causal,
                               "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), "device": dev,
                               "t0": round(t0, 3), "t1": round(t1, 3)}
                    except Exception as e:  # a backend that does not take the shape: say so
                        row = {"impl": name, "seq": s, "head_dim": d, "causal": causal, "error": str(e)[:200]}
                    print(json.dumps(row), flush=True)
                    del o
                del q, k, v, d_o
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
