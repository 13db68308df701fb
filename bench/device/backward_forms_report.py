"""Reads backward-forms.sh's $OUT/attn.jsonl (backward_bench rows tagged with their form and round)
and $OUT/torch.jsonl (SDPA's backward), and prints each row's median TFLOP/s over the rounds by
form and mode, with cuDNN's and flash's beside them and each form's ratio to the first form."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "attn.jsonl").read_text().splitlines() if l.startswith("{")]
peers = {}
if (out / "torch.jsonl").exists():
    for l in (out / "torch.jsonl").read_text().splitlines():
        if l.startswith("{"):
            r = json.loads(l)
            if "tflops" in r:
                peers[(r["impl"], r["head_dim"], r["seq"], r["causal"])] = r["tflops"]
forms = list(dict.fromkeys(r["form"] for r in rows if "form" in r))
by = defaultdict(list)
for r in rows:
    if "tflops" in r:
        by[(r["form"], r["impl"], r["head_dim"], r["seq"], r["causal"])].append(r["tflops"])
shapes = sorted({k[2:] for k in by})
for mode in ("attn", "attn-deterministic"):
    print(f"== {mode}: median TFLOP/s by form (ratio to {forms[0]}); peers cudnn / flash")
    print("D     S      causal " + " ".join(f"{f:>20}" for f in forms) + "    cudnn   flash")
    for d, s, c in shapes:
        base = by.get((forms[0], mode, d, s, c))
        cells = []
        for f in forms:
            v = by.get((f, mode, d, s, c))
            if not v:
                cells.append(f"{'-':>20}")
                continue
            m = statistics.median(v)
            ratio = f" ({m / statistics.median(base):.3f})" if base else ""
            cells.append(f"{m:>12.1f}{ratio:>8}")
        cu = peers.get(("cudnn", d, s, c), float("nan"))
        fl = peers.get(("flash", d, s, c), float("nan"))
        print(f"{d:<5} {s:<6} {str(c):<6} " + " ".join(cells) + f"  {cu:7.1f} {fl:7.1f}")
for r in rows:
    if "determinism" in r:
        print(r)
