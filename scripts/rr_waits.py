"""Where flashmla's round-schedule kernel (wgmma_rr, sm_90) waits in its steady rounds: each
consumer's and the producer's time in every wait, per round, per program. ``scripts/rr_probe.py``
stamps milestones (when round 0 ends, when the loop ends); this one adds up ``%clock64`` around
each wait of rounds 1 and later (round 0 is the start, which rr_probe times), so that what keeps
a round at 3.84 us at 128 heads against 3.26 without any gather (docs/benchmarks.md, "wgmma_rr
from the inside") is read off, not guessed:

* each consumer: the wait for the first half of its tile (consumer 0: ``k0`` L, consumer 1:
  ``k1`` R), for the second half (``k0`` R, ``k1`` L), for its scores' wgmma, for the other's
  row max (``m1`` / ``m0``), for the other's P (``s1`` / ``s0``), for its P V wgmmas;
* the producer: the wait for each half to be freed (``k0`` L, ``k1`` R, ``k0`` R, ``k1`` L) and
  the time spent issuing the copies.

The waits that a gather's latency shows up in are the consumers' half waits; a wait on the
other consumer (``m``/``s``) is the schedule's, a wgmma wait the tensor cores' (or shared
memory's). The clock read around a wait costs a few cycles, so the instrumented kernel is a few
percent slower than the plain one; the report prints both round times.

Diagnostic only: the instrumented copy of the kernel is built from the current
``graphattn/kernels/wgmma_rr.py`` at run time (``tests/test_scripts.py`` checks that it still
applies and compiles for sm_90). Run from the repository root on an sm_90 GPU:
``PYTHONPATH=. python scripts/rr_waits.py 128x64x2048 64x64x2048 128x8x2048`` (heads x rows x
topk, shapes where the launch table picks wgmma_rr; two splits that would merge in a cluster run
as two plain splits here, as the stamps need the output buffer).
"""
import os
import re
import sys

# this script's folder is on sys.path; the stamp buffer and the launch are ws_probe's
from ws_probe import kernel_source, load_module, probe_launch

KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "graphattn", "kernels", "wgmma_rr.py")

CLOCKS = """

@gluon.jit
def _clk():
    return gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _ns():
    return gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _put(ws_out_ptr, out_ptr, DIRECT: gl.constexpr, r, k, v):
    # round r's slot k of this program (int32, @SLOTS@ a round, rounds from @ROUNDS@ on not kept)
    if DIRECT:  # the workspace is unused
        p = ws_out_ptr.to(gl.pointer_type(gl.int32))
    else:  # the output is the combine's, which does not run
        p = out_ptr.to(gl.pointer_type(gl.int32))
    gl.store(p + gl.program_id(0) * @WORDS@ + r * @SLOTS@ + k, v, mask=r < @ROUNDS@)

"""

# A round's slots (int32): consumer WG's at WG * 10 + i, the producer's at 20 + i: each wait's
# %clock cycles, then at CLOCK and TIMER the partition's %clock and %globaltimer_lo at the
# round's start.
CONSUMER = ["first half", "second half", "scores wgmma", "other's max", "other's P", "own P V", "other's P V"]
PRODUCER = ["free k0 L", "free k1 R", "free k0 R", "free k1 L", "issuing copies"]
BASES = {"consumer 0": 0, "consumer 1": 10, "producer": 20}
CLOCK, TIMER = 7, 8
ROUNDS, SLOTS = 64, 32  # 8 KB a program
WORDS = ROUNDS * SLOTS


def clocks(rounds: int, slots: int) -> str:
    """The Gluon helpers an instrumented kernel gets (:data:`CLOCKS`), for ``rounds`` rounds of
    ``slots`` stamps a program."""
    text = CLOCKS.replace("@SLOTS@", str(slots)).replace("@ROUNDS@", str(rounds))
    return text.replace("@WORDS@", str(rounds * slots)).rstrip("\n") + "\n"


def _timed(body: str, slot: str, indent: str) -> str:
    """``body`` (lines at ``indent``) with the cycles it takes stored in this round's ``slot``."""
    return f"{indent}_t = _clk()\n{body}{indent}_put(ws_out_ptr, out_ptr, DIRECT, r, {slot}, _clk() - _t)\n"


def _wrap(src: str, line: str, slot: str, pre: str = "", nth: int | None = None) -> str:
    """``line`` timed into ``slot`` (it must occur once, or pass ``nth``: its occurrence, from 0);
    ``pre``: a line put before it inside the timed region (an explicit wait the line's own then
    passes at once)."""
    parts = src.split(line)
    if nth is None:
        assert len(parts) == 2, f"rr_waits anchor found {len(parts) - 1} times, not once: {line!r}"
        nth = 0
    indent = line[: len(line) - len(line.lstrip())]
    timed = _timed((indent + pre + "\n" if pre else "") + line, slot, indent)
    return line.join(parts[: nth + 1]) + timed + line.join(parts[nth + 1:])


def _insert(src: str, anchor: str, text: str, after: bool = False) -> str:
    assert src.count(anchor) == 1, f"rr_waits anchor not found once: {anchor!r}"
    return src.replace(anchor, anchor + text if after else text + anchor)


def _round_start(base: str, indent: str, clock: int = CLOCK) -> str:
    """Lines stamping %clock and %globaltimer_lo at a round's start (slots ``base + clock`` and
    the next)."""
    return (f"{indent}_put(ws_out_ptr, out_ptr, DIRECT, r, {base} + {clock}, _clk())\n"
            f"{indent}_put(ws_out_ptr, out_ptr, DIRECT, r, {base} + {clock + 1}, _ns())\n")


