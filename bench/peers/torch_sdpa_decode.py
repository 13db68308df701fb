#!/usr/bin/env python3
"""PyTorch SDPA (cuDNN and flash backends) on decode rows, and the device's read bandwidth, as
JSON lines. Rows: a file of `batch heads_q heads_kv seq_q seq_k head_dim` lines (`#` comments),
bf16, BHSD, no mask, `enable_gqa=True` where heads differ; the same rows
crates/attn-cuda/examples/decode_bench.rs times. Each timed call (CUDA events around it) runs
behind an untimed twin, as attn's; median of --iters after a 100 ms warm-up. K/V GB/s = K and V
bytes per call / time. The roofline rows time torch.sum over a bf16 tensor (bytes read / time)
and a device copy (bytes read + written / time).
"""
import argparse, json, time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def time_call(fn, iters):
    start = time.perf_counter()
    while time.perf_counter() - start < 0.1:
        fn()
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--backends", default="cudnn,flash")
    ap.add_argument("--roofline-gib", type=float, default=4.0)
    ap.add_argument("--profile-once", action="store_true",
                    help="no timing: one call per row and backend between cudaProfilerStart and Stop, "
                         "for `ncu --profile-from-start off` (bench/device/decode-ncu.sh)")
    a = ap.parse_args()
    torch.manual_seed(1)
    dev = torch.cuda.get_device_name()
    if a.profile_once:
        return profile_once(a)
    n = int(a.roofline_gib * 2**30 / 2)
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    us = time_call(lambda: x.sum(dtype=torch.float32), a.iters)
    print(json.dumps({"roofline": "sum", "device": dev, "bytes": 2 * n, "us": round(us, 2),
                      "gbps": round(2 * n / us / 1e3, 1)}), flush=True)
    y = torch.empty_like(x)
    us = time_call(lambda: y.copy_(x), a.iters)
    print(json.dumps({"roofline": "copy", "device": dev, "bytes": 4 * n, "us": round(us, 2),
                      "gbps": round(4 * n / us / 1e3, 1)}), flush=True)
    del x, y
    torch.cuda.empty_cache()
    for line, (b, hq, hkv, sq, sk, d), calls in rows(a):
        kv_bytes = 2 * b * hkv * sk * d * 2
        row = {"batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_k": sk, "head_dim": d}
        for name, call in calls:
            try:
                call()
                torch.cuda.synchronize()
                us = time_call(call, a.iters)
                row[name] = {"us": round(us, 2), "kv_gbps": round(kv_bytes / us / 1e3, 1)}
            except Exception as e:  # a backend that does not take the shape
                row[name] = {"error": str(e).splitlines()[0][:160]}
        print(json.dumps(row), flush=True)
        del calls, call  # the row's tensors go when the generator moves on


def rows(a):
    """Each row of the rows file: its line, its numbers and, on fresh random bf16 BHSD tensors,
    each backend's SDPA call. The tensors are freed when the next row is asked for, once the
    caller has dropped the calls."""
    for line in open(a.rows):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        b, hq, hkv, sq, sk, d = map(int, line.split())
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.bfloat16)

        def call_of(name):
            def call():
                with sdpa_kernel(BACKENDS[name]):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
            return call

        yield line, (b, hq, hkv, sq, sk, d), [(name, call_of(name)) for name in a.backends.split(",")]
        del q, k, v
        torch.cuda.empty_cache()


def profile_once(a):
    """Each row's call once per backend inside a profiler range, after a warm-up call."""
    for line, _, calls in rows(a):
        for name, call in calls:
            call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"profiled {name}: {line}", flush=True)
        del calls, call


if __name__ == "__main__":
    main()
