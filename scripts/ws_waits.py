"""Where flashmla's warp-specialised kernel (wgmma_ws, sm_90) waits, per pair of tiles: what
``scripts/rr_waits.py`` does for wgmma_rr, for the kernel that runs 656-byte FP8 tokens at 64-128
heads (issue 14's 128-head bar: 363-390 TFLOP/s against 410) and bf16 where wgmma_rr would have
few programs. Each consumer's loop takes the other's tile ``t - 1`` and its own ``t``; a
"round" here is that pair (``r = t // 2``), and the report's waits are a round's:

* each consumer: the other's tile landing and its half of that tile dequantised (FP8), the
  wait for the other's P, its own tile landing, its own half dequantised and the wait for the
  other consumer's half of it (FP8), the other's P V wgmma, its scores' wgmma, and its own tile
  (softmax, P handed over, its P V and that wgmma's wait);
* the producer: the wait for each slot to be freed, and the time each slot's copies take to issue.

Run from the repository root on an sm_90 GPU:
``PYTHONPATH=. python scripts/ws_waits.py [--kv-fp8] 128x64x2048 128x8x2048`` (heads x rows x topk;
bf16 kv runs wgmma_ws here even where the launch table picks wgmma_rr, as in ws_probe; two splits
that would merge in a cluster run as plain splits, as the stamps use the output buffer).
Diagnostic only: the instrumented copy is built from the current ``graphattn/kernels/wgmma_ws.py``
at run time (``tests/test_scripts.py`` checks that it still applies and compiles for sm_90).
"""
import os
import sys

# this script's folder is on sys.path
from rr_waits import _insert, _round_start, _timed, _wrap, clocks, report
from ws_probe import kernel_source, load_module, probe_launch

KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "graphattn", "kernels", "wgmma_ws.py")

CONSUMER = ["other's landed", "its half dequant", "other's P", "mine landed", "my half dequant",
            "other's half", "other's P V", "scores wgmma", "own tile"]
PRODUCER = ["free slot 0", "free slot 1", "issue slot 0", "issue slot 1"]
BASES = {"consumer 0": 0, "consumer 1": 12, "producer": 24}
CLOCK = 9  # a partition's round-start stamps: its base + 9 (%clock) and + 10 (%globaltimer_lo)
ROUNDS, SLOTS = 32, 36  # 4.5 KB a program
NOWHERE = 1 << 20  # a round index past ROUNDS: the stamps of the loop's last other tile are not kept


def instrumented_source() -> str:
    """wgmma_ws's source with the waits timed."""
    src = kernel_source(KERNEL)
    src = _insert(src, "\n\n@gluon.jit\ndef _producer(", clocks(ROUNDS, SLOTS))
    return _producer(_other_tile(_consumers(src)))


def _slot(name: str) -> str:
    return f"WG * 12 + {CONSUMER.index(name)}"


def _consumers(src: str) -> str:
    """The consumer loop's waits, a round being the other's tile and mine (``r = t // 2``)."""
    loop = "    for t in range(2 - WG, n_tiles, 2):\n"
    src = _insert(src, loop, "        r = t // 2\n" + _round_start("WG * 12", "        ", CLOCK), after=True)
    # consumer 0's round 0 is its tile 0, before the loop
    src = _insert(src, "    if WG == 0:\n        if n_tiles > 0:\n",
                  "            r = 0\n" + _round_start("WG * 12", "            ", CLOCK), after=True)
    # _other_tile times its own waits (below): both its calls pass the stamps' arguments, the
    # last other tile after the loop a round that is not kept
    tail = "    if (n_tiles > 0) & ((n_tiles - 1) % 2 != WG):\n"
    src = _insert(src, tail, f"        r = {NOWHERE}\n", after=True)
    call = "HALF, WG,\n                                KV_FP8, fp8)\n"
    assert src.count(call) == 2, f"ws_waits expected 2 _other_tile calls, found {src.count(call)}"
    src = src.replace(call, call.replace("fp8)", "fp8, ws_out_ptr, out_ptr, DIRECT, r)"))
    # my half of my tile: _dequantise_mine's two steps, each timed, after the wait for the tile
    mine = ("            _dequantise_mine(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, d_ready)\n")
    ind = "            "
    steps = (_timed(f"{ind}mbarrier.wait(kv_ready.index(t % 2), (t // 2) & 1)\n", _slot("mine landed"), ind)
             + _timed(f"{ind}_dequantise_rows(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, 0, "
                      "BLOCK_N // 2, D_NOPE, D_ROPE)\n", _slot("my half dequant"), ind)
             + _timed(f"{ind}mbarrier.wait(d_ready.index(t % 2), (t // 2) & 1)\n", _slot("other's half"), ind))
    src = _insert(src, mine, steps)
    src = src.replace(steps + mine, steps, 1)  # the call itself goes
    src = _wrap(src, "        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))\n"
                     "        mbarrier.arrive(kv_free.index((t - 1) % 2))\n", _slot("other's P V"))
    scores = "        s = _issue_scores(q_nope, q_rope, k_nope, k_rope, kv_ready, t, _unknown_zero(t, n_tiles)"
    landed = _timed("            mbarrier.wait(kv_ready.index(t % 2), (t // 2) & 1)\n", _slot("mine landed"),
                    "            ")
    src = _insert(src, scores, "        if KV_FP8 == 0:  # (FP8: waited for before my half's dequantisation)\n" + landed)
    # the loop's, not tile 0's before it (whose deeper indent also contains this text)
    src = _wrap(src, "        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))\n", _slot("scores wgmma"), nth=1)
    return _wrap(src, "        m, l, acc = _own_tile(s, idx_s, t, m, l, acc, k_nope, k_rope, stat_m, p_ready, kv_free, "
                      "pool, qk_scale,\n                              row_o, HALF, WG)\n", _slot("own tile"))


