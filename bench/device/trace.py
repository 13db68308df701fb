#!/usr/bin/env python3
"""Where a traced Hopper kernel's cycles go: reads the CSV timelines that `ATTN_CUDA_SM90_TRACE`
builds write (crates/attn-cuda/kernels/sm90_trace.cuh, `trace_put`) and prints, per file, the
clock, each consumer warpgroup's piece split into its steps, the waits, the producer's lead, and
a fit of a piece's cycles against its key tiles (intercept = what a piece costs beyond its key
tiles). Usage: trace.py FILE.csv [...]. Event names follow the kernel's enums, in order."""
import statistics
import sys

PIECES = 64  # TRACE_PIECES: the row of a CTA's own stamps
PRODUCER = 4  # TRACE_ROLES - 1
(C_START, C_Q_READY, C_FIRST_S, C_LOOP_END, C_STORED, C_K_WAIT, C_V_WAIT, C_TURN_WAIT,
 C_FIRST_ISSUED, C_STORE_SYNCED, C_STORE_WRITTEN, C_STORE_FENCED, C_STORE_SUMMED, C_STORE_WAITED) = range(14)
P_ANNOUNCE, P_ANNOUNCED, P_ISSUED, P_K_WAIT, P_V_WAIT, P_PIECE = range(6)
CTA_START, CTA_END, CTA_SM, CTA_GLOBAL_START, CTA_GLOBAL_END = range(5)


def load(path):
    ctas = {}
    with open(path) as f:
        next(f)
        for line in f:
            cta, piece, role, *ev = (int(x) for x in line.split(","))
            ctas.setdefault(cta, {})[(piece, role)] = ev
    return ctas


def stats(xs):
    if not xs:
        return "n/a"
    xs = sorted(xs)
    return f"median {xs[len(xs) // 2]:.0f}, mean {statistics.fmean(xs):.0f}, p90 {xs[int(0.9 * (len(xs) - 1))]:.0f}"


