"""A model of the Hopper kernel's synchronization (kernels/flash_fwd_sm90.cu with its parts:
sm90_scheduler.cuh's piece slots, sm90_mainloop.cuh's loops, sm90_epilogue.cuh's storer), to
check a change to it before a GPU runs it: the producer (`produce`: the piece and Q slots (one or two, with
their barriers; with two, O is staged in its piece's Q slot), the K/V
stages' full and empty mbarriers with their phase parities) and the consumer warpgroups
(`consume` and `mainloop_overlapped`, with TRIM's skipped key tiles, and the ping-pong ring of
named barriers, `await_turn` / `pass_turn`) and, with one Q slot, the storer threads that take
O's TMA stores off the consumers (`store_for`, o_full / o_empty), one coroutine each, run in random interleavings
over random pieces and per-warpgroup key-tile ends. It fails on a deadlock, on a read of a stage
or Q slot that holds another key tile or piece (O's staging in the slot counts as a read), and
on a turn passed twice before it was taken (the named barrier
would then complete without its waiter). A warpgroup stands for its warps and threads: the
barriers here count warpgroups. Keep it in step with the kernel when either changes.

    python3 crates/attn-cuda/kernels/sm90_protocol.py            # the kernel's protocol
    python3 crates/attn-cuda/kernels/sm90_protocol.py --mutants  # five broken ones, each caught

2026-11-25: 3000 random cases of 2-4 consumer warpgroups and 2-3 stages pass; freeing a skipped
tile's stages before they hold it, a skipped piece without its turn, and Q released at the
untrimmed end each fail. 2026-11-26: with one or two Q slots (two freed under the next piece's
first S where O is staged in them, at the last S where O has its own tile, and streamed); two
slots freed at the last S (as one slot is), before O has left the slot, fail, as does a stream
that takes the next piece's slot without waiting for its Q. Later the same day: the producer
hands the next piece out as soon as its slot tests free between this piece's K/V tiles (two
slots), else after the last tile; the stream of pieces (measured slower again) taken out of
the kernel and the model; the storer threads and their O barriers in; 3000 cases pass; five
mutants, O written before the storer's store read it among them, each caught. Then the
speculative softmax: a key tile before a piece's last may issue its S again after freeing its
K stage: K and Q still hold it then (the producer loads a stage's next K only after the V before
it, which waits for the P V that comes after the softmax); 3000 cases pass.
"""
import random
import sys


class Mbarrier:
    """Arrivals complete a phase; try_wait.parity(p) succeeds once the phase of parity p is done."""

    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):
        return (self.phase & 1) != parity


class NamedBarrier:
    """bar.sync / bar.arrive for two warpgroups: it completes at the second arrival."""

    def __init__(self):
        self.arrived, self.waiting, self.generation = 0, 0, 0

    def add(self, waits):
        self.arrived += 1
        self.waiting += waits
        assert not (self.arrived == 2 and self.waiting == 0), "a turn passed twice before it was taken"
        if self.arrived == 2:
            self.arrived = self.waiting = 0
            self.generation += 1


def wait(cond):
    while not cond():
        yield


