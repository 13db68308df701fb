#!/usr/bin/env python3
"""Fits time = a + bytes / bandwidth to the bandwidth-bound one-query rows (K/V of at least MIN_MB) of a
decode results file (bench/device/decode.sh's JSON), for attn and each peer: whether a gap to a
peer is a fixed cost per call (the intercept) or streaming (the slope).
Usage: python3 bench/device/decode_fit.py bench/results/h100-decode.json [MIN_MB, default 100]"""
import json
import sys


def fit(points):
    n = len(points)
    sx = sum(x for x, _ in points)
    sy = sum(y for _, y in points)
    sxx = sum(x * x for x, _ in points)
    sxy = sum(x * y for x, y in points)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - slope * sx) / n, slope


rows = json.load(open(sys.argv[1]))["rows"]
min_mb = float(sys.argv[2]) if len(sys.argv) > 2 else 100.0
for who in ["attn", "cudnn", "flash"]:
    points = []
    for r in rows:
        mb = 2 * r["batch"] * r["heads_kv"] * r["seq_k"] * r["head_dim"] * 2 / 1e6
        if f"{who}_us" in r and mb >= min_mb and r["seq_q"] == 1:
            points.append((mb, r[f"{who}_us"]))
    if len(points) >= 2:
        a, b = fit(points)
        print(f"{who:6s} {len(points)} rows of >= {min_mb:.0f} MB: intercept {a:.1f} us, bandwidth {1e3 / b:.0f} GB/s")
