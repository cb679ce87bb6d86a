"""flashmla's split kernel for sm_90 in rounds of two KV tiles (Gluon), for bf16/fp16 kv where
neither wgmma_tn nor the tokens-major Triton tile runs and a launch has enough programs
(``graphattn.cuda.configs``): both consumers' scores at once, the local P fed to its products
from registers, and the ring's halves released at different points of a round, so the producer
refills part of a slot early.

One program per (row, split, 64-head block), three warpgroups as in
:mod:`graphattn.kernels.wgmma_ws` (``num_warps=4``, ``maxnreg=168``; consumers 232 registers,
producer 40). ``BLOCK_N`` is a round: 128 tokens, two 64-token tiles ``k0`` (slot 0) and ``k1``
(slot 1). Consumer 0 owns ``k0`` and output columns ``[0, 256)``; consumer 1 owns ``k1`` and
columns ``[256, 512)``. Each slot has two halves with their own ready and free barriers: ``L`` =
nope columns ``[0, 256)``, ``R`` = nope ``[256, 512)`` and the rope columns.

Per round (FlashMLA's sparse sm_90 schedule, written for this code base):

* consumer 0: scores of ``k0`` (L, then R) -> softmax with its own max, publishes it -> ``P0 V``
  on ``k0``'s L from registers -> frees ``k0`` L -> waits for the round's max (consumer 1's) ->
  rescales ``P0`` and stores it over ``k0``'s rope columns -> waits for ``P1`` -> rescales its
  output, ``P1 V`` on ``k1``'s L -> frees ``k1`` L.
* consumer 1: scores of ``k1`` (R, then L) -> waits for consumer 0's max, softmax with the round's
  max, publishes it -> ``P1 V`` on ``k1``'s R from registers -> stores ``P1`` (its own buffer:
  ``k1``'s R is freed early) -> waits for ``P0`` -> ``P0 V`` on ``k0``'s R -> frees ``k1`` R, then
  ``k0`` R.
* producer: ``k0`` L, ``k1`` R, ``k0`` R, ``k1`` L of the next round, each once its half is free.

After every round both consumers hold their outputs at the round's max, so the row sums add up
at the end. A round past the split's end reads nothing (indices -1: scores -inf, P 0).
Conventions (grid, outputs, masked heads, indices outside ``[0, pool)``) are those of
``_flashmla_split_kernel``; bf16/fp16 q and kv (no FP8 tokens), 16-byte aligned rows.
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
    _async_load,
    _cluster_arrive,
    _cta_barrier,
    _launch_dependents,
    _load_indices,
    _prefetch_indices_l2,
    _program_split,
    _unknown_zero,
)
from .wgmma_ws import CONSUMER_REGS, GATHER_R, _finish, _load_q_first


@gluon.jit
def _gather_half(kv_ptr, rows, valid, kn_slot, kr_slot, ready, free, ph, RIGHT: gl.constexpr,
                 D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    """Once ``free`` passes phase ``ph``, cp.async one half of a tile into its slot, completing
    on ``ready``: nope columns ``[0, 256)`` (``RIGHT=0``), or nope ``[256, 512)`` and the rope
    columns (``RIGHT=1``). ``rows``: the tokens' element offsets in ``GATHER_R``'s row layout (4
    per thread: 8 threads copy a row's 128 bytes), ``valid``: which to read (the others are
    written as zeros)."""
    HALF: gl.constexpr = D_NOPE // 2
    mbarrier.wait(free, ph)
    cols = RIGHT * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, GATHER_R))
    _async_load(kn_slot.slice(RIGHT * HALF, HALF, dim=1), kv_ptr + rows[:, None] + cols[None, :],
                mask=valid[:, None])
    if RIGHT:
        cols_r = D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, GATHER_R))
        _async_load(kr_slot, kv_ptr + rows[:, None] + cols_r[None, :], mask=valid[:, None])
    _async_copy.mbarrier_arrive(ready, increment_count=False)


@gluon.jit
def _gather_half_idx(kv_ptr, idx, pool, stride_kv, kn_slot, kr_slot, ready, free, ph, RIGHT: gl.constexpr,
                     D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    """:func:`_gather_half` from the tokens' indices (``GATHER_R``'s rows): their offsets live
    only for this half's copies."""
    rows, valid = _rows_of(idx, pool, stride_kv)
    _gather_half(kv_ptr, rows, valid, kn_slot, kr_slot, ready, free, ph, RIGHT, D_NOPE, D_ROPE)