def fit(points):
    """Least squares y = a + b x."""
    n = len(points)
    if n < 2:
        return float("nan"), float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return float("nan"), my / mx if mx else float("nan")
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def report(path):
    ctas = load(path)
    consumers = 1 + max(r for rows in ctas.values() for (p, r) in rows if p < PIECES and r < PRODUCER)
    print(f"== {path}: {len(ctas)} CTAs, {consumers} consumer warpgroups")
    spans, mhz, tiles_total = [], [], []
    steps = {k: [] for k in ("q_wait", "first_s", "loop", "store", "gap", "period")}
    # The first S and the store in their parts, where the build stamps them (0: not stamped).
    parts = {k: [] for k in ("first: wait K and turn, issue", "first: S done", "store: sum, sync",
                             "store: sums", "store: wait for the last store's read", "store: sync",
                             "store: shared writes", "store: fence, sync", "store: TMA issue")}
    waits = {k: [] for k in ("k", "v", "turn")}
    per_tile, points, q_latency, announce_wait, lead = [], [], [], [], []
    for cta, rows in ctas.items():
        own = rows.get((PIECES, 0))
        if own is None:
            continue
        span = own[CTA_END] - own[CTA_START]
        spans.append(span)
        if own[CTA_GLOBAL_END] > own[CTA_GLOBAL_START]:
            mhz.append(span / (own[CTA_GLOBAL_END] - own[CTA_GLOBAL_START]) * 1e3)
        # The buffer keeps what earlier launches wrote past this launch's last piece: a row
        # counts only if stamped inside this CTA's span.
        def fresh(ev, e):
            return own[CTA_START] <= ev[e] <= own[CTA_END]
        n_pieces = 0
        while (n_pieces, PRODUCER) in rows and fresh(rows[(n_pieces, PRODUCER)], P_ANNOUNCE):
            n_pieces += 1
        total = 0
        for n in range(n_pieces):
            prod = rows.get((n, PRODUCER))
            if prod is None:
                continue
            j0, j1 = (prod[P_PIECE] >> 16) & 0xFFFF, prod[P_PIECE] & 0xFFFF
            total += j1 - j0
            announce_wait.append(prod[P_ANNOUNCED] - prod[P_ANNOUNCE])
            for w in range(consumers):
                c = rows.get((n, w))
                if c is None or not fresh(c, C_START):
                    continue
                if len(c) > C_STORE_WAITED and all(c[e] for e in (C_STORE_SUMMED, C_STORE_SYNCED, C_STORE_FENCED)):
                    for k, (a, b) in zip(parts, ((C_Q_READY, C_FIRST_ISSUED), (C_FIRST_ISSUED, C_FIRST_S),
                                                 (C_LOOP_END, C_STORE_SYNCED), (C_LOOP_END, C_STORE_SUMMED),
                                                 (C_STORE_SUMMED, C_STORE_WAITED), (C_STORE_WAITED, C_STORE_SYNCED),
                                                 (C_STORE_SYNCED, C_STORE_WRITTEN),
                                                 (C_STORE_WRITTEN, C_STORE_FENCED), (C_STORE_FENCED, C_STORED))):
                        if c[a] and c[b]:
                            parts[k].append(c[b] - c[a])
                steps["q_wait"].append(c[C_Q_READY] - c[C_START])
                q_latency.append(c[C_Q_READY] - prod[P_ANNOUNCED])
                if c[C_FIRST_S]:
                    steps["first_s"].append(c[C_FIRST_S] - c[C_Q_READY])
                    steps["loop"].append(c[C_LOOP_END] - c[C_FIRST_S])
                    if j1 - j0 > 1:
                        per_tile.append((c[C_LOOP_END] - c[C_FIRST_S]) / (j1 - j0 - 1))
                steps["store"].append(c[C_STORED] - c[C_LOOP_END])
                waits["k"].append(c[C_K_WAIT])
                waits["v"].append(c[C_V_WAIT])
                waits["turn"].append(c[C_TURN_WAIT])
                lead.append(c[C_START] - prod[P_ANNOUNCED])
                nxt = rows.get((n + 1, w)) if n + 1 < n_pieces else None
                if nxt is not None and fresh(nxt, C_START):
                    steps["gap"].append(nxt[C_START] - c[C_STORED])
                    steps["period"].append(nxt[C_START] - c[C_START])
                    if w == 0:
                        points.append((j1 - j0, nxt[C_START] - c[C_START]))
        tiles_total.append(total)
    all_tiles = sum(tiles_total)
    print(f"SM clock {stats(mhz)} MHz; CTA span {stats(spans)} cycles; "
          f"{all_tiles} key tiles over {len(spans)} CTAs: {sum(spans) / max(all_tiles, 1):.0f} CTA cycles per key tile")
    for k, v in steps.items():
        print(f"  consumer {k:8s} {stats(v)}")
    for k, v in parts.items():
        if v:
            print(f"    {k:32s} {stats(v)}")
    for k, v in waits.items():
        print(f"  consumer wait {k:5s} per piece {stats(v)}")
    print(f"  loop cycles per key tile after the first: {stats(per_tile)}")
    a, b = fit(points)
    print(f"  fit, warpgroup 0: piece period = {a:.0f} + {b:.0f} x key tiles ({len(points)} pieces; "
          f"intercept = {a / b if b == b and b else float('nan'):.2f} key tiles)")
    print(f"  producer: announce wait {stats(announce_wait)}")
    print(f"  Q ready after the producer announced it: {stats(q_latency)}; "
          f"consumer start after the announcement: {stats(lead)}")
    total_cycles = sum(spans) * consumers
    for k in ("q_wait", "first_s", "store", "gap"):
        print(f"  share of consumer cycles in {k}: {100 * sum(steps[k]) / max(total_cycles, 1):.1f}%")
    for k in ("k", "v", "turn"):
        print(f"  share of consumer cycles waiting {k}: {100 * sum(waits[k]) / max(total_cycles, 1):.1f}%")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        report(p)