def run(seed, consumers, stages, q_slots, pieces, ends, mutant=None):
    """One random interleaving; `pieces[t]` = (j0, j1), `ends[t][w]` = warpgroup w's key-tile end."""
    rnd = random.Random(seed)
    k_full, v_full = [Mbarrier(1) for _ in range(stages)], [Mbarrier(1) for _ in range(stages)]
    k_empty, v_empty = [Mbarrier(consumers) for _ in range(stages)], [Mbarrier(consumers) for _ in range(stages)]
    q_full, q_empty = [Mbarrier(1) for _ in range(q_slots)], [Mbarrier(consumers) for _ in range(q_slots)]
    k_holds, v_holds = [None] * stages, [None] * stages  # which (piece, key tile) a stage holds
    q_holds = [None] * q_slots  # which piece's Q (or O, staged) a Q slot holds
    turns = [NamedBarrier() for _ in range(consumers)]
    # STORER (one Q slot, O in its own tile): each warpgroup's part of the O tile, handed to a
    # storer thread (o_full) and given back once its TMA store has read it (o_empty).
    o_full, o_empty = [Mbarrier(1) for _ in range(consumers)], [Mbarrier(1) for _ in range(consumers)]
    o_holds = [None] * consumers  # the piece whose O a warpgroup's part of the O tile holds
    o_at = [None] * consumers  # where the storer is to store it (None: the warpgroup is done)
    slot = [None] * q_slots
    stage = lambda it: it % stages
    phase = lambda it: (it // stages) & 1

    def await_turn(w):
        b = turns[w]
        generation = b.generation
        b.add(waits=1)
        yield from wait(lambda: b.generation > generation)

    def pass_turn(w):
        turns[(w + 1) % consumers].add(waits=0)
        yield

    def producer():
        # produce(): piece 0 goes out first; then each piece's K/V tiles, the next piece handed
        # out after this one's last tile (one Q slot) or as soon as its slot tests free between
        # this one's tiles (two), else after the last.
        it, n = 0, 0

        def hand_out(t):
            nonlocal n
            q = n % q_slots
            parity = ((n // q_slots) & 1) ^ 1
            yield from wait(lambda: q_empty[q].done(parity))
            slot[q] = (t,) + pieces[t] if t < len(pieces) else None
            q_holds[q] = t
            q_full[q].arrive()
            n += 1

        yield from hand_out(0)
        for t in range(len(pieces)):
            handed = False
            for j in range(*pieces[t]):
                st, free = stage(it), phase(it) ^ 1
                yield from wait(lambda: k_empty[st].done(free))
                k_holds[st] = (t, j)
                k_full[st].arrive()
                yield
                yield from wait(lambda: v_empty[st].done(free))
                v_holds[st] = (t, j)
                v_full[st].arrive()
                it += 1
                if q_slots == 2 and not handed and q_empty[n % q_slots].done(((n // q_slots) & 1) ^ 1):
                    yield from hand_out(t + 1)
                    handed = True
            if not handed:
                yield from hand_out(t + 1)

    def consumer(w):
        if w == consumers - 1:
            yield from pass_turn(w)  # warpgroup 0 issues first
        it, stores = 0, 0
        for n in range(len(pieces) + 1):
            q = n % q_slots
            yield from wait(lambda: q_full[q].done((n // q_slots) & 1))
            if slot[q] is None:
                break
            t, j0, j1 = slot[q]
            j_end = min(j1, ends[t][w])
            q_until = j1 if mutant == "q-released-late" else j_end
            # Q is released at the piece's last S with one slot (release_q); with two, the last
            # piece's slot under this piece's first S (free_prev_q), unless the mutant frees two
            # slots as one.
            early = q_slots == 1 or mutant == "two-slots-freed-at-the-last-s"

            def release_q():
                if early:
                    q_empty[q].arrive()

            def free_prev_q():
                if not early and n > 0:
                    q_empty[(n - 1) % q_slots].arrive()

            def read_q():
                assert q_holds[q] == t, f"warpgroup {w} reads Q {t} in slot {q}, which holds {q_holds[q]}"

            if j_end > j0:  # mainloop_computed
                yield from wait(lambda: k_full[stage(it)].done(phase(it)))
                yield from await_turn(w)
                assert k_holds[stage(it)] == (t, j0), f"warpgroup {w} reads K {t, j0}: {k_holds}"
                read_q()
                yield from pass_turn(w)
                free_prev_q()
                k_empty[stage(it)].arrive()
                if q_until - j0 == 1:
                    release_q()
                for j in range(j0 + 1, j_end):
                    prev = it
                    it += 1
                    yield from wait(lambda: k_full[stage(it)].done(phase(it)))
                    yield from await_turn(w)
                    assert k_holds[stage(it)] == (t, j), f"warpgroup {w} reads K {t, j}: {k_holds}"
                    read_q()
                    yield from wait(lambda: v_full[stage(prev)].done(phase(prev)))
                    assert v_holds[stage(prev)] == (t, j - 1), f"warpgroup {w} reads V {t, j - 1}: {v_holds}"
                    yield from pass_turn(w)
                    k_empty[stage(it)].arrive()
                    if j + 1 == q_until:
                        release_q()
                    yield
                    if j + 1 < j_end:  # softmax_speculative may issue S_j again: K and Q still hold it
                        assert k_holds[stage(it)] == (t, j), f"warpgroup {w} reads K {t, j} again: {k_holds}"
                        read_q()
                    assert v_holds[stage(prev)] == (t, j - 1), f"V {t, j - 1} overwritten under warpgroup {w}"
                    v_empty[stage(prev)].arrive()
                yield from wait(lambda: v_full[stage(it)].done(phase(it)))
                yield from await_turn(w)
                assert v_holds[stage(it)] == (t, j_end - 1), f"warpgroup {w} reads V {t, j_end - 1}: {v_holds}"
                yield from pass_turn(w)
                yield
                assert v_holds[stage(it)] == (t, j_end - 1), f"V {t, j_end - 1} overwritten under warpgroup {w}"
                v_empty[stage(it)].arrive()
                it += 1
            else:
                release_q()
                free_prev_q()
                if mutant != "no-turn-for-an-empty-piece":
                    yield from await_turn(w)
                    yield from pass_turn(w)
            for j in range(max(j_end, j0), j1):  # TRIM: key tiles past this warpgroup's rows
                yield from await_turn(w)
                yield from pass_turn(w)
                if mutant != "freed-before-loaded":
                    yield from wait(lambda: k_full[stage(it)].done(phase(it)))
                k_empty[stage(it)].arrive()
                if mutant != "freed-before-loaded":
                    yield from wait(lambda: v_full[stage(it)].done(phase(it)))
                v_empty[stage(it)].arrive()
                it += 1
            if q_slots == 2:  # store_output stages O in the slot, the TMA store reads it
                read_q()
                yield
                read_q()
            else:  # store_output hands O to the storer
                stores = yield from hand_o(w, t, stores)
        if q_slots == 1:  # end_stores
            stores = yield from hand_o(w, None, stores)
        if w == 0:
            yield from await_turn(w)  # the last warpgroup's last arrival

    def hand_o(w, t, stores):
        if mutant != "o-written-before-read":
            yield from wait(lambda: o_empty[w].done((stores & 1) ^ 1))
        o_holds[w], o_at[w] = t, t
        o_full[w].arrive()
        return stores + 1

    def storer(w):  # store_for
        k = 0
        while True:
            yield from wait(lambda: o_full[w].done(k & 1))
            t = o_at[w]
            if t is None:
                return
            assert o_holds[w] == t, f"the storer of warpgroup {w} reads O {o_holds[w]} for piece {t}"
            yield  # the TMA store reads the tile
            assert o_holds[w] == t, f"O {t} of warpgroup {w} overwritten under its store"
            o_empty[w].arrive()
            k += 1

    procs = [producer()] + [consumer(w) for w in range(consumers)]
    if q_slots == 1:
        procs += [storer(w) for w in range(consumers)]
    alive, steps = list(range(len(procs))), 0
    while alive:
        i = rnd.choice(alive)
        try:
            next(procs[i])
        except StopIteration:
            alive.remove(i)
        steps += 1
        assert steps < 20000, "deadlock"  # passing cases take a few thousand steps


def failures(mutant=None, cases=3000):
    failed = []
    for seed in range(cases):
        r = random.Random(seed)
        consumers, stages, q_slots = r.choice([2, 3, 4]), r.choice([2, 3]), r.choice([1, 2])
        pieces, ends = [], []
        for _ in range(r.randint(1, 5)):
            j1 = r.randint(1, 6)
            pieces.append((0, j1))
            # Rows further down see more keys; some pieces untrimmed.
            trimmed = r.random() >= 0.3
            ends.append(sorted(r.randint(0, j1) for _ in range(consumers)) if trimmed else [j1] * consumers)
        try:
            run(seed, consumers, stages, q_slots, pieces, ends, mutant)
        except AssertionError as e:
            failed.append(
                f"seed {seed}: {consumers} consumers, {stages} stages, {q_slots} Q slots, pieces {pieces}, ends {ends}: {e}"
            )
    return failed


if __name__ == "__main__":
    failed = failures()
    print(f"the kernel's protocol: {len(failed)} of 3000 cases fail")
    for line in failed[:5]:
        print("  " + line)
    ok = not failed
    if "--mutants" in sys.argv:
        for mutant in ["freed-before-loaded", "no-turn-for-an-empty-piece", "q-released-late", "two-slots-freed-at-the-last-s",
                       "o-written-before-read"]:
            caught = failures(mutant)
            print(f"mutant {mutant}: {len(caught)} of 3000 cases fail" + (f" (first: {caught[0]})" if caught else ""))
            ok &= bool(caught)
    sys.exit(0 if ok else 1)