def _other_tile(src: str) -> str:
    """_other_tile with the stamps' arguments, its tile's landing, its half's dequantisation and
    the wait for its P timed."""
    sig = "                HALF: gl.constexpr, WG: gl.constexpr, KV_FP8: gl.constexpr, fp8):\n"
    assert src.count(sig) == 1, "ws_waits: _other_tile's signature not found once"
    src = src.replace(sig, sig.replace("fp8):", "fp8, ws_out_ptr, out_ptr, DIRECT: gl.constexpr, r):"))
    ind = "        "
    deq = ("        _dequantise_rows(o, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, N // 2, N // 2,\n"
           "                         k_nope.shape[2], k_rope.shape[2])\n")
    src = _wrap(src, deq, _slot("its half dequant"))
    src = _insert(src, "        _t = _clk()\n" + deq,
                  _timed(f"{ind}mbarrier.wait(kv_ready.index(o % 2), (o // 2) & 1)\n", _slot("other's landed"), ind))
    return _wrap(src, "    mbarrier.wait(p_ready.index(o % 2), (o // 2) & 1)\n", _slot("other's P"))


def _producer(src: str) -> str:
    """Each tile's wait for its free slot and its copies' issue, a round being two tiles."""
    src = _insert(src, "        slot = j % SLOTS\n", "        r = j // 2\n        if j % 2 == 0:\n"
                  + _round_start("24", "            ", CLOCK), after=True)
    src = _wrap(src, "        mbarrier.wait(kv_free.index(slot), ((j // SLOTS) & 1) ^ 1)\n", "24 + j % 2")
    arrive = "        _async_copy.mbarrier_arrive(kv_ready.index(slot * OWNERS + j % OWNERS), increment_count=False)\n"
    src = _insert(src, "        if KV_FP8:  # the tokens' bytes", "        _t = _clk()\n")
    return _insert(src, arrive, "        _put(ws_out_ptr, out_ptr, DIRECT, r, 26 + j % 2, _clk() - _t)\n", after=True)


def main(argv):
    import torch

    from graphattn.cuda import configs

    kv_fp8 = "--kv-fp8" in argv
    configs.WGMMA_RR_MIN_PROGRAMS = 1 << 30  # bf16 runs wgmma_ws at every size (as in ws_probe)
    for tile in (configs._WGMMA_TILE, configs._WGMMA_FP8_TILE):
        tile["cluster_merge"] = 0  # two splits as plain splits: the stamps need the output
    load_module(instrumented_source(), "wswaits")
    partitions = [(name, base, PRODUCER if name == "producer" else CONSUMER) for name, base in BASES.items()]
    for spec in [a for a in argv if a != "--kv-fp8"]:
        plan, launch = probe_launch(spec, "wgmma_ws", "wswaits", words=ROUNDS * SLOTS, dtype=torch.int32,
                                    kv_fp8=kv_fp8)
        p = launch().view(-1, ROUNDS, SLOTS)
        tiles = -(-plan.split_len // 64)
        print(f"== {spec}{' FP8' if kv_fp8 else ''}: {plan.main.grid[0]} programs, {plan.splits} split(s), "
              f"{tiles} tiles a split")
        report(p, -(-tiles // 2), partitions, CLOCK)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
