"""Where the time of flashmla's round-schedule kernel (wgmma_rr, sm_90) goes inside one launch:
timestamps (``%globaltimer``, and ``%clock64`` from the program's own start) at the producer's
and both consumers' milestones, per program, as ``scripts/ws_probe.py`` does for wgmma_ws. One
launch of the split kernel alone (no combine): a one-split launch keeps the stamps in the unused
workspace, a launch with splits in the output (which only the combine writes). Diagnostic only:
the instrumented copy of the kernel is built from the current ``graphattn/kernels/wgmma_rr.py``
at run time.

Run from the repository root on an sm_90 GPU:
``PYTHONPATH=. python scripts/rr_probe.py [--by-program] 128x64x2048 64x64x2048`` (heads x rows x
topk, shapes where the launch table picks wgmma_rr); ``--by-program`` adds the fastest and slowest
programs with their SM (``%smid``) and start, by groups of SMs; ``--spread`` launches a second time
with the rows' index sets rolled and says whether a program's finish follows the program, its
tokens or its SM."""
import os
import sys

# this script's folder is on sys.path; the same _probe as wgmma_ws's (stamps in the workspace or the output)
from ws_probe import PROBE, instrument, load_module, probe_launch, report

KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "graphattn", "kernels", "wgmma_rr.py")

# (a line of wgmma_rr.py, the probe put before it) then (a line, the probe put after it); the
# slot numbers are NAMES'.
BEFORE = [
    ("        n0 = start + r * BLOCK_N\n", "        if r == 0:\n            _probe(ws_out_ptr, out_ptr, DIRECT, 20)\n"),
    ("    # Both hold their outputs and sums at the last round's max: add the sums, store.\n",
     "    _probe(ws_out_ptr, out_ptr, DIRECT, WG * 10 + 3)\n"),
    ("\n\n@gluon.jit\ndef _scores_half(", "    _probe(ws_out_ptr, out_ptr, DIRECT, 23)\n"),
]
AFTER = [
    ("        _load_q_first(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope, q_ready, "
     "BLOCK_H, D_NOPE, D_ROPE)\n", "        _probe(ws_out_ptr, out_ptr, DIRECT, 21)\n"),
    ("            _gather_half(kv_ptr, rows1, valid1, k_nope.index(1), k_rope.index(1), ready.index(2), free.index(2),"
     " ph,\n                         0, D_NOPE, D_ROPE)\n", "            if r == 0:\n                _probe(ws_out_ptr, out_ptr, DIRECT, 22)\n"),
    ("            _gather_half_idx(kv_ptr, cur1, pool, stride_kv, k_nope.index(1), k_rope.index(1), ready.index(2),\n"
     "                             free.index(2), ph, 0, D_NOPE, D_ROPE)\n",
     "            if r == 0:\n                _probe(ws_out_ptr, out_ptr, DIRECT, 22)\n"),  # IDX_EARLY
    ("    mbarrier.wait(q_ready, 0)\n", "    _probe(ws_out_ptr, out_ptr, DIRECT, WG * 10 + 1)\n"),
    ("            mbarrier.arrive(free.index(2))  # k1 L\n",
     "            if r == 0:\n                _probe(ws_out_ptr, out_ptr, DIRECT, 2)\n"),
    ("            mbarrier.arrive(free.index(1))  # k0 R\n",
     "            if r == 0:\n                _probe(ws_out_ptr, out_ptr, DIRECT, 12)\n"),
    ("            stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, row_s, o_layout, BLOCK_H, D_NOPE, DIRECT, WG,\n"
     "            CLUSTER, stat_m, NATIVE)\n",
     "    _probe(ws_out_ptr, out_ptr, DIRECT, WG * 10 + 5)\n"),
]
NAMES = {20: "producer round 0", 21: "c0 q copies issued", 22: "round 0 issued", 23: "last round issued",
         1: "c0 q landed", 2: "c0 round 0 done", 3: "c0 loop done", 5: "c0 stored",
         11: "c1 q landed", 12: "c1 round 0 done", 13: "c1 loop done", 15: "c1 stored"}


