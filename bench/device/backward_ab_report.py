"""Reads backward-ab.sh's $OUT/attn.jsonl (backward_bench rows tagged with their setting and round)
and $OUT/torch.jsonl (SDPA's backward), and prints each row's median TFLOP/s over the rounds by
setting and mode, with cuDNN's and flash's beside them and each setting's ratio to the first; and,
where $OUT/clocks.csv holds the GPU's samples (bench/device/clocks.sh), the median SM clock each
setting's rows ran at."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import clocks  # noqa: E402

out = Path(sys.argv[1])
samples = clocks.load(out / "clocks.csv")


def parsed(lines):
    """The JSON rows of a log, skipping a line a call's end cut short."""
    for l in lines:
        if l.startswith("{"):
            try:
                yield json.loads(l)
            except json.JSONDecodeError:
                pass


rows = list(parsed((out / "attn.jsonl").read_text().splitlines()))
peers = {}
if (out / "torch.jsonl").exists():
    for r in parsed((out / "torch.jsonl").read_text().splitlines()):
        if "tflops" in r:
            peers[(r["impl"], r["head_dim"], r["seq"], r["causal"])] = r["tflops"]
settings = list(dict.fromkeys(r["setting"] for r in rows if "setting" in r))
by = defaultdict(list)
mhz = defaultdict(list)  # the SM clock during each row (where sampled)
for r in rows:
    if "tflops" in r:
        by[(r["setting"], r["impl"], r["head_dim"], r["seq"], r["causal"])].append(r["tflops"])
        state = clocks.during(samples, r["t0"], r["t1"]) if "t0" in r else None
        if state:
            mhz[(r["setting"], r["impl"], r["head_dim"], r["seq"], r["causal"])].append(state["sm_mhz"])
shapes = sorted({k[2:] for k in by})
for mode in ("attn", "attn-deterministic"):
    print(f"== {mode}: median TFLOP/s by setting (ratio to {settings[0]}); peers cudnn / flash")
    print("D     S      causal " + " ".join(f"{f:>30}" for f in settings) + "    cudnn   flash")
    for d, s, c in shapes:
        base = by.get((settings[0], mode, d, s, c))
        cells = []
        for f in settings:
            v = by.get((f, mode, d, s, c))
            if not v:
                cells.append(f"{'-':>30}")
                continue
            m = statistics.median(v)
            ratio = f" ({m / statistics.median(base):.3f})" if base else ""
            cells.append(f"{m:>22.1f}{ratio:>8}")
        cu = peers.get(("cudnn", d, s, c), float("nan"))
        fl = peers.get(("flash", d, s, c), float("nan"))
        print(f"{d:<5} {s:<6} {str(c):<6} " + " ".join(cells) + f"  {cu:7.1f} {fl:7.1f}")
    if mhz:
        print(f"== {mode}: median SM clock (MHz) during the rows, by setting")
        for d, s, c in shapes:
            cells = [f"{statistics.median(mhz[(f, mode, d, s, c)]):>30.0f}" if mhz.get((f, mode, d, s, c))
                     else f"{'-':>30}" for f in settings]
            print(f"{d:<5} {s:<6} {str(c):<6} " + " ".join(cells))
for r in rows:
    if "determinism" in r:
        print(r)