@gluon.jit
def _tile_rows(idx_row_ptr, n0, end, pool, stride_kv, TILE: gl.constexpr):
    """Element offsets and validity of the tokens ``[n0, n0 + TILE)`` in ``GATHER_R``'s rows."""
    idx = _load_indices(idx_row_ptr, n0, end, TILE, gl.SliceLayout(1, GATHER_R))
    return _rows_of(idx, pool, stride_kv)


@gluon.jit
def _rows_of(idx, pool, stride_kv):
    """Element offsets and validity of the tokens ``idx``."""
    valid = (idx >= 0) & (idx < pool)
    return gl.where(valid, idx, 0).to(gl.int64) * stride_kv, valid


@gluon.jit
def _producer_rr(smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                 H, pool, qk_scale, row, hb, split, start, end, n_rounds,
                 stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                 BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                 DIRECT: gl.constexpr, CLUSTER: gl.constexpr = 0, IDX_EARLY: gl.constexpr = 0):
    """Default partition: per round, the four halves in the order the consumers free them
    (``ready``/``free`` index: slot * 2 + half, 0 = L, 1 = R); with ``CLUSTER``, then its
    arrival on the cluster barrier the consumers' merge waits at (see ``_finish``).
    ``IDX_EARLY``: the split's indices asked of L2 first, and each round's loaded a round ahead,
    before the waits for free halves (see ``_flashmla_rr_kernel``)."""
    q_nope, q_rope, k_nope, k_rope, p1, stat_m, stat_l = smem
    q_ready, ready, free, m0_ready, m1_ready, s0_ready, s1_ready, l_ready = bars
    TILE: gl.constexpr = BLOCK_N // 2
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir
    if IDX_EARLY:
        _prefetch_indices_l2(idx_row_ptr, start, end)
        idx0 = _load_indices(idx_row_ptr, start, end, TILE, gl.SliceLayout(1, GATHER_R))
        idx1 = _load_indices(idx_row_ptr, start + TILE, end, TILE, gl.SliceLayout(1, GATHER_R))
    for r in range(0, n_rounds):
        n0 = start + r * BLOCK_N
        ph = (r & 1) ^ 1  # a fresh barrier passes phase 1
        if IDX_EARLY:  # offsets computed at each half from the indices (fewer live registers)
            cur0 = idx0
            cur1 = idx1
            idx0 = _load_indices(idx_row_ptr, n0 + BLOCK_N, end, TILE, gl.SliceLayout(1, GATHER_R))
            idx1 = _load_indices(idx_row_ptr, n0 + BLOCK_N + TILE, end, TILE, gl.SliceLayout(1, GATHER_R))
            _gather_half_idx(kv_ptr, cur0, pool, stride_kv, k_nope.index(0), k_rope.index(0), ready.index(0),
                             free.index(0), ph, 0, D_NOPE, D_ROPE)
            _gather_half_idx(kv_ptr, cur1, pool, stride_kv, k_nope.index(1), k_rope.index(1), ready.index(3),
                             free.index(3), ph, 1, D_NOPE, D_ROPE)
            _gather_half_idx(kv_ptr, cur0, pool, stride_kv, k_nope.index(0), k_rope.index(0), ready.index(1),
                             free.index(1), ph, 1, D_NOPE, D_ROPE)
            _gather_half_idx(kv_ptr, cur1, pool, stride_kv, k_nope.index(1), k_rope.index(1), ready.index(2),
                             free.index(2), ph, 0, D_NOPE, D_ROPE)
        else:
            rows0, valid0 = _tile_rows(idx_row_ptr, n0, end, pool, stride_kv, TILE)
            rows1, valid1 = _tile_rows(idx_row_ptr, n0 + TILE, end, pool, stride_kv, TILE)
            _gather_half(kv_ptr, rows0, valid0, k_nope.index(0), k_rope.index(0), ready.index(0), free.index(0), ph,
                         0, D_NOPE, D_ROPE)
            _gather_half(kv_ptr, rows1, valid1, k_nope.index(1), k_rope.index(1), ready.index(3), free.index(3), ph,
                         1, D_NOPE, D_ROPE)
            _gather_half(kv_ptr, rows0, valid0, k_nope.index(0), k_rope.index(0), ready.index(1), free.index(1), ph,
                         1, D_NOPE, D_ROPE)
            _gather_half(kv_ptr, rows1, valid1, k_nope.index(1), k_rope.index(1), ready.index(2), free.index(2), ph,
                         0, D_NOPE, D_ROPE)
    if CLUSTER:
        _cluster_arrive(0)


