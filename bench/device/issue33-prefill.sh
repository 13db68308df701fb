#!/usr/bin/env bash
# On the lent H100, in one call: issue 33's two prefill targets not timed before.
#   varlen    bf16, D=128, 64 sequences of lengths drawn uniformly from 128..4096 (`attn bench
#             --varlen 128`, seeded: the same lengths every run), causal and not, heads 16:16 and
#             (time allowing) GQA 32:8. Timed in each round, one after another: attn varlen
#             (packed, the Ampere/Ada family, which takes sequences on sm_90); attn dense at the
#             same token count (64 equal sequences of the mean length), on the default family
#             and with ATTN_CUDA_FAMILY=ampere; PyTorch SDPA cuDNN on the padded batch [64,
#             max_len] (see `sdpa` below for the masks) and on the dense batch of the mean length.
#   head-dims bf16, S=4096, batch 16384/S, heads 2048/D (rounded down, `attn bench --model-dim`),
#             causal and not, every multiple of 8 from 8 to 256 on the default family: TFLOP/s
#             and the ratio to the next natively supported dim's TFLOP/s scaled by D/D_next.
# Steps run in priority order (varlen 16:16 and head dims round 1, then round 2, then GQA), each
# starting only while time is left of BUDGET seconds (default 270); both result JSONs are
# rewritten after every step, so a call cut short keeps what ran. ONLY=varlen (or head) runs only
# the steps whose name holds it.
# Expects the release `attn` at $ATTN (default: bin/attn next to this script, else
# .device/bin/attn) and the commit in COMMIT next to it (else .device/COMMIT). Writes
# $OUT/h100-varlen-prefill.json and $OUT/h100-head-dims.json (what bench/results/ keeps) and
# $OUT/log.txt.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
final=${OUT:-/tmp/out}; mkdir -p "$final"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
attn=${ATTN:-$here/bin/attn}; [[ -x $attn ]] || attn=.device/bin/attn
commit_file=$here/COMMIT; [[ -f $commit_file ]] || commit_file=.device/COMMIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$final/log.txt"
ONLY=${ONLY:-} ATTN="$attn" OUTDIR="$final" BUDGET=${BUDGET:-270} ITERS=${ITERS:-10} COMMIT=$(cat "$commit_file" 2>/dev/null || echo unknown) \
  timeout 295 python3 - 2>&1 <<'PY' | tee -a "$final/log.txt"
import json, os, subprocess, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

attn, outdir, iters = os.environ["ATTN"], os.environ["OUTDIR"], int(os.environ["ITERS"])
started, budget = time.time(), float(os.environ["BUDGET"])
device = torch.cuda.get_device_name()
left = lambda: budget - (time.time() - started)
NATIVE = {"hopper (sm_90 default)": [64, 128, 256], "ampere/ada": [32, 64, 96, 128, 256]}
SUPPORTED = [64, 128, 256]  # native on the default family of sm_90 (Hopper's; every other dim runs padded there)
DIMS = list(range(8, 257, 8))
BASE = ["bench", "--backend", "cuda", "--dtypes", "bf16", "--iters", str(iters), "--check-rows", "4"]
commands = set()


