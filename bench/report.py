#!/usr/bin/env python3
"""Joins `attn bench` rows with peer rows (same JSON-lines format) into one results file and a
markdown table. Each row of the table is one shape; each implementation gets a throughput
column, ratios are ours / peer.

    report.py --ours ours.jsonl --peer torch.jsonl [--peer ...] --meta meta.json --out results.json
"""
import argparse, json


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip().startswith("{")]


def key(r):
    return (r["dtype"], r["head_dim"], r["seq"], r["causal"], r["batch"], r["heads"])


def median_rounds(rows):
    """Several rounds of the same (impl, shape): keep the median-throughput row, noting the spread."""
    groups = {}
    for r in rows:
        groups.setdefault((r["impl"],) + key(r), []).append(r)
    out = []
    for g in groups.values():
        g.sort(key=lambda r: r["gflops"])
        mid = dict(g[len(g) // 2])
        mid["rounds"] = len(g)
        mid["gflops_rounds"] = [round(r["gflops"], 1) for r in g]
        out.append(mid)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", action="append", required=True)
    ap.add_argument("--peer", action="append", default=[])
    ap.add_argument("--meta", required=True, help="JSON with device, commit, date, command")
    ap.add_argument("--out", required=True)
    ap.add_argument("--unit", default="GFLOP/s", choices=["GFLOP/s", "TFLOP/s"])
    a = ap.parse_args()
    ours_all = [r for p in a.ours for r in load(p)]
    peers_all = [r for p in a.peer for r in load(p)]
    errors = [r for r in ours_all + peers_all if "error" in r]
    rows = median_rounds([r for r in ours_all if "error" not in r])
    peers = median_rounds([r for r in peers_all if "error" not in r])
    meta = json.load(open(a.meta))
    with open(a.out, "w") as f:
        json.dump({**meta, "rows": rows + peers, "errors": errors}, f, indent=1)
    scale = 1e-3 if a.unit == "TFLOP/s" else 1.0
    impls = list(dict.fromkeys(r["impl"] for r in rows + peers))
    by = {}
    for r in rows + peers:
        by.setdefault(key(r), {})[r["impl"]] = r
    ours = list(dict.fromkeys(r["impl"] for r in rows))
    others = [i for i in impls if i not in ours]
    head = ["dtype", "D", "S", "B×H", "mask"] + [f"{i} {a.unit}" for i in impls]
    head += [f"{o} / {p}" for o in ours for p in others]
    head += [f"{i} rel L2" for i in impls]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for k in sorted(by, key=lambda k: (k[0], k[1], k[3], k[2])):
        cells = by[k]
        line = [k[0], str(k[1]), str(k[2]), f"{k[4]}×{k[5]}", "causal" if k[3] else "none"]
        line += [f"{cells[i]['gflops'] * scale:.1f}" if i in cells else "—" for i in impls]
        for o in ours:
            for p in others:
                line.append(f"{cells[o]['gflops'] / cells[p]['gflops']:.2f}x" if o in cells and p in cells else "—")
        line += [f"{cells[i]['rel_l2']:.1e}" if i in cells and cells[i].get("rel_l2") is not None else "—" for i in impls]
        print("| " + " | ".join(line) + " |")
    for e in errors:
        print(f"\n{e['impl']} {e['dtype']} D={e['head_dim']} S={e['seq']} causal={e['causal']}: {e['error']}")


if __name__ == "__main__":
    main()
