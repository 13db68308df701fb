#!/usr/bin/env python3
"""PyTorch SDPA's GPU backends (cuDNN, flash = FlashAttention-2, efficient, math) on the standard grid,
as JSON lines in `attn bench`'s format.

Standard grid: batch = tokens / S, heads = model_dim / D (16384 and 2048 by default). Each call
is timed with CUDA events; the median of --iters after --warmup is reported. --lead says what
runs ahead of each timed call's start event, as attn's CUDA backend does it (`Lead` in
crates/attn-cuda/src/runtime.rs): `repeat` (default) the same call, untimed, so that the timed
one runs back to back with it and the host's dispatch and launch are not counted; `idle`
nothing (the start is stamped at once, before the call is even dispatched); `hold:<us>` a
one-thread wait (torch.cuda._sleep) of at least that long. TFLOP/s use
4*B*H*S*S*D, halved for causal. `is_causal=True` aligns top-left, which equals attn's
bottom-right alignment because every grid row has seq_q == seq_k.
"""
import argparse, json, sys, time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
TYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def time_call(fn, warmup, iters, min_warmup_s, lead):
    # At least `warmup` calls and at least `min_warmup_s` seconds (the rule of attn's
    # measure::time, same default): a GPU left idle while the host prepared the inputs needs a
    # moment to reach full speed.
    start, done = time.perf_counter(), 0
    while done < warmup or time.perf_counter() - start < min_warmup_s:
        fn()
        torch.cuda.synchronize()
        done += 1
    # _sleep counts clock cycles: 2000 per microsecond holds at least that long up to 2 GHz.
    hold_cycles = int(float(lead.split(":")[1]) * 2000) if lead.startswith("hold:") else 0
    times, queued = [], []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if lead == "repeat":
            fn()
        elif hold_cycles:
            torch.cuda._sleep(hold_cycles)
        host = time.perf_counter()
        start.record()
        fn()
        end.record()
        queued.append((time.perf_counter() - host) * 1e3)
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times, max(queued)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="cudnn,flash,efficient")
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--model-dim", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-warmup-ms", type=float, default=200)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--lead", default="repeat",
                    help="ahead of each timed call: repeat (the call, untimed), idle, or hold:<us>")
    ap.add_argument("--math-iters", type=int, default=None,
                    help="timed runs for the unfused math backend (slow and memory-bound); default --iters")
    a = ap.parse_args()
    torch.manual_seed(1)
    dev = torch.cuda.get_device_name()
    for dt in a.dtypes.split(","):
        for d in map(int, a.dims.split(",")):
            for s in map(int, a.seqs.split(",")):
                b, h = max(a.tokens // s, 1), max(a.model_dim // d, 1)
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=TYPES[dt]) for _ in range(3))
                for mask in a.masks.split(","):
                    causal = mask == "causal"
                    flops = 4 * b * h * s * s * d / (2 if causal else 1)
                    for name in a.backends.split(","):
                        row = dict(impl=f"sdpa-{name}", kernel=f"torch {torch.__version__}", device=dev, dtype=dt,
                                   batch=b, heads=h, seq=s, head_dim=d, causal=causal)
                        try:
                            iters = a.math_iters if name == "math" and a.math_iters else a.iters
                            warmup = min(a.warmup, iters)
                            with sdpa_kernel([BACKENDS[name]]):
                                times, queued_ms = time_call(
                                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                    warmup, iters, a.min_warmup_ms / 1e3, a.lead)
                        except RuntimeError as e:  # a backend that does not support the shape, or out of memory
                            torch.cuda.empty_cache()
                            row.update(error=str(e).splitlines()[0][:200])
                            print(json.dumps(row), flush=True)
                            continue
                        med = times[len(times) // 2]
                        # max_queue_ms: the longest the host took to queue a timed call; a hold
                        # shorter than that ran out first, and the time holds some of the host's.
                        row.update(median_ms=med, min_ms=times[0], max_ms=times[-1], runs=len(times),
                                   gflops=flops / (med * 1e-3) / 1e9, lead=a.lead, max_queue_ms=queued_ms)
                        print(json.dumps(row), flush=True)
                        print(f"{name:>9} {dt} d{d} s{s} {mask:<6} {med:8.3f} ms {row['gflops'] / 1e3:7.1f} TFLOP/s",
                              file=sys.stderr, flush=True)
                del q, k, v


if __name__ == "__main__":
    main()