def instrumented_source(consumers: bool = True, producer: bool = True) -> str:
    """wgmma_rr's source with the waits timed (the consumers', the producer's)."""
    src = kernel_source(KERNEL)
    src = _insert(src, "\n\n@gluon.jit\ndef _gather_half(", clocks(ROUNDS, SLOTS))
    if consumers:
        src = _consumers(src)
    if producer:
        src = _producer(src)
    return src


def _consumers(src: str) -> str:
    """Every consumer wait timed (:data:`CONSUMER`'s slots from ``WG * 10``)."""
    slot = {name: f"WG * 10 + {i}" for i, name in enumerate(CONSUMER)}
    src = _insert(src, "        q0 = _unknown_zero(r, n_rounds)", _round_start("WG * 10", "        "))
    for tile, half, first in ((0, 0, True), (0, 1, False), (1, 1, True), (1, 0, False)):
        args = "zeros_s, False" if first else "s, True"
        line = f"            s = _scores_half(q_nope, q_rope, k_nope, k_rope, ready, {tile}, {half}, ph, q0, {args})\n"
        src = _wrap(src, line, slot["first half" if first else "second half"],
                    pre=f"mbarrier.wait(ready.index({tile * 2 + half}), ph)")
    src = _wrap(src, "        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))\n", slot["scores wgmma"])
    for bar, name in (("m0", "other's max"), ("m1", "other's max"), ("s1", "other's P"), ("s0", "other's P")):
        src = _wrap(src, f"            mbarrier.wait({bar}_ready, ph)\n", slot[name])
    # P V waits, in the source's order: consumer 0's after its own and after P1 V, consumer 1's
    # after P0 V (its own is the num_outstanding=1 wait)
    done = "            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))\n"
    assert src.count(done) == 3, f"rr_waits expected 3 P V waits, found {src.count(done)}"
    # the last first, so that the earlier ones keep their place
    for nth, name in ((2, "other's P V"), (1, "other's P V"), (0, "own P V")):
        src = _wrap(src, done, slot[name], nth=nth)
    return _wrap(src, "            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))\n", slot["own P V"])


def _producer(src: str) -> str:
    """An explicit timed wait for each half's free before its gather call, then the call timed
    (:data:`PRODUCER`'s slots from 20)."""
    base = BASES["producer"]
    src = _insert(src, "        n0 = start + r * BLOCK_N\n", _round_start(str(base), "        "), after=True)
    calls = [c for c in re.findall(r"( +)(_gather_half(?:_idx)?\((?:.|\n)*?D_NOPE, D_ROPE\)\n)", src)
             if "free.index(" in c[1]]  # the producer's, not _gather_half_idx's own call
    assert len(calls) == 8, f"rr_waits found {len(calls)} gather calls, not 8"
    for indent, call in calls:
        line = indent + call
        free = re.search(r"free\.index\((\d)\)", call).group(1)  # slot * 2 + half (L 0, R 1)
        wait = f"{indent}mbarrier.wait(free.index({free}), ph)\n"
        which = {"0": 0, "3": 1, "1": 2, "2": 3}[free]
        src = src.replace(line, _timed(wait, str(base + which), indent) + _timed(line, str(base + 4), indent), 1)
    return src


def report(p, rounds: int, partitions=None, clock: int = CLOCK) -> None:
    """Per partition, each wait's time in the steady rounds (1 and later; us a round: mean over
    programs and rounds, and the 90th percentile of the programs' means) and in round 0, from
    ``p`` ``[programs, kept rounds, slots]`` (int64) and the split's ``rounds``. ``partitions``:
    ``(name, first slot, labels)`` each (default wgmma_rr's), their round-start stamps at
    ``first slot + clock`` and the next."""
    if partitions is None:
        partitions = [(name, BASES[name], PRODUCER if name == "producer" else CONSUMER) for name in BASES]
    kept = min(rounds, p.shape[1])
    for name, base, labels in partitions:
        clk = p[:, :kept, base + clock]
        ns = p[:, :kept, base + clock + 1]
        if kept < 2:
            print(f"  {name}: one round only")
            continue
        # the clock's rate over every kept round's start; a steady round from round 1's start on
        ghz = (((clk[:, -1] - clk[:, 0]) % 2**32).double() / ((ns[:, -1] - ns[:, 0]) % 2**32).double()).median().item()
        steady = ((ns[:, -1] - ns[:, 1]) % 2**32).double() / (kept - 2) / 1e3 if kept > 2 else None
        line = f"a steady round {steady.mean():.3f} us (p90 {steady.quantile(0.9):.3f}), " if steady is not None else ""
        first = ((ns[:, 1] - ns[:, 0]) % 2**32).double().mean() / 1e3
        print(f"  {name}: round 0 {first:.3f} us, {line}clock {ghz:.2f} GHz; waits in us a round "
              "(steady: mean, p90 | round 0)")
        for i, label in enumerate(labels):
            waits = (p[:, :kept, base + i] % 2**32).double() / ghz / 1e3
            mean = waits[:, 1:].mean(dim=1)
            print(f"    {label:15s} {mean.mean():7.3f} {mean.quantile(0.9):7.3f} | {waits[:, 0].mean():7.3f}")


def main(specs):
    import torch

    from graphattn.cuda import configs

    configs._WGMMA_RR_TILE["cluster_merge"] = 0  # two splits as plain splits: the stamps need the output
    load_module(instrumented_source(), "rrwaits")
    for spec in specs:
        plan, launch = probe_launch(spec, "wgmma_rr", "rrwaits", words=WORDS, dtype=torch.int32)
        p = launch().view(-1, ROUNDS, SLOTS)
        rounds = -(-plan.split_len // 128)
        print(f"== {spec}: {plan.main.grid[0]} programs, {plan.splits} split(s), {rounds} rounds a split")
        report(p, rounds)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