def instrumented_source() -> str:
    """wgmma_rr's source with the probes."""
    return instrument(KERNEL, "_gather_half", PROBE, BEFORE, AFTER)


SHIFT = 17  # --spread: rows the second launch's index sets are rolled by


def main(specs, by_program=False, spread=False):
    load_module(instrumented_source(), "rrprobe")
    for spec in specs:
        got = probe_launch(spec, "wgmma_rr", "rrprobe")
        if got is None:
            print(f"== {spec}: skipped, a launch of clusters (two splits merged in the kernel) leaves no buffer "
                  "for the stamps")
            continue
        plan, launch = got
        progs = plan.main.grid[0]
        p = launch(0)
        print(f"== {spec}: {progs} programs, {plan.splits} split(s), {plan.main.grid}")
        report(p[:, :32], p[:, 32:], NAMES, 20, [5, 15])
        if by_program:
            by_sm(p, plan.head_blocks)
        if spread:
            follows(p, launch(SHIFT % plan.rows), plan.rows)


def _from_first_start(p, slot: int):
    """Milestone ``slot``'s globaltimer stamps (ns), as µs from the launch's first program's start."""
    return (p[:, slot] - p[:, 20].min()) / 1e3


def by_sm(p, head_blocks: int) -> None:
    """Whether the programs' spread in finishing follows where or when they started: the
    fastest and slowest programs (c1 stored, from the first program's start) with their SM,
    head block and start, and the correlation of the finish with the start."""
    import torch

    start, end = _from_first_start(p, 20), _from_first_start(p, 15)
    order = torch.argsort(end)
    print(f"  finish vs start: correlation {torch.corrcoef(torch.stack([start, end]))[0, 1]:.2f}; "
          f"duration (stored - start) min {(end - start).min():.2f} max {(end - start).max():.2f}")
    for name, sel in (("fastest", order[:6]), ("slowest", order[-6:])):
        print(f"  {name}: " + ", ".join(f"pid {int(i)} sm {int(p[i, 31])} hb {int(i) % head_blocks} "
                                        f"start {start[i]:.2f} end {end[i]:.2f}" for i in sel))
    sm = p[:, 31].long()
    for lo in range(0, int(sm.max()) + 1, 16):  # SMs in groups of 16 (consecutive ids)
        sel = (sm >= lo) & (sm < lo + 16)
        if sel.any():
            print(f"  SMs {lo}-{lo + 15}: {int(sel.sum())} programs, end median {end[sel].median():.2f} "
                  f"max {end[sel].max():.2f}")


def follows(p1, p2, rows: int) -> None:
    """What a program's finish follows: ``p2``'s launch read the index rows of ``p1``'s rolled by
    ``SHIFT``, so its row ``r`` had the tokens of ``p1``'s row ``r - SHIFT``. Correlations of the
    finish (c1 stored, from the launch's first start) with ``p1``'s for the same program, for
    the program with the same tokens, and for the program that ran on the same SM."""
    import torch

    e1, e2 = (_from_first_start(p, 15) for p in (p1, p2))
    same_tokens = e1.view(rows, -1).roll(SHIFT % rows, 0).reshape(-1)
    end_on_sm = {int(sm): float(e) for sm, e in zip(p1[:, 31], e1)}
    on_sm = torch.tensor([end_on_sm.get(int(sm), float("nan")) for sm in p2[:, 31]], dtype=torch.float64)
    ok = ~on_sm.isnan()

    def corr(a, b):
        return torch.corrcoef(torch.stack([a, b]))[0, 1].item()

    print(f"  second launch, index rows rolled by {SHIFT % rows}: finish spread {e2.max() - e2.min():.2f} us; "
          f"correlation with the first launch's for the same program {corr(e2, e1):.2f}, the same tokens "
          f"{corr(e2, same_tokens):.2f}, the same SM {corr(e2[ok], on_sm[ok]):.2f} ({int(ok.sum())} programs)")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--by-program", "--spread")]
    main(args, by_program="--by-program" in sys.argv, spread="--spread" in sys.argv)