@gluon.jit
def _scores_half(q_nope, q_rope, k_nope, k_rope, ready, slot: gl.constexpr, RIGHT: gl.constexpr, ph, q0, s,
                 use_acc):
    """Wait for one half of tile ``slot`` and issue its part of ``S = q K^T`` (async)."""
    HALF: gl.constexpr = q_nope.shape[2] // 2
    mbarrier.wait(ready.index(slot * 2 + RIGHT), ph)
    fence_async_shared()  # the gathered bytes (generic proxy) before wgmma reads them (async proxy)
    q = q_nope.index(q0)
    k = k_nope.index(slot)
    s = warpgroup_mma(q.slice(RIGHT * HALF, HALF, dim=1), k.slice(RIGHT * HALF, HALF, dim=1).permute((1, 0)), s,
                      use_acc=use_acc, is_async=True)
    if RIGHT:
        s = warpgroup_mma(q_rope.index(q0), k_rope.index(slot).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _masked(s, idx, pool, qk_scale):
    """Scores in base 2 with the tokens whose index (``idx``: -1 past the split's end) is outside
    ``[0, pool)`` at -inf."""
    valid = (idx >= 0) & (idx < pool)
    return gl.where(valid[None, :], s * qk_scale, float("-inf"))


@gluon.jit
def _ref(m):
    """A max to subtract: 0 where nothing valid has been seen (no inf - inf)."""
    return gl.where(m == float("-inf"), 0.0, m)


@gluon.jit
def _consumer_rr(smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                 H, pool, qk_scale, row, hb, split, start, end, n_rounds,
                 stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                 BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                 DIRECT: gl.constexpr, WG: gl.constexpr, CLUSTER: gl.constexpr = 0, NATIVE: gl.constexpr = 0):
    """Consumer ``WG``: tile ``k{WG}`` of every round and output columns ``[WG * 256, WG * 256 + 256)``."""
    q_nope, q_rope, k_nope, k_rope, p1, stat_m, stat_l = smem
    q_ready, ready, free, m0_ready, m1_ready, s0_ready, s1_ready, l_ready = bars
    HALF: gl.constexpr = D_NOPE // 2
    TILE: gl.constexpr = BLOCK_N // 2
    dtype: gl.constexpr = q_nope.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir

    if WG == 0:
        _load_q_first(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope, q_ready, BLOCK_H, D_NOPE, D_ROPE)
    mbarrier.wait(q_ready, 0)
    m = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_s)
    l = gl.full([BLOCK_H], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    zeros_s = gl.zeros([BLOCK_H, TILE], gl.float32, layout=s_layout)
    for r in range(0, n_rounds):
        ph = r & 1
        q0 = _unknown_zero(r, n_rounds)  # 0, not known to be: q's descriptors stay in the loop
        # My tile's indices (for the mask) load while its scores wait and run (off the softmax's path).
        idx = _load_indices(idx_row_ptr, start + r * BLOCK_N + WG * TILE, end, TILE, gl.SliceLayout(0, s_layout))
        if WG == 0:  # k0: L, then R
            s = _scores_half(q_nope, q_rope, k_nope, k_rope, ready, 0, 0, ph, q0, zeros_s, False)
            s = _scores_half(q_nope, q_rope, k_nope, k_rope, ready, 0, 1, ph, q0, s, True)
        else:  # k1: R (the producer's second half), then L (its last)
            s = _scores_half(q_nope, q_rope, k_nope, k_rope, ready, 1, 1, ph, q0, zeros_s, False)
            s = _scores_half(q_nope, q_rope, k_nope, k_rope, ready, 1, 0, ph, q0, s, True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        s = _masked(s, idx, pool, qk_scale)
        m_new = gl.maximum(m, gl.max(s, axis=1))
        if WG == 1:  # the round's max includes consumer 0's
            mbarrier.wait(m0_ready, ph)
            m_new = gl.maximum(m_new, stat_m.load(row_s))
        alpha = gl.exp2(m - _ref(m_new))
        p = gl.exp2(s - _ref(m_new)[:, None])
        l = l * alpha + gl.sum(p, axis=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        if WG == 0:  # publish my max; consumer 1 reads it before it writes the round's
            stat_m.store(m_new)
            _cta_barrier()
            mbarrier.arrive(m0_ready)
        else:
            _cta_barrier()  # every thread has read consumer 0's max
            stat_m.store(m_new)
            _cta_barrier()
            mbarrier.arrive(m1_ready)
        # My tile's P V from registers, on my half of its V.
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_op), k_nope.index(WG).slice(WG * HALF, HALF, dim=1),
                            acc, is_async=True)
        if WG == 0:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(free.index(0))  # k0 L
            mbarrier.wait(m1_ready, ph)
            m_round = stat_m.load(row_s)
            # To the round's max; 0 while I have seen nothing valid (my P, sum and output are 0,
            # and exp2(0 - m_round) could overflow to inf: 0 * inf is NaN).
            scale = gl.where(m_new == float("-inf"), 0.0, gl.exp2(m_new - _ref(m_round)))
            k_rope.index(0).store((p * scale[:, None]).to(dtype))  # P0 over k0's rope (its scores are done)
            fence_async_shared()  # P0 (generic stores) before consumer 1's wgmma reads it (async proxy)
            _cta_barrier()
            mbarrier.arrive(s0_ready)
            l = l * scale
            acc = acc * gl.convert_layout(scale, row_o)[:, None]
            m = m_round
            mbarrier.wait(s1_ready, ph)
            acc = warpgroup_mma(p1, k_nope.index(1).slice(0, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(free.index(2))  # k1 L
        else:
            p1.store(p.to(dtype))
            fence_async_shared()
            _cta_barrier()
            mbarrier.arrive(s1_ready)
            m = m_new
            mbarrier.wait(s0_ready, ph)
            acc = warpgroup_mma(k_rope.index(0), k_nope.index(0).slice(HALF, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(free.index(3))  # k1 R
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(free.index(1))  # k0 R

    # Both hold their outputs and sums at the last round's max: add the sums, store.
    _finish(acc, m, l, stat_l, l_ready, q_nope, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr, row, hb, split, H,
            stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, row_s, o_layout, BLOCK_H, D_NOPE, DIRECT, WG,
            CLUSTER, stat_m, NATIVE)


@gluon.jit
def _flashmla_rr_kernel(
    q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, pool, topk, split_len, num_splits, qk_scale,
    stride_qr, stride_qh, stride_kv, stride_ir,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, DIRECT: gl.constexpr, KV_FP8: gl.constexpr = 0, LAUNCH_DEPENDENTS: gl.constexpr = 0,
    CLUSTER: gl.constexpr = 0, PARTIAL_NATIVE: gl.constexpr = 0, IDX_EARLY: gl.constexpr = 0,
):
    """Arguments, grid and outputs as ``_flashmla_split_kernel`` with ``BLOCK_N = 128`` (a round
    of two 64-token tiles, so splits hold whole rounds); launch with ``num_warps=4`` and
    ``maxnreg=168``. bf16/fp16 kv only (``KV_FP8=0``).

    ``CLUSTER=2`` (two splits): the splits of a (row, head block) are consecutive programs,
    launched as a thread-block cluster of two (``graphattn.kernels.launch.Launch``), and merge
    their partials in the kernel (``_finish``): ``out``/``lse`` are final, no combine follows.
    The workspace still carries half of each partial from one CTA to the other.

    ``IDX_EARLY=1``: the producer asks L2 for the split's indices first, then loads each round's
    indices a round ahead, so their memory latency is not spent before the waits for free
    halves (Nsight Compute at 128 heads x 64 rows: the producer's stalls on those loads were
    about as many as on the frees)."""
    gl.static_assert(BLOCK_H == 64, "one wgmma M tile of heads per program")
    gl.static_assert(BLOCK_N == 128, "a round: two 64-token tiles")
    gl.static_assert(D_ROPE == BLOCK_N // 2, "P0 [64 heads, 64 tokens] reuses k0's [64, 64] rope columns")
    gl.static_assert(STAGES == 2, "two slots: the round's two tiles")
    gl.static_assert(KV_FP8 == 0, "656-byte FP8 tokens run wgmma_ws")
    gl.static_assert(gl.num_warps() == 4, "the default partition is one warpgroup")
    gl.static_assert(CLUSTER == 0 or (CLUSTER == 2 and DIRECT == 0), "clusters merge two splits")
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    TILE: gl.constexpr = BLOCK_N // 2

    if LAUNCH_DEPENDENTS:
        _launch_dependents()
    hb, split, row, start, end, n_rounds = _program_split(H, topk, split_len, num_splits, BLOCK_H, BLOCK_N, CLUSTER)

    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    stat_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    q_nope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_NOPE], smem_layout)
    q_rope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_ROPE], smem_layout)
    k_nope = gl.allocate_shared_memory(dtype, [STAGES, TILE, D_NOPE], smem_layout)
    k_rope = gl.allocate_shared_memory(dtype, [STAGES, TILE, D_ROPE], smem_layout)
    p1 = gl.allocate_shared_memory(dtype, [BLOCK_H, TILE], smem_layout)
    stat_m = gl.allocate_shared_memory(gl.float32, [BLOCK_H], stat_layout)
    stat_l = gl.allocate_shared_memory(gl.float32, [2, BLOCK_H], stat_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())  # slot * 2 + half
    free = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    m0_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    m1_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    s0_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    s1_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=128)  # one cp.async arrival per thread of consumer 0
    for i in gl.static_range(4):
        mbarrier.init(ready.index(i), count=128)  # one cp.async arrival per producer thread
        mbarrier.init(free.index(i), count=1)  # each half has one last reader
    mbarrier.init(m0_ready, count=1)
    mbarrier.init(m1_ready, count=1)
    mbarrier.init(s0_ready, count=1)
    mbarrier.init(s1_ready, count=1)
    for i in gl.static_range(2):
        mbarrier.init(l_ready.index(i), count=1)

    smem = (q_nope, q_rope, k_nope, k_rope, p1, stat_m, stat_l)
    bars = (q_ready, ready, free, m0_ready, m1_ready, s0_ready, s1_ready, l_ready)
    gl.warp_specialize([
        (_producer_rr, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                        H, pool, qk_scale, row, hb, split, start, end, n_rounds,
                        stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                        stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, CLUSTER, IDX_EARLY)),
        (_consumer_rr, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                        H, pool, qk_scale, row, hb, split, start, end, n_rounds,
                        stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                        stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, 0, CLUSTER, PARTIAL_NATIVE)),
        (_consumer_rr, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                        H, pool, qk_scale, row, hb, split, start, end, n_rounds,
                        stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                        stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, 1, CLUSTER, PARTIAL_NATIVE)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
