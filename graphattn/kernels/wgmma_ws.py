"""flashmla's warp-specialised split kernel for sm_90 (Hopper), in Gluon: a producer warpgroup
gathers KV tiles while two consumer warpgroups take turns computing the scores.

One program per (row, split, 64-head block), three warpgroups (launch ``num_warps=4`` and
``maxnreg=168``; ``gl.warp_specialize`` runs the producer in the default partition and the two
consumers as workers, registers moved to them with ``setmaxnreg``: 232 each, 40 for the producer):

* **producer**: gathers 64-token KV tiles with 16-byte ``cp.async`` copies into two
  shared-memory slots; each thread's copies complete on the slot's ``ready`` mbarrier
  (``cp.async.mbarrier.arrive.noinc``), so no consumer waits on copy groups. A slot takes the
  tile two ahead once both consumers released it (``free``, two arrivals). Consumer 0 issues
  q's copies (once, on ``q_ready``) before its first wait, so the first gather does not queue
  behind them.
* **consumers**: consumer ``w`` owns the tiles ``t`` with ``t % 2 == w``. For its own tile it
  computes the whole score tile ``S = q K^T`` (``[64, 64]``, q resident in shared memory), the
  online softmax (row max and sum within the warpgroup: no cross-warpgroup reduction), writes
  ``P`` (bf16/fp16) over the tile's rope columns (free once its scores are done) and publishes
  the new row max; then adds ``P V`` for its half of the 512 output columns. For the other's
  tile it waits for that ``P`` and max, rescales its half of the output and adds ``P V`` for it.
  Each KV tile is gathered once per 64 heads and its scores computed once; the row sum is split
  between the consumers (each sums its own tiles' ``P``) and added at the end.

Order per consumer (iteration: the other's tile ``t - 1``, then mine, ``t``): wait for the
other's ``P`` -> its ``P V`` -> release that tile -> wait for tile ``t`` -> scores -> softmax ->
publish ``P`` -> my ``P V`` -> release tile ``t``. A tile is released right after its last
product, so its slot's next gather overlaps the following tile's scores, softmax and products
(issuing the scores before releasing measured 1.2x slower: docs/benchmarks.md). Every mbarrier
wait depends only on work issued earlier by the other partitions: no cycle.

**656-byte FP8 tokens** (``KV_FP8=1``, e4m3fn; graphattn.common.kv_layout): the producer gathers
each token's 512 FP8 bytes into the upper half of the slot's nope tile (its bytes viewed as
uint8), its 4 float32 scales into a small ring of their own and its bf16 rope into the rope
tile, all by ``cp.async`` on the same ``ready`` barrier. The tile is dequantised in place,
``dtype(float32(fp8) * scale)`` (:func:`~graphattn.kernels.wgmma_dequant._dequantise_rows`: the
values of block ``b`` overwrite bytes of their own token already read), by both consumers at
once: the owner its first 32 tokens while the other's ``P V`` runs, the other consumer the last
32 before it waits for the owner's ``P`` (it is idle then), saying so on the slot's ``d_ready``
barrier; the schedule is then the bf16 one: FP8 KV means the products of a cache dequantised to
q's dtype. Dequantising in the producer measured 1.34x slower (its 40 registers leave it no
overlap: docs/benchmarks.md).

Outputs and conventions are those of ``_flashmla_split_kernel`` (graphattn.kernels.flashmla): a
normalised partial (or the final ``out``/``lse`` with ``DIRECT``), scores in base 2, an index
outside ``[0, pool)`` never read, heads ``>= H`` of the last head block masked (zeros in, never
stored). bf16/fp16 q; kv in q's dtype or FP8 tokens, with 16-byte aligned rows. With
``PARTIAL_NATIVE`` (heads a multiple of 16; a partly-masked block holds only its own heads) a
partial is stored in the accumulator's own order, in f32 (1) or q's dtype (2)
(:func:`_store_partial`; ``wgmma_rr`` stores its partials the same way), which the combine launch
of :mod:`graphattn.kernels.wgmma_combine` reads.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .wgmma import (
    _OPAQUE_ZERO,
    _async_load,
    _cluster_arrive,
    _cluster_wait,
    _cta_barrier,
    _gather_tile,
    _launch_dependents,
    _load_indices,
    _load_q,
    _opaque_zero,
    _prefetch_indices_l2,
    _program_split,
    _reinterpret,
    _unknown_zero,
)
from .wgmma_dequant import (
    FP8_BLOCK,
    FP8_GATHER,
    FP8_SCALES,
    _dequantise_mine,
    _dequantise_rows,
    _fp8_views,
    _gather_fp8,
)

# Registers per thread of each consumer (setmaxnreg). The launch caps every thread at 168
# (``maxnreg`` in graphattn.cuda.configs: 12 warps x 32 x 168 <= 65536); the default partition
# (the producer) keeps what is left, 3 * 168 - 2 * 232 = 40. With these and q's wgmma
# descriptors built inside the loop (see _issue_scores), ptxas (triton 3.6) reports no spills;
# 224/56 spilled in the consumers, and the producer's [64, 512] gather needs rows spread over
# lanes (threads_per_warp [2, 16]) to fit in 40.
CONSUMER_REGS = gl.constexpr(232)

# f32 outputs staged in shared memory for a merge (rows of 128 bytes or more): 32-byte groups
# swizzled by row % 4. A wgmma accumulator's 8-byte stores (and loads in its layout) cover 4 rows
# x 32 bytes a half-warp, which then fill the 32 banks. The 8-byte groups wgmma_tn's and
# wgmma_rr's merges had (vec=2, max_phase=8) put them in 8 banks, 4-way conflicted (Nsight Compute
# on the H200: 3.6x the ideal wavefronts of wgmma_tn's merge), the 16-byte groups of wgmma_ws's
# cluster merge (vec=4) in 16, 2-way (tests/test_kernels_aot.py models all three).
F32_STAGE = gl.constexpr(gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=4, order=[1, 0]))
# The gathers' layouts, for 4 warps: the [64, 512] nope columns with rows spread over lanes (the
# producer's 40 registers), and the [64, 64] rope columns.
GATHER_N = gl.constexpr(gl.BlockedLayout(
    size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[4, 1], order=[1, 0]))
GATHER_R = gl.constexpr(gl.BlockedLayout(
    size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1], order=[1, 0]))
# Rows a pass of the producer's cluster merge (_producer_merge; it has 40 registers): 4 measured
# 1% faster than 8 at FP8 64 x 64 and 128 x 32 (docs/benchmarks.md), both spilling a little there.
MERGE_ROWS = gl.constexpr(4)


@gluon.jit
def _producer(smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
              H, pool, qk_scale, row, hb, split, start, end, n_tiles,
              stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
              DIRECT: gl.constexpr, KV_FP8: gl.constexpr, CLUSTER: gl.constexpr = 0, o_ready=None,
              o_wts=None, SLOTS: gl.constexpr = 2, OWNERS: gl.constexpr = 1, IDX_EARLY: gl.constexpr = 0):
    """Default partition (4 warps): every KV tile of the split into its slot, and for wgmma_tn
    (``BLOCK_H`` 16 or 32) q first (wgmma_ws's consumer 0 loads its q: :func:`_load_q_first`,
    so the first tile's gather goes out without waiting behind q's copies). With
    ``KV_FP8`` a tile is the tokens' 512 FP8 bytes, copied into the upper half of the slot's nope
    tile (``k_raw``: its bytes as uint8), their 4 float32 scales into ``k_scale`` and their 64
    bf16 rope values into the rope tile (``k_rope_bits``: its bytes as bf16), all completing on
    the slot's ``ready`` barrier; the consumers dequantise it in place before its scores.
    ``SLOTS``: the ring's slots (wgmma_tn's FP8 ring, ``RING``, gathers the bytes into a ring of
    their own, ``k_raw`` ``[SLOTS, BLOCK_N, 512]``, whose slots its consumers free once read).
    ``OWNERS=2`` (wgmma_tn's ``RAW_TILE``: one raw slot, tile ``j`` consumer ``j % 2``'s): a
    slot has a ready barrier per consumer, ``kv_ready[slot * 2 + consumer]``, so that a consumer
    never waits on a phase of the other's (a parity wait cannot tell a use of a slot from the one
    after it). ``IDX_EARLY`` (wgmma_tn): the split's indices are asked of L2 first and each
    tile's are loaded two tiles ahead instead of one."""
    q_nope, q_rope, k_nope, k_rope, stat_m, stat_l, k_raw, k_scale, k_rope_bits, k_scale_rows = smem
    q_ready, kv_ready, kv_free, p_ready, l_ready, d_ready = bars
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir

    if BLOCK_H < 64:  # wgmma_tn: q (9-18 KB) from here (its consumer loading it measured slower)
        _load_q_first(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope, q_ready,
                      BLOCK_H, D_NOPE, D_ROPE)

    # A tile's indices in the two layouts its gather takes (the next tile's load during this one).
    if IDX_EARLY:  # the split's indices into L2, then each tile's loaded two tiles ahead
        _prefetch_indices_l2(idx_row_ptr, start, end)
    idx_a, idx_b = _tile_indices(idx_row_ptr, start, end, BLOCK_N, KV_FP8, GATHER_N, GATHER_R)
    if IDX_EARLY:
        idx_a2, idx_b2 = _tile_indices(idx_row_ptr, start + BLOCK_N, end, BLOCK_N, KV_FP8, GATHER_N, GATHER_R)
    for j in range(0, n_tiles):
        slot = j % SLOTS
        # Slot free: its consumers are done with tile j - SLOTS (a fresh barrier passes phase 1).
        mbarrier.wait(kv_free.index(slot), ((j // SLOTS) & 1) ^ 1)
        if KV_FP8:  # the tokens' bytes: the consumers dequantise them (_dequantise_rows)
            # in place: the upper half of the nope tile's bytes; a ring of their own: all of a slot
            raw_dst = k_raw.index(slot).slice(k_raw.shape[2] - D_NOPE, D_NOPE, dim=1)
            _gather_fp8(kv_ptr, stride_kv, pool, idx_a, idx_b, raw_dst,
                        k_rope_bits.index(slot), k_scale.index(slot), D_NOPE, D_ROPE, FP8_GATHER, GATHER_R,
                        FP8_SCALES)
        else:
            _gather_tile(kv_ptr, stride_kv, pool, idx_a, idx_b, k_nope.index(slot), k_rope.index(slot),
                         D_NOPE, D_ROPE, GATHER_N, GATHER_R)
        _async_copy.mbarrier_arrive(kv_ready.index(slot * OWNERS + j % OWNERS), increment_count=False)
        if IDX_EARLY:
            idx_a, idx_b = idx_a2, idx_b2
            n_next = start + (j + 2) * BLOCK_N
            idx_a2, idx_b2 = _tile_indices(idx_row_ptr, n_next, end, BLOCK_N, KV_FP8, GATHER_N, GATHER_R)
        else:
            n_next = start + (j + 1) * BLOCK_N
            idx_a, idx_b = _tile_indices(idx_row_ptr, n_next, end, BLOCK_N, KV_FP8, GATHER_N, GATHER_R)
    if CLUSTER:  # the two splits' merge, once both consumers have staged their halves
        mbarrier.wait(o_ready, 0)
        _producer_merge(q_nope, k_nope, stat_m, o_wts, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr, row, hb, split, H,
                        stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, BLOCK_H, D_NOPE)


@gluon.jit
def _load_q_first(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope, q_ready,
                  BLOCK_H: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    """cp.async this program's q into shared memory, completing on ``q_ready`` (one arrival per
    thread of the calling warpgroup). wgmma_ws's consumer 0 calls it first thing: from the
    producer, the first tile's indices and gather waited behind q's copies (probed: the gather
    went out 3.3 us into the program); wgmma_tn's producer calls it before its first gather."""
    _load_q(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope.index(0), q_rope.index(0),
            BLOCK_H, D_NOPE, D_ROPE, GATHER_N, GATHER_R)
    _async_copy.mbarrier_arrive(q_ready, increment_count=False)


@gluon.jit
def _tile_indices(idx_row_ptr, n0, end, BLOCK_N: gl.constexpr, KV_FP8: gl.constexpr,
                  gather_n: gl.constexpr, gather_r: gl.constexpr):
    """Indices ``[n0, n0 + BLOCK_N)`` in the layouts of a tile's gather: the nope and rope
    copies' (bf16/fp16 kv), or the FP8 bytes' and the block-major scales' (``KV_FP8``)."""
    if KV_FP8:
        idx_a = _load_indices(idx_row_ptr, n0, end, BLOCK_N, gl.SliceLayout(1, FP8_GATHER))
        idx_b = _load_indices(idx_row_ptr, n0, end, BLOCK_N, gl.SliceLayout(0, FP8_SCALES))
    else:
        idx_a = _load_indices(idx_row_ptr, n0, end, BLOCK_N, gl.SliceLayout(1, gather_n))
        idx_b = _load_indices(idx_row_ptr, n0, end, BLOCK_N, gl.SliceLayout(1, gather_r))
    return idx_a, idx_b








@gluon.jit
def _issue_scores(q_nope, q_rope, k_nope, k_rope, kv_ready, t, q0, s_layout: gl.constexpr,
                  BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr):
    """Wait until tile ``t`` has landed, then issue ``S = q K^T`` for it (async wgmma: two
    groups). ``q0``: 0, computed at run time (see below)."""
    slot = t % 2
    mbarrier.wait(kv_ready.index(slot), (t // 2) & 1)
    fence_async_shared()  # the gathered bytes (generic proxy) before wgmma reads them (async proxy)
    # q's wgmma descriptors from an index that is 0 but not known to be: hoisted out of the
    # loop, the 72 64-bit descriptors would hold ~144 registers across it (and spill).
    s = warpgroup_mma(q_nope.index(q0), k_nope.index(slot).permute((1, 0)),
                      gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout), use_acc=False, is_async=True)
    return warpgroup_mma(q_rope.index(q0), k_rope.index(slot).permute((1, 0)), s, is_async=True)


@gluon.jit
def _to_max(m, l, acc, m_t, row_o: gl.constexpr):
    """Rescale the running sum ``l`` and output ``acc`` from row max ``m`` to ``m_t >= m``."""
    # While a row has seen nothing valid the max is -inf; subtract 0 instead (no inf - inf).
    alpha = gl.exp2(m - gl.where(m_t == float("-inf"), 0.0, m_t))
    return m_t, l * alpha, acc * gl.convert_layout(alpha, row_o)[:, None]


@gluon.jit
def _own_tile(s, idx_s, t, m, l, acc, k_nope, k_rope, stat_m, p_ready, kv_free, pool, qk_scale,
              row_o: gl.constexpr, HALF: gl.constexpr, WG: gl.constexpr):
    """My tile ``t`` with its scores ``s`` computed (``idx_s``: its indices): softmax, hand P and
    the new max to the other consumer, add my half of ``P V``, release the tile. Returns
    ``(m, l, acc)``."""
    slot = t % 2
    valid = (idx_s >= 0) & (idx_s < pool)
    s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, axis=1))
    p = gl.exp2(s - gl.where(m_new == float("-inf"), 0.0, m_new)[:, None])
    # P goes where this tile's rope columns were (its scores are done with them); both halves
    # of P V read it from there.
    k_rope.index(slot).store(p.to(k_rope.dtype))
    stat_m.index(WG).store(m_new)
    fence_async_shared()  # P (generic stores) before the wgmma reads it (async proxy)
    _cta_barrier()  # every thread of this warpgroup stored before the one arrive
    mbarrier.arrive(p_ready.index(slot))
    m, l, acc = _to_max(m, l, acc, m_new, row_o)
    l = l + gl.sum(p, axis=1)
    acc = warpgroup_mma(k_rope.index(slot), k_nope.index(slot).slice(WG * HALF, HALF, dim=1), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(kv_free.index(slot))
    return m, l, acc


@gluon.jit
def _other_tile(o, m, l, acc, k_nope, k_rope, stat_m, p_ready, row_s: gl.constexpr, row_o: gl.constexpr,
                HALF: gl.constexpr, WG: gl.constexpr, KV_FP8: gl.constexpr, fp8):
    """The other consumer's tile ``o``: wait for its P and max, rescale to that max and issue my
    half of ``P V`` (async: the caller waits and releases the tile). Returns ``(m, l, acc)``.
    With FP8 tokens (``KV_FP8``; ``fp8``: ``(kv_ready, k_raw, k_scale_rows, k_rope_bits,
    d_ready)``) I first dequantise the tile's second half of tokens for its owner, who is then
    still busy with my previous tile's ``P V`` or its own half, and say so on ``d_ready``."""
    if KV_FP8:
        kv_ready, k_raw, k_scale_rows, k_rope_bits, d_ready = fp8
        N: gl.constexpr = k_nope.shape[1]
        _dequantise_rows(o, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, N // 2, N // 2,
                         k_nope.shape[2], k_rope.shape[2])
        mbarrier.arrive(d_ready.index(o % 2))
    mbarrier.wait(p_ready.index(o % 2), (o // 2) & 1)
    m, l, acc = _to_max(m, l, acc, stat_m.index(1 - WG).load(row_s), row_o)
    acc = warpgroup_mma(k_rope.index(o % 2), k_nope.index(o % 2).slice(WG * HALF, HALF, dim=1), acc,
                        is_async=True)
    return m, l, acc


@gluon.jit
def _consumer(smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
              H, pool, qk_scale, row, hb, split, start, end, n_tiles,
              stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
              DIRECT: gl.constexpr, KV_FP8: gl.constexpr, WG: gl.constexpr, CLUSTER: gl.constexpr = 0,
              o_ready=None, NATIVE: gl.constexpr = 0):
    """Consumer warpgroup ``WG`` (0 or 1): scores and softmax of tiles ``t % 2 == WG``, output
    columns ``[WG * 256, WG * 256 + 256)`` of every tile."""
    q_nope, q_rope, k_nope, k_rope, stat_m, stat_l, k_raw, k_scale, k_rope_bits, k_scale_rows = smem
    q_ready, kv_ready, kv_free, p_ready, l_ready, d_ready = bars
    fp8 = (kv_ready, k_raw, k_scale_rows, k_rope_bits, d_ready)
    HALF: gl.constexpr = D_NOPE // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    idx_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir

    if WG == 0:
        _load_q_first(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope, q_ready, BLOCK_H, D_NOPE, D_ROPE)
    mbarrier.wait(q_ready, 0)
    m = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_s)
    l = gl.full([BLOCK_H], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    # Consumer 0 starts with its tile 0; then each iteration takes the other's tile t - 1 and my
    # tile t; a last tile of the other's comes after. Every wgmma is waited in the step that
    # issues it, so only plain tensors cross the loop.
    if WG == 0:
        if n_tiles > 0:
            if _OPAQUE_ZERO:  # tile 0's index: a constant under triton 3.6 (see graphattn.kernels.wgmma)
                t0 = _opaque_zero()
            else:
                t0 = 0
            idx_s = _load_indices(idx_row_ptr, start, end, BLOCK_N, idx_layout)
            if KV_FP8:
                _dequantise_mine(t0, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, d_ready)
            s = _issue_scores(q_nope, q_rope, k_nope, k_rope, kv_ready, t0, _unknown_zero(n_tiles, 0), s_layout,
                              BLOCK_H, BLOCK_N)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            m, l, acc = _own_tile(s, idx_s, t0, m, l, acc, k_nope, k_rope, stat_m, p_ready, kv_free, pool,
                                  qk_scale, row_o, HALF, WG)
    for t in range(2 - WG, n_tiles, 2):
        # My tile's indices load while I wait for the other's P (off the softmax's path).
        idx_s = _load_indices(idx_row_ptr, start + t * BLOCK_N, end, BLOCK_N, idx_layout)
        m, l, acc = _other_tile(t - 1, m, l, acc, k_nope, k_rope, stat_m, p_ready, row_s, row_o, HALF, WG,
                                KV_FP8, fp8)
        if KV_FP8:  # my half of my tile's FP8 bytes, dequantised while the other's P V runs
            _dequantise_mine(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, d_ready)
        # Release the other's tile before my scores wait for the slot the producer refills
        # (issuing them first, right behind the other's P V, measured 1.2x slower: with two
        # slots that gather then starts a tile later).
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_free.index((t - 1) % 2))
        s = _issue_scores(q_nope, q_rope, k_nope, k_rope, kv_ready, t, _unknown_zero(t, n_tiles), s_layout,
                          BLOCK_H, BLOCK_N)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        m, l, acc = _own_tile(s, idx_s, t, m, l, acc, k_nope, k_rope, stat_m, p_ready, kv_free, pool, qk_scale,
                              row_o, HALF, WG)
    if (n_tiles > 0) & ((n_tiles - 1) % 2 != WG):
        m, l, acc = _other_tile(n_tiles - 1, m, l, acc, k_nope, k_rope, stat_m, p_ready, row_s, row_o, HALF, WG,
                                KV_FP8, fp8)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_free.index((n_tiles - 1) % 2))

    # The row sum is split between the two consumers (each summed its own tiles' P): add them.
    if CLUSTER:
        _stage_for_merge(acc, m, l, stat_l, l_ready, k_nope, stat_m, o_ready, row_s, o_layout, BLOCK_H, D_NOPE,
                         WG)
    else:
        _finish(acc, m, l, stat_l, l_ready, q_nope, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr, row, hb, split, H,
                stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, row_s, o_layout, BLOCK_H, D_NOPE, DIRECT, WG,
                0, None, NATIVE)


@gluon.jit
def _finish(acc, m, l, stat_l, l_ready, q_nope, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr, row, hb, split, H,
            stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, row_s: gl.constexpr, o_layout: gl.constexpr,
            BLOCK_H: gl.constexpr, D_NOPE: gl.constexpr, DIRECT: gl.constexpr, WG: gl.constexpr,
            CLUSTER: gl.constexpr = 0, stat_w=None, NATIVE: gl.constexpr = 0):
    """Consumer ``WG``'s end: add the other consumer's row sum ``l`` (both at the row max ``m``),
    then store its half of the normalised output (``acc`` ``[BLOCK_H, 256]``, columns ``WG *
    256``) and, consumer 0, the lse: the final ``out``/``lse`` (``DIRECT``) or a split's partial.

    ``CLUSTER=2``: the two splits of this (row, head block) are a thread-block cluster and
    merge here, with no combine launch. Split ``s`` finishes columns ``[256 s, 256 s + 256)``,
    consumer ``s``'s: the other consumer stores its half of the partial and the lse and arrives
    on the cluster barrier (release); consumer ``s`` waits there (acquire), loads the peer's
    half of that column range and its lse from L2, and stores the merged output (``stat_w``:
    ``[BLOCK_H]`` f32 shared memory free by now, for the merge's row weights)."""
    HALF: gl.constexpr = D_NOPE // 2
    out, lse = _normalised(acc, m, l, stat_l, l_ready, row_s, o_layout, WG)
    h_s = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
    # Both consumers are past their last scores (the sums' exchange above), so q's shared
    # memory is free: the final output goes through it, out to memory a whole row per warp.
    if CLUSTER:
        gl.static_assert(CLUSTER == 2, "a cluster of the two splits: one half of the columns each")
        if split != WG:  # my half is the peer's to finish: hand it over through L2
            _store_partial(out, lse, h_s, ws_out_ptr, ws_lse_ptr, row, hb, split, H, stride_wr, stride_ws, stride_wh,
                           stride_lr, stride_ls, o_layout, BLOCK_H, HALF, WG, True)
            _cluster_arrive(1)  # release: the peer's consumer loads both after its wait
        else:
            _cluster_arrive(0)
            _merge_pair(out, lse, q_nope, stat_w, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr, row, hb, split, H,
                        stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, row_s, BLOCK_H, D_NOPE, WG)
    elif DIRECT:
        _store_rows(q_nope.index(0).slice(WG * HALF, HALF, dim=1), out.to(out_ptr.dtype.element_ty),
                    out_ptr + row.to(gl.int64) * H * D_NOPE + WG * HALF, D_NOPE, hb * BLOCK_H, H, BLOCK_H, HALF)
        if WG == 0:
            gl.store(lse_ptr + row.to(gl.int64) * H + h_s, lse, mask=h_s < H)
    else:
        _store_partial(out, lse, h_s, ws_out_ptr, ws_lse_ptr, row, hb, split, H, stride_wr, stride_ws, stride_wh,
                       stride_lr, stride_ls, o_layout, BLOCK_H, HALF, WG, WG == 0, NATIVE, out_ptr.dtype.element_ty)


@gluon.jit
def _normalised(acc, m, l, stat_l, l_ready, row_s: gl.constexpr, o_layout: gl.constexpr, WG: gl.constexpr):
    """Consumer ``WG``'s ``(out, lse)`` at its loop's end: its row sum ``l`` plus the other
    consumer's (both at the row max ``m``, exchanged through ``stat_l``), ``acc`` ``[BLOCK_H,
    256]`` divided by it, and the rows' lse (``-inf`` and a zero output where nothing valid was
    seen)."""
    OTHER: gl.constexpr = 1 - WG
    stat_l.index(WG).store(l)
    _cta_barrier()
    mbarrier.arrive(l_ready.index(WG))
    mbarrier.wait(l_ready.index(OTHER), 0)
    l = l + stat_l.index(OTHER).load(row_s)
    empty = l == 0.0
    lse = gl.where(empty, float("-inf"), (m + gl.log2(gl.where(empty, 1.0, l))) * 0.6931471805599453)
    # One reciprocal a row and a multiply an element: a division an element (div.full.f32: a
    # scaling test, two selects and two multiplies each) cost the end of every program ~1 us
    # (scripts/ws_probe.py at 128 x 1: 1.1-1.3 us from the loop's end to here).
    inv = 1.0 / gl.where(empty, 1.0, l)
    out = acc * gl.convert_layout(inv, gl.SliceLayout(1, o_layout))[:, None]
    return out, lse


@gluon.jit
def _f32_rows(buf, ROWS: gl.constexpr, CHUNK: gl.constexpr, WIDTH: gl.constexpr):
    """``buf`` (a 64 KB ``[64, 512]`` 16-bit tile) as f32 ``[ROWS // CHUNK, CHUNK, WIDTH]``
    (the layout is one chunk's, :data:`F32_STAGE`: row ``r``'s 32-byte groups are swizzled by
    ``r % 4``, so every ``CHUNK`` that is a multiple of 4 sees the same bytes in the same places)."""
    view = _reinterpret(buf, gl.float32, [ROWS // CHUNK, CHUNK, WIDTH], F32_STAGE)
    return view


@gluon.jit
def _stage_for_merge(acc, m, l, stat_l, l_ready, k_nope, stat_m, o_ready, row_s: gl.constexpr,
                     o_layout: gl.constexpr, BLOCK_H: gl.constexpr, D_NOPE: gl.constexpr, WG: gl.constexpr):
    """``CLUSTER=2`` (two splits as a thread-block cluster): consumer ``WG``'s end is only
    this: its half of the normalised partial staged as f32 in its KV slot (``k_nope[WG]``, free
    once both consumers are past their loops, the sums' exchange), consumer 0's lse in
    ``stat_m[0]``, then ``o_ready`` and its arrival on the cluster barrier. The producer merges
    (:func:`_producer_merge`): the merge in the consumers made ptxas spill ~460 B in their KV
    loop."""
    out, lse = _normalised(acc, m, l, stat_l, l_ready, row_s, o_layout, WG)
    HALF: gl.constexpr = D_NOPE // 2
    _f32_rows(k_nope.index(WG), BLOCK_H, BLOCK_H, HALF).index(0).store(out)
    if WG == 0:
        stat_m.index(0).store(lse)
    _cta_barrier()
    mbarrier.arrive(o_ready)
    _cluster_arrive(0)


@gluon.jit
def _producer_merge(q_nope, k_nope, stat_m, wts, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr, row, hb, split, H,
                    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, BLOCK_H: gl.constexpr,
                    D_NOPE: gl.constexpr):
    """The producer's part of ``CLUSTER=2`` (see :func:`_stage_for_merge`): split ``s``
    finishes output columns ``[256 s, 256 s + 256)``. First the other half (consumer ``1 - s``'s,
    staged) and the lse go to the workspace, then the cluster barrier (release, acquire), then
    the peer's half of my columns is copied from L2 into q's shared memory (free: the consumers
    are past their scores) by ``cp.async``, and my staged half and the peer's are merged with
    the two lse's weights and stored. A few rows a pass: the producer has 40 registers."""
    HALF: gl.constexpr = D_NOPE // 2
    CHUNK: gl.constexpr = wts.shape[1]
    NCH: gl.constexpr = BLOCK_H // CHUNK
    layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 4], threads_per_warp=[1, 32], warps_per_cta=[4, 1], order=[1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    vec_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[4],
                                           order=[0])
    # The peer is split 1 - s; the half it finishes is my consumer 1 - s's (columns 256 (1 - s)).
    peer = 1 - split
    d = gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    w_row = ws_out_ptr + row.to(gl.int64) * stride_wr
    sent = _f32_rows(k_nope.index(peer), BLOCK_H, CHUNK, HALF)
    for c in range(0, NCH):
        h = hb * BLOCK_H + c * CHUNK + gl.arange(0, CHUNK, layout=rows_l)
        gl.store(w_row + split * stride_ws + h[:, None] * stride_wh + (peer * HALF + d)[None, :],
                 sent.index(c).load(layout), mask=(h < H)[:, None])
    h_v = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=vec_l)
    lse_me = stat_m.index(0).load(vec_l)
    l_row = ws_lse_ptr + row.to(gl.int64) * stride_lr
    gl.store(l_row + split * stride_ls + h_v, lse_me, mask=h_v < H)
    _cluster_arrive(1)  # release: these stores before the peer's loads
    _cluster_wait()
    # the peer's half of my columns, into q's shared memory
    got = _f32_rows(q_nope.index(0), BLOCK_H, CHUNK, HALF)
    for c in range(0, NCH):
        h = hb * BLOCK_H + c * CHUNK + gl.arange(0, CHUNK, layout=rows_l)
        _async_load(got.index(c), w_row + peer * stride_ws + h[:, None] * stride_wh + (split * HALF + d)[None, :],
                    mask=(h < H)[:, None])
    _async_copy.commit_group()
    lse_p = gl.load(l_row + peer * stride_ls + h_v, mask=h_v < H, other=float("-inf"), cache_modifier=".cg")
    w_me, w_p, inv, top, den = _pair_weights(lse_me, lse_p)
    if split == 0:
        gl.store(lse_ptr + row.to(gl.int64) * H + h_v, _merged_lse(top, den), mask=h_v < H)
    wts.slice(0, NCH).store(gl.reshape(w_me * inv, [NCH, CHUNK]))
    wts.slice(NCH, NCH).store(gl.reshape(w_p * inv, [NCH, CHUNK]))
    _async_copy.wait_group(0)
    _cta_barrier()
    mine = _f32_rows(k_nope.index(split), BLOCK_H, CHUNK, HALF)
    # the same bytes, as rows (triton 3.6 takes a row's layout from the parent's: here one row's)
    row_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    w_rows = _reinterpret(wts, gl.float32, [2 * NCH, CHUNK], row_layout)
    o_row = out_ptr + row.to(gl.int64) * H * D_NOPE
    for c in range(0, NCH):
        h = hb * BLOCK_H + c * CHUNK + gl.arange(0, CHUNK, layout=rows_l)
        a = w_rows.index(c).load(rows_l)
        b = w_rows.index(NCH + c).load(rows_l)
        merged = mine.index(c).load(layout) * a[:, None] + got.index(c).load(layout) * b[:, None]
        gl.store(o_row + h.to(gl.int64)[:, None] * D_NOPE + (split * HALF + d)[None, :],
                 merged.to(out_ptr.dtype.element_ty), mask=(h < H)[:, None])


@gluon.jit
def _store_partial(out, lse, h_s, ws_out_ptr, ws_lse_ptr, row, hb, split, H, stride_wr, stride_ws, stride_wh,
                   stride_lr, stride_ls, o_layout: gl.constexpr, BLOCK_H: gl.constexpr, HALF: gl.constexpr,
                   WG: gl.constexpr, LSE: gl.constexpr, NATIVE: gl.constexpr = 0, DTYPE16: gl.constexpr = None):
    """Consumer ``WG``'s half of split ``split``'s normalised partial (``out`` ``[BLOCK_H, 256]``
    f32, columns ``WG * 256``) into the workspace, and with ``LSE`` the split's lse (``lse`` and
    its heads ``h_s`` ``[BLOCK_H]``). ``NATIVE``: 0 head-major f32 rows; 1 f32 in the
    accumulator's own order; 2 the same order in ``DTYPE16`` (q's dtype), in the first half of
    the head block's f32 region of the split (what
    :func:`graphattn.kernels.wgmma_combine._flashmla_combine_native_kernel` reads).
    The native order holds the block's ``R = min(64, H - 64 hb)`` heads only (``H`` a multiple
    of 16): the rows of the accumulator's warps that hold heads ``>= H`` are neither stored nor
    given room, so a partly-masked block's partial is as compact as its heads."""
    # f32 partials: a warp's stores from the accumulator already fill 32-byte sectors, and
    # staging them measured slower (32 heads x 8 rows 15.9 -> 17.6 us, 128 x 1 12.5 -> 13.4)
    h_o = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    if NATIVE:
        # The head block's partial in the accumulator's own order: element (m, n) of this half at
        # (register pair, thread), so that a warp's store is 256 contiguous bytes.
        gl.static_assert(BLOCK_H == 64 and HALF == 256, "the native order is that of a [64, 256] accumulator")
        m = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
        n = gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
        R = gl.minimum(H - hb * BLOCK_H, BLOCK_H)  # the block's heads, a multiple of 16 (whole warps)
        # A run of 8 columns is [R, 8]: the rows m % 16 < 8 of every warp, then the rows >= 8.
        off_m = (m // 16) * 64 + ((m % 16) // 8) * (R * 4) + (m % 8) * 8
        off_n = (n // 8) * (R * 8) + n % 8
        if NATIVE == 2:  # q's dtype, in the first half of the block's f32 region (element offsets doubled)
            dst = ws_out_ptr.to(gl.pointer_type(DTYPE16))
        else:
            dst = ws_out_ptr
        wide: gl.constexpr = 2 if NATIVE == 2 else 1
        base = (dst + wide * (row.to(gl.int64) * stride_wr + split * stride_ws + hb * BLOCK_H * stride_wh)
                + WG * R * HALF)
        gl.store(base + off_m[:, None] + off_n[None, :], out.to(dst.dtype.element_ty), mask=(h_o < H)[:, None])
    else:
        d_o = WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
        w_base = ws_out_ptr + row.to(gl.int64) * stride_wr + split * stride_ws
        gl.store(w_base + h_o[:, None] * stride_wh + d_o[None, :], out, mask=(h_o < H)[:, None])
    if LSE:
        gl.store(ws_lse_ptr + row.to(gl.int64) * stride_lr + split * stride_ls + h_s, lse, mask=h_s < H)




@gluon.jit
def _pair_weights(lse, lse_p):
    """Two splits' weights in their merge, from their lse's (``[BLOCK_H]`` f32, ``-inf`` for a
    split that saw no valid token: its weight is 0): ``(w, w_p, inv, top, den)``, the merged
    partial being ``(w * mine + w_p * peer's) * inv``; ``top`` and ``den`` give the merged lse
    (:func:`_merged_lse`). ``inv`` is applied by the caller, where it uses the weights."""
    top = gl.maximum(lse, lse_p)
    top = gl.where(top == float("-inf"), 0.0, top)
    w = gl.exp(lse - top)
    w_p = gl.exp(lse_p - top)
    den = w + w_p
    inv = 1.0 / gl.where(den == 0.0, 1.0, den)
    return w, w_p, inv, top, den


@gluon.jit
def _merged_lse(top, den):
    """The lse of two splits merged (``top``, ``den`` from :func:`_pair_weights`): ``-inf`` where
    neither saw a valid token."""
    return gl.where(den == 0.0, float("-inf"), top + gl.log(gl.where(den == 0.0, 1.0, den)))


@gluon.jit
def _merge_pair(out, lse, q_nope, stat_w, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr, row, hb, split, H,
                stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, row_s: gl.constexpr,
                BLOCK_H: gl.constexpr, D_NOPE: gl.constexpr, WG: gl.constexpr):
    """Consumer ``WG`` of split ``WG`` in a cluster of two (see ``_finish``): once the peer's
    half of columns ``[256 WG, 256 WG + 256)`` and its lse are in the workspace (the cluster
    barrier), store ``out``/``lse`` merged from them and this split's ``out`` (``[BLOCK_H,
    256]`` f32, normalised) and ``lse``. This split's half, weighted, is staged as f32 in q's
    shared memory (64 KB; both consumers are past their last scores), and the peer's is loaded
    from L2 16 rows at a time and added to it: both halves in registers at once would spill.
    Nothing of the peer's, its lse included, is read before the cluster barrier's wait."""
    HALF: gl.constexpr = D_NOPE // 2
    o_layout: gl.constexpr = out.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    peer = 1 - split
    h_s = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
    _cluster_wait()  # the peer's half and lse are in the workspace
    lse_p = gl.load(ws_lse_ptr + row.to(gl.int64) * stride_lr + peer * stride_ls + h_s, mask=h_s < H,
                    other=float("-inf"), cache_modifier=".cg")
    w_me, w_p, inv, top, den = _pair_weights(lse, lse_p)
    stage = _reinterpret(q_nope.index(0), gl.float32, [BLOCK_H, HALF], F32_STAGE)
    stage.store(out * gl.convert_layout(w_me * inv, row_o)[:, None])
    # stat_w (wgmma_rr's row max) is free: both consumers are past their loops (the sums' exchange).
    stat_w.store(w_p * inv)
    _cta_barrier()
    if split == 0:
        lse_f = _merged_lse(top, den)
        gl.store(lse_ptr + row.to(gl.int64) * H + h_s, lse_f, mask=h_s < H)
    layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[1, 32], warps_per_cta=[4, 1], order=[1, 0])
    CHUNK: gl.constexpr = 16
    d = WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    p_base = ws_out_ptr + row.to(gl.int64) * stride_wr + peer * stride_ws
    o_base = out_ptr + row.to(gl.int64) * H * D_NOPE
    for r in gl.static_range(0, BLOCK_H, CHUNK):
        h = hb * BLOCK_H + r + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        o_p = gl.load(p_base + h[:, None] * stride_wh + d[None, :], mask=(h < H)[:, None], other=0.0,
                      cache_modifier=".cg")
        w = stat_w.slice(r, CHUNK).load(gl.SliceLayout(1, layout))
        merged = stage.slice(r, CHUNK, dim=0).load(layout) + o_p * w[:, None]
        gl.store(o_base + h.to(gl.int64)[:, None] * D_NOPE + d[None, :], merged.to(out_ptr.dtype.element_ty),
                 mask=(h < H)[:, None])


@gluon.jit
def _store_rows(stage, vals, dst, row_stride, h0, H, ROWS: gl.constexpr, WIDTH: gl.constexpr):
    """Store ``vals`` ``[ROWS, WIDTH]`` (a wgmma accumulator's layout, 16-bit) to rows
    ``h0 + i < H`` of ``dst`` (``row_stride`` elements apart) through the shared-memory tile
    ``stage`` of its shape and dtype. Straight from the accumulator a thread holds pairs of
    values in 8 rows, so a warp's store writes 16-byte pieces of 8 rows, half a sector each:
    probed in a 128-program wave at 128 heads x 64 rows, the store took 5-8 us of the kernel's
    80, and 2-3 us this way, where a warp reads back and stores whole 512-byte row halves, 16
    bytes per thread. Only this warpgroup's threads meet at the barrier."""
    stage.store(vals)
    _cta_barrier()
    VEC: gl.constexpr = 128 // vals.dtype.primitive_bitwidth
    layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, VEC], threads_per_warp=[1, 32], warps_per_cta=[4, 1], order=[1, 0])
    CHUNK: gl.constexpr = 16  # rows per pass: a quarter of the values in registers at a time
    d = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    for r in gl.static_range(0, ROWS, CHUNK):
        h = h0 + r + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        v = stage.slice(r, CHUNK, dim=0).load(layout)
        gl.store(dst + h.to(gl.int64)[:, None] * row_stride + d[None, :], v, mask=(h < H)[:, None])



@gluon.jit
def _flashmla_ws_kernel(
    q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, pool, topk, split_len, num_splits, qk_scale,
    stride_qr, stride_qh, stride_kv, stride_ir,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, DIRECT: gl.constexpr, KV_FP8: gl.constexpr = 0, LAUNCH_DEPENDENTS: gl.constexpr = 0,
    CLUSTER: gl.constexpr = 0, PARTIAL_NATIVE: gl.constexpr = 0,
):
    """Arguments, grid and outputs as ``_flashmla_split_kernel`` (graphattn.kernels.flashmla);
    launch with ``num_warps=4`` and ``maxnreg=168`` (12 warps run: producer, two consumers).
    ``KV_FP8=1``: ``kv_ptr`` holds 656-byte e4m3fn tokens ``[pool, 656]`` uint8 (``stride_kv``
    in bytes, a multiple of 16), dequantised to q's dtype by the two consumers, half the tokens each.
    ``CLUSTER=2`` (two splits): the splits of a (row, head block) are consecutive programs,
    launched as a thread-block cluster of two (``graphattn.kernels.launch.Launch``), and merge
    their partials in the kernel, the producer doing it (``_stage_for_merge``,
    ``_producer_merge``): ``out``/``lse`` are final, no combine follows."""
    gl.static_assert(BLOCK_H == 64, "one wgmma M tile of heads per program")
    gl.static_assert(BLOCK_N == 64, "P [64 heads, BLOCK_N] reuses a tile's [BLOCK_N, 64] rope columns")
    gl.static_assert(D_ROPE == BLOCK_N, "P [64 heads, BLOCK_N] reuses a tile's [BLOCK_N, 64] rope columns")
    gl.static_assert(STAGES == 2, "two KV slots (with q they fill the shared memory)")
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
    gl.static_assert((KV_FP8 == 0) | (KV_FP8 == 1), "sm_90 FP8 tokens are e4m3fn")
    gl.static_assert((KV_FP8 == 0) | (D_NOPE == 4 * FP8_BLOCK), "four scale blocks of 128 values")
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    if LAUNCH_DEPENDENTS:  # the combine (a programmatic dependent launch) may start its programs
        _launch_dependents()
    gl.static_assert(CLUSTER == 0 or (CLUSTER == 2 and DIRECT == 0), "clusters merge two splits")
    hb, split, row, start, end, n_tiles = _program_split(H, topk, split_len, num_splits, BLOCK_H, BLOCK_N, CLUSTER)

    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # [2, N] buffers indexed by consumer: the layout describes one row (triton 3.6 keeps the
    # parent's layout for the row a `.index` takes).
    stat_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    q_nope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_NOPE], smem_layout)
    q_rope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_ROPE], smem_layout)
    k_nope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_NOPE], smem_layout)
    k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_ROPE], smem_layout)
    stat_m = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], stat_layout)
    stat_l = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], stat_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if KV_FP8:
        k_raw, k_scale, k_rope_bits, k_scale_rows = _fp8_views(k_nope, k_rope, STAGES, BLOCK_N, D_NOPE, D_ROPE)
        # per slot: the second half of the tile's tokens dequantised (by the consumer not owning it)
        d_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(d_ready.index(i), count=1)
    else:
        k_raw = k_nope
        k_scale = stat_m
        k_scale_rows = stat_m
        k_rope_bits = k_rope
        d_ready = p_ready  # unused
    mbarrier.init(q_ready, count=128)  # one cp.async arrival per thread of consumer 0
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(i), count=128)
        mbarrier.init(kv_free.index(i), count=2)  # one per consumer
        mbarrier.init(p_ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(l_ready.index(i), count=1)
    if CLUSTER:  # both consumers have staged their halves for the producer's merge
        o_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(o_ready, count=2)
        # the merge's row weights, [2 * 16, 4]: the producer's 4-row passes (_producer_merge)
        o_wts = gl.allocate_shared_memory(gl.float32, [2 * BLOCK_H // MERGE_ROWS, MERGE_ROWS],
                                          gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    else:
        o_ready = q_ready  # unused
        o_wts = stat_m

    smem = (q_nope, q_rope, k_nope, k_rope, stat_m, stat_l, k_raw, k_scale, k_rope_bits, k_scale_rows)
    bars = (q_ready, kv_ready, kv_free, p_ready, l_ready, d_ready)
    # One argument tuple per partition, written out: a tuple built with `+` in a kernel loses
    # its constexprs. Both consumers are _consumer with the constexpr WG last, so each worker
    # partition is its own specialisation (the same PTX as a wrapper function per consumer).
    gl.warp_specialize([
        (_producer, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                     H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                     stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                     stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, KV_FP8, CLUSTER, o_ready, o_wts)),
        (_consumer, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                     H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                     stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                     stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, KV_FP8, 0, CLUSTER, o_ready,
                     PARTIAL_NATIVE)),
        (_consumer, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                     H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                     stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                     stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, KV_FP8, 1, CLUSTER, o_ready,
                     PARTIAL_NATIVE)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