def bench(flags, family=None):
    """attn bench rows (JSON lines) for `flags`, in a process of its own; [] on failure."""
    cmd = [attn] + BASE + [str(f) for f in flags]
    env = dict(os.environ, **({"ATTN_CUDA_FAMILY": family} if family else {}))
    commands.add(("ATTN_CUDA_FAMILY=%s " % family if family else "") + "attn " + " ".join(cmd[1:]))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max(5, min(150, left() + 20)))
    except subprocess.TimeoutExpired:
        print("TIMEOUT", " ".join(cmd), flush=True)
        return []
    if p.returncode != 0:
        print("FAILED", " ".join(cmd), p.stderr[-600:], flush=True)
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def cuda_time(fn):
    """CUDA-event median (ms) of `iters` calls, each right behind an untimed one (the `repeat` lead of
    bench/peers/torch_sdpa_gpu.py), after at least 3 calls and 200 ms of warm-up."""
    t0, n = time.perf_counter(), 0
    while n < 3 or time.perf_counter() - t0 < 0.2:
        fn(); torch.cuda.synchronize(); n += 1
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn(); a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def sdpa(batch, hq, hkv, seq, causal, lens=None):
    """SDPA cuDNN timings (ms) on [batch, heads, seq, 128] bf16: `plain` (is_causal as asked, no
    other mask) and, for a padded non-causal batch, `key_mask` (a boolean key-padding mask, the
    only way that batch's valid rows are right; causal padded rows need none: a valid query sees
    no key past itself). GQA by enable_gqa, else by K/V expanded to every query head (noted)."""
    res = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(batch, hq, seq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(batch, hkv, seq, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    gqa = {"enable_gqa": True} if hq != hkv else {}
    variants = [("plain", None)]
    if lens is not None and not causal:
        idx = torch.arange(seq, device="cuda")
        valid = idx[None, :] < torch.tensor(lens, device="cuda")[:, None]
        variants.append(("key_mask", valid[:, None, None, :]))
    for name, mask in variants:
        for how, kk, vv, kw in [("enable_gqa", k, v, gqa)] + ([("expanded_kv", k.repeat_interleave(hq // hkv, 1),
                                                                 v.repeat_interleave(hq // hkv, 1), {})] if gqa else []):
            try:
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    ms = cuda_time(lambda: F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask,
                                                                          is_causal=causal and mask is None, **kw))
                res[name] = {"ms": ms, **({"gqa": how} if gqa else {})}
                break
            except RuntimeError as e:
                res[name] = {"error": str(e).splitlines()[0][:200], **({"gqa": how} if gqa else {})}
                torch.cuda.empty_cache()
    del q, k, v
    torch.cuda.empty_cache()
    return res


varlen = {}   # (hq, hkv, mask) -> list of rounds
head_dims = []  # rows of every round
steps = []


def best(rows):
    ok = [r for r in rows if r and "median_ms" in r]
    return min(ok, key=lambda r: r["median_ms"]) if ok else None


def meta(what, command):
    return {"what": what, "device": device, "commit": os.environ["COMMIT"],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "command": command,
            "commands": sorted(c for c in commands), "device_steps_s": steps}


def write():
    rows = []
    for (hq, hkv, mask), rounds in varlen.items():
        v = best([r["attn_varlen"] for r in rounds])
        d = best([r["attn_dense"] for r in rounds])
        da = best([r["attn_dense_ampere"] for r in rounds])
        if not v:
            continue
        flops, t = v["flops"], v["median_ms"]
        row = {"heads": hq, "kv_heads": hkv, "mask": mask, "sequences": len(v["seq_lens"]),
               "tokens": v["tokens"], "max_len": max(v["seq_lens"]), "useful_tflop": flops / 1e12,
               "attn_varlen": {"ms": t, "tflops": v["gflops"] / 1e3, "kernel": v["kernel"], "rel_l2": v["rel_l2"],
                               "each_round_ms": [r["attn_varlen"]["median_ms"] for r in rounds if r["attn_varlen"]]}}
        for key, x in [("attn_dense", d), ("attn_dense_ampere", da)]:
            if x:
                row[key] = {"batch": x["batch"], "seq": x["seq"], "tokens": x["tokens"], "ms": x["median_ms"],
                            "tflops": x["gflops"] / 1e3, "kernel": x["kernel"]}
                row["varlen_over_" + key] = v["gflops"] / x["gflops"]
        for key in ["sdpa_padded", "sdpa_dense"]:
            found = {}
            for r in rounds:
                for name, x in r.get(key, {}).items():
                    if "ms" in x and ("ms" not in found.get(name, {}) or x["ms"] < found[name]["ms"]):
                        found[name] = x
                    found.setdefault(name, x)
            if found:
                row[key] = found
        for name, x in row.get("sdpa_dense", {}).items():
            if "ms" in x and d:
                x["tflops"] = d["flops"] / (x["ms"] * 1e-3) / 1e12
                row["sdpa_dense_" + name + "_over_attn_dense_time"] = x["ms"] / d["median_ms"]
        for name, x in row.get("sdpa_padded", {}).items():
            if "ms" in x:
                x["useful_tflops"] = flops / (x["ms"] * 1e-3) / 1e12
                row["sdpa_padded_" + name + "_over_attn_varlen_time"] = x["ms"] / t
        rows.append(row)
    vmeta = meta("varlen prefill: 64 sequences of seeded lengths uniform in 128..4096 (attn bench --varlen 128), "
                 "bf16, D=128, against attn dense at the same token count and PyTorch SDPA cuDNN on the padded batch",
                 "bash bench/device/issue33-prefill.sh")
    vmeta.update(
        flops="useful FLOPs: FlashAttention's convention per sequence (4*H*L*L*D, halved when causal, the "
              "diagonal bottom-right on the sequence's own length), summed; SDPA's useful TFLOP/s divide the same "
              "count by its time on the padded batch",
        timing=f"CUDA-event medians of {iters} calls (attn bench; the SDPA calls each behind an untimed one), rounds "
               "interleaved (varlen, dense, dense ampere, SDPA), best round kept",
        sdpa="sdpa_padded: q, k, v [64, H, max_len, 128]; causal: is_causal, no other mask (a valid query sees no "
             "padded key); not causal: `plain` without a mask (the padded work, valid rows then wrong) and "
             "`key_mask` with a boolean key-padding mask (correct); sdpa_dense: [64, H, mean_len, 128]",
        targets="varlen_over_attn_dense >= 0.95 (TFLOP/s ratio, same token count); "
                "sdpa_padded_*_over_attn_varlen_time >= 1.0 (SDPA time / attn time)",
        rows=rows)
    json.dump(vmeta, open(os.path.join(outdir, "h100-varlen-prefill.json"), "w"), indent=1)

    best_dim = {}
    for r in head_dims:
        key = (r["head_dim"], r["mask"])
        if key not in best_dim or r["median_ms"] < best_dim[key]["median_ms"]:
            best_dim[key] = r
    drows = []
    for (d, mask), r in sorted(best_dim.items()):
        nxt = min(x for x in SUPPORTED if x >= d)
        ref = best_dim.get((nxt, mask))
        row = {"head_dim": d, "mask": mask, "batch": r["batch"], "heads": r["heads"], "kernel": r["kernel"],
               "ms": r["median_ms"], "tflops": r["gflops"] / 1e3, "rel_l2": r["rel_l2"], "next_native": nxt,
               "rounds": sum(1 for x in head_dims if (x["head_dim"], x["mask"]) == (d, mask))}
        if ref and d != nxt:
            row["ratio_to_next_scaled"] = r["gflops"] / (ref["gflops"] * d / nxt)
        drows.append(row)
    dmeta = meta("every head dim (multiples of 8 from 8 to 256) on CUDA's default family choice, bf16, S=4096, "
                 "batch 16384/S, heads 2048/D rounded down; TFLOP/s and the ratio to the next natively supported "
                 "head dim's TFLOP/s scaled by D/D_next (target >= 0.9)", "bash bench/device/issue33-prefill.sh")
    dmeta.update(native=NATIVE, next_native_from=SUPPORTED,
                 routing="on sm_90 the Hopper family (flash_sm90_*) runs every multiple of 8 up to 256: 64, 128, 256 "
                         "natively, the others on the next one's kernel padded (_pad; since 75a069b, before which "
                         "they went to the Ampere/Ada family)",
                 timing=f"attn bench: CUDA-event median of {iters} calls per row, one process per round, best round",
                 rows=drows)
    json.dump(dmeta, open(os.path.join(outdir, "h100-head-dims.json"), "w"), indent=1)


def varlen_round(hq, hkv, mask):
    causal = mask == "causal"
    heads = ["--heads", hq, "--kv-heads", hkv, "--dims", 128, "--masks", mask]
    v = (bench(heads + ["--seqs", 4096, "--batch", 64, "--varlen", 128]) or [None])[0]
    r = {"attn_varlen": v, "attn_dense": None, "attn_dense_ampere": None}
    varlen.setdefault((hq, hkv, mask), []).append(r)
    if not v:
        return
    mean = round(v["tokens"] / 64)
    r["attn_dense"] = (bench(heads + ["--seqs", mean, "--batch", 64]) or [None])[0]
    r["attn_dense_ampere"] = (bench(heads + ["--seqs", mean, "--batch", 64], family="ampere") or [None])[0]
    r["sdpa_padded"] = sdpa(64, hq, hkv, max(v["seq_lens"]), causal, v["seq_lens"])
    r["sdpa_dense"] = sdpa(64, hq, hkv, mean, causal)
    show = lambda x: f"{x['median_ms']:.3f} ms {x['gflops']/1e3:.1f} TF" if x else "-"
    print(f"varlen {hq}:{hkv} {mask}: varlen {show(v)} | dense {show(r['attn_dense'])} | dense ampere "
          f"{show(r['attn_dense_ampere'])} | sdpa padded {r['sdpa_padded']} | sdpa dense {r['sdpa_dense']}", flush=True)


def dims_round():
    rows = bench(["--dims", ",".join(map(str, DIMS)), "--seqs", 4096, "--tokens", 16384, "--model-dim", 2048,
                  "--masks", "none,causal"])
    head_dims.extend(rows)
    for r in rows:
        print(f"d{r['head_dim']:<3} {r['mask']:6s} h{r['heads']:<3} {r['median_ms']:8.3f} ms "
              f"{r['gflops']/1e3:6.1f} TF  {r['kernel']}", flush=True)


plan = [("varlen 16:16 round 1", lambda: [varlen_round(16, 16, m) for m in ("causal", "none")]),
        ("head dims round 1", dims_round),
        ("varlen 16:16 round 2", lambda: [varlen_round(16, 16, m) for m in ("causal", "none")]),
        ("head dims round 2", dims_round),
        ("varlen 32:8 round 1", lambda: [varlen_round(32, 8, m) for m in ("causal", "none")]),
        ("varlen 32:8 round 2", lambda: [varlen_round(32, 8, m) for m in ("causal", "none")])]
only = os.environ.get("ONLY", "")
for name, step in plan:
    if only not in name:
        continue
    if left() < 15:
        print(f"time budget spent: {name} not run", flush=True)
        steps.append(f"{name}: not run (budget)")
        continue
    t0 = time.time()
    step()
    steps.append(f"{name}: {time.time() - t0:.0f} s, done at {time.time() - started:.0f} s")
    write()
    print(steps[-1], flush=True)
PY
