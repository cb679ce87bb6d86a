"""flashmla's split kernel for few heads on sm_90 (Hopper), in Gluon: tokens on the MMA's M side,
heads on N, so 16 or 32 heads do not pay for the 64 a wgmma M tile holds.

One program per (row, split, block of ``BLOCK_H`` = 16 or 32 heads), three warpgroups like
:mod:`graphattn.kernels.wgmma_ws` (launch ``num_warps=4`` and ``maxnreg=168``; the consumers take
232 registers each with ``setmaxnreg``, the producer 40), whose producer (q once, then 64-token
KV tiles by 16-byte ``cp.async`` into two slots) and FP8 dequantisation this kernel shares.

* The scores are computed transposed: ``S^T = K q^T`` (``[64 tokens, BLOCK_H]``, K the tile in
  shared memory as the wgmma's A operand, q^T its B), and the output too: ``O^T += V^T P^T``
  (``[512, BLOCK_H]`` f32, V^T the tile's nope part read M-major, P^T from shared memory).
  The MMA work per tile is ``BLOCK_H / 64`` of the heads-major kernel's.
* **consumers**: consumer ``w`` owns the tiles ``t`` with ``t % 2 == w``, hence slot ``w``, and
  runs each one alone: scores, an online softmax over the tile's tokens (a column reduction
  across the warpgroup), ``P^T`` into its own small buffer, ``V^T P^T``, release. Each keeps its
  own max, sum and output; nothing passes between them until the end, where each leaves its
  output in its slot (which no gather writes again) and its max and sum in a small buffer, and
  each merges and stores half of the 512 output columns. With bf16 kv and few heads the tile's
  gather, not its products, sets the pace (two consumers keep two tiles in flight); with FP8
  tokens the dequantisation and the products on each consumer's chain do (docs/benchmarks.md).
* **FP8 ring** (``RING``, where a split has few tiles): the producer gathers each tile's bytes
  into a ring of raw slots of their own, and both consumers work on every tile in one bf16 tile
  (:func:`_consumer_ring`): half its dequantisation each, so a program's few tiles finish sooner;
  with many tiles the two slots' overlap (one consumer dequantising under the other's
  products) is faster.
* **FP8 raw tile** (``RAW_TILE``, 16 heads, where a split has more tiles): the producer
  gathers each tile into a raw slot of its own; the tile's consumer loads all of it into
  registers and frees the slot at once, computes the scores with the A operand from registers
  (dequantised there, q's nope columns permuted to the registers' order) and stores the values
  into its own bf16 tile as V for ``V^T P^T`` (:func:`_tn_raw_tile`): the gathers do not wait for
  a consumer's products, and the scores read no bf16 tile from shared memory.
* **Early indices** (``IDX_EARLY``): the producer asks L2 for the split's indices at its start
  and loads each tile's two tiles ahead, so its gathers do not wait on them (launched for FP8
  tokens in place at 32 heads, where it was measured faster; graphattn.cuda.configs).

Outputs and conventions are those of ``_flashmla_split_kernel`` (graphattn.kernels.flashmla): a
normalised partial (or the final ``out``/``lse`` with ``DIRECT``), scores in base 2, an index
outside ``[0, pool)`` never read, heads ``>= H`` of the last head block masked (zeros in, never
stored). bf16/fp16 q; kv in q's dtype or 656-byte FP8 tokens (``KV_FP8=1``), 16-byte aligned rows.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .wgmma import (
    _cta_barrier,
    _launch_dependents,
    _load_indices,
    _program_split,
    _reinterpret,
    _unknown_zero,
)
from .wgmma_dequant import DEQ_32, FP8_BLOCK, _dequantise_block, _dequantise_tile, _dequantised, _fp8_views
from .wgmma_ws import CONSUMER_REGS, F32_STAGE, _producer


@gluon.jit
def _scores_t(q_nope, q_rope, k_nope, k_rope, kv_ready, t, q0, s_layout: gl.constexpr,
              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr):
    """Wait until tile ``t`` has landed, then ``S^T = K q^T`` for it (``[BLOCK_N, BLOCK_H]``)."""
    slot = t % 2
    mbarrier.wait(kv_ready.index(slot), (t // 2) & 1)
    fence_async_shared()  # the gathered bytes (generic proxy) before wgmma reads them (async proxy)
    s = warpgroup_mma(k_nope.index(slot), q_nope.index(q0).permute((1, 0)),
                      gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_layout), use_acc=False, is_async=True)
    s = warpgroup_mma(k_rope.index(slot), q_rope.index(q0).permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(s,))


@gluon.jit
def _consumer_t(smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                DIRECT: gl.constexpr, KV_FP8: gl.constexpr, WG: gl.constexpr, RAW_TILE: gl.constexpr = 0,
                q_done=None):
    """Consumer warpgroup ``WG``: tiles ``t % 2 == WG`` (slot ``WG``), whole; then the two
    outputs merged, output columns ``[WG * 256, WG * 256 + 256)`` stored (and lse by consumer 0).
    ``RAW_TILE``: each tile's FP8 bytes come from the raw slot, its scores from registers
    (:func:`_scores_from_raw`), its V into slot ``WG``, which is this consumer's alone (columns in
    :data:`V_TILE_ORDER`: the stored output columns are mapped back); q's nope columns are
    permuted first (``q_done``: both consumers' halves of the heads done)."""
    q_nope, q_rope, k_nope, k_rope, p_buf, stats, k_raw, k_scale, k_rope_bits, k_scale_rows = smem
    q_ready, kv_ready, kv_free, p_ready, l_ready, d_ready = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_H, 16])
    o_layout: gl.constexpr = s_layout  # [512, BLOCK_H]: the same instruction, 8 M tiles
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)  # per head
    tok_s: gl.constexpr = gl.SliceLayout(1, s_layout)  # per token
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir
    p_mine = p_buf.index(WG)

    mbarrier.wait(q_ready, 0)
    if RAW_TILE:  # q's nope columns in the order of the scores' A registers (half the heads each)
        _permute_q(q_nope.index(0).slice(WG * (BLOCK_H // 2), BLOCK_H // 2, dim=0))
        fence_async_shared()  # q's stores (generic) before the wgmma reads them (async proxy)
        _cta_barrier()
        mbarrier.arrive(q_done)
        mbarrier.wait(q_done, 0)
    m = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=col_s)
    l_part = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_layout)  # summed over tokens at the end
    acc = gl.zeros([D_NOPE, BLOCK_H], gl.float32, layout=o_layout)
    for t in range(WG, n_tiles, 2):
        idx_s = _load_indices(idx_row_ptr, start + t * BLOCK_N, end, BLOCK_N, tok_s)
        if RAW_TILE:
            s = _scores_from_raw(t, kv_ready, kv_free, k_raw, k_scale_rows, k_rope_bits, q_nope, q_rope,
                                 k_nope.index(WG), _unknown_zero(t, n_tiles), s_layout, WG)
        else:
            if KV_FP8:
                _dequantise_tile(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, BLOCK_N, D_NOPE,
                                 D_ROPE)
            # q's descriptors from an index that is 0 but not known to be (see wgmma_ws._issue_scores);
            # the foldable form under triton 3.9 too (opaque, ptxas spilled 104 B at 32 heads against 8).
            s = _scores_t(q_nope, q_rope, k_nope, k_rope, kv_ready, t, _unknown_zero(t, n_tiles, 0), s_layout,
                          BLOCK_H, BLOCK_N)
        m, l_part, acc = _softmax_t(s, idx_s, pool, qk_scale, m, l_part, acc, p_mine)
        # V^T's 32 descriptors from a slot index that is WG but not known to be: hoisted out of
        # the loop they would hold 64 registers across it (and spill).
        v_slot = WG + _unknown_zero(t, n_tiles, RAW_TILE)
        acc = warpgroup_mma(k_nope.index(v_slot).permute((1, 0)), p_mine, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if RAW_TILE == 0:
            mbarrier.arrive(kv_free.index(WG))
    l = gl.sum(l_part, axis=0)

    # Merge the two consumers' outputs: each leaves its output in its own slot (no gather
    # writes there again: its tiles are all done) and its max and sum beside it, then each
    # merges and stores half of the 512 output columns, 64 at a time (two whole outputs in
    # registers at once would not fit).
    _cta_barrier()  # every thread's last wgmma read of my slot is done
    _merge_view(k_nope, WG, D_NOPE, BLOCK_H).store(acc)
    stats.index(2 * WG).store(m)
    stats.index(2 * WG + 1).store(l)
    _cta_barrier()
    mbarrier.arrive(l_ready.index(WG))
    mbarrier.wait(l_ready.index(1 - WG), 0)
    m1 = stats.index(2 - 2 * WG).load(col_s)
    l1 = stats.index(3 - 2 * WG).load(col_s)
    m_all = gl.maximum(m, m1)
    m_ref = gl.where(m_all == float("-inf"), 0.0, m_all)
    a0 = gl.exp2(m - m_ref)
    a1 = gl.exp2(m1 - m_ref)
    l = l * a0 + l1 * a1
    empty = l == 0.0
    lse = gl.where(empty, float("-inf"), (m_all + gl.log2(gl.where(empty, 1.0, l))) * 0.6931471805599453)
    w0 = a0 / gl.where(empty, 1.0, l)
    w1 = a1 / gl.where(empty, 1.0, l)
    h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=col_s)
    h_ok = h < H  # heads >= H exist only in this program: never stored
    HALF: gl.constexpr = D_NOPE // 2
    for c in gl.static_range(0, HALF, BLOCK_N):
        out = (_merge_view(k_nope, WG, D_NOPE, BLOCK_H).slice(WG * HALF + c, BLOCK_N, dim=0).load(s_layout)
               * w0[None, :]
               + _merge_view(k_nope, 1 - WG, D_NOPE, BLOCK_H).slice(WG * HALF + c, BLOCK_N, dim=0).load(s_layout)
               * w1[None, :])
        d = WG * HALF + c + gl.arange(0, BLOCK_N, layout=tok_s)
        if RAW_TILE:  # the V tile's columns are in V_TILE_ORDER
            d = _v_column(d)
        _store_out_t(out, h, h_ok, d, row, split, H, out_ptr, ws_out_ptr, stride_wr, stride_ws, stride_wh, D_NOPE, DIRECT)
    if WG == 0:
        _store_lse_t(lse, h, h_ok, row, split, H, lse_ptr, ws_lse_ptr, stride_lr, stride_ls, DIRECT)


@gluon.jit
def _consumer_ring(smem, bars, idx_ptr, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr,
                   H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                   stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                   BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr,
                   DIRECT: gl.constexpr, RING: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup ``WG`` of the FP8 ring (``RING``): every tile, with the other consumer.
    Each dequantises half of the tile's tokens (``[WG * 32, WG * 32 + 32)``) from the ring slot
    into the one bf16 tile, both compute the tile's scores and softmax (the same values: nothing
    passes between them), and each its half of the output columns
    (``O^T[WG * 256 : WG * 256 + 256] += V^T P^T``), which it stores itself at the end."""
    q_nope, q_rope, k_nope, k_rope, p_buf, k_raw, k_scale_rows, k_rope_bits = smem
    q_ready, kv_ready, kv_free, work_ready, work_free = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_H, 16])
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)  # per head
    tok_s: gl.constexpr = gl.SliceLayout(1, s_layout)  # per token (and per output column)
    conv: gl.constexpr = DEQ_32  # [32, 128] bytes of my half of the tile
    HALF: gl.constexpr = D_NOPE // 2
    ROWS: gl.constexpr = BLOCK_N // 2
    ROW0: gl.constexpr = WG * ROWS
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir
    p_mine = p_buf.index(WG)

    mbarrier.wait(q_ready, 0)
    m = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=col_s)
    l_part = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_layout)  # summed over tokens at the end
    acc = gl.zeros([HALF, BLOCK_H], gl.float32, layout=s_layout)
    for t in range(0, n_tiles):
        r = t % RING
        # Descriptors from an index that is 0 but not known to be (see wgmma_ws._issue_scores).
        z = _unknown_zero(t, n_tiles)
        idx_s = _load_indices(idx_row_ptr, start + t * BLOCK_N, end, BLOCK_N, tok_s)
        mbarrier.wait(kv_ready.index(r), (t // RING) & 1)
        raw = k_raw.index(r).slice(ROW0, ROWS, dim=0)
        x0 = raw.slice(0, FP8_BLOCK, dim=1).load(conv)
        x1 = raw.slice(FP8_BLOCK, FP8_BLOCK, dim=1).load(conv)
        x2 = raw.slice(2 * FP8_BLOCK, FP8_BLOCK, dim=1).load(conv)
        x3 = raw.slice(3 * FP8_BLOCK, FP8_BLOCK, dim=1).load(conv)
        if k_rope.dtype != gl.bfloat16:  # fp16 q: my rows of the rope, rounded in place
            rl: gl.constexpr = gl.BlockedLayout(
                size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1], order=[1, 0])
            rope = k_rope_bits.index(r).slice(ROW0, ROWS, dim=0).load(rl)
            k_rope.index(r).slice(ROW0, ROWS, dim=0).store(rope.to(k_rope.dtype))
        # The bf16 tile is free once both consumers' V^T P^T of the tile before are done.
        mbarrier.wait(work_free, (t & 1) ^ 1)
        kn = k_nope.index(z).slice(ROW0, ROWS, dim=0)
        _dequantise_block(kn, k_scale_rows, r, 0, x0, conv, ROW0)
        _dequantise_block(kn, k_scale_rows, r, 1, x1, conv, ROW0)
        _dequantise_block(kn, k_scale_rows, r, 2, x2, conv, ROW0)
        _dequantise_block(kn, k_scale_rows, r, 3, x3, conv, ROW0)
        fence_async_shared()  # my rows (generic stores) before either consumer's wgmma reads them
        _cta_barrier()
        mbarrier.arrive(work_ready)
        mbarrier.wait(work_ready, t & 1)  # ... and the other consumer's rows
        fence_async_shared()
        s = warpgroup_mma(k_nope.index(z), q_nope.index(z).permute((1, 0)),
                          gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_layout), use_acc=False, is_async=True)
        s = warpgroup_mma(k_rope.index(r), q_rope.index(z).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(kv_free.index(r))  # its bytes, scales and rope are read: the gather may refill it
        m, l_part, acc = _softmax_t(s, idx_s, pool, qk_scale, m, l_part, acc, p_mine)
        acc = warpgroup_mma(k_nope.index(z).slice(WG * HALF, HALF, dim=1).permute((1, 0)), p_mine, acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(work_free)
    l = gl.sum(l_part, axis=0)
    empty = l == 0.0
    lse = gl.where(empty, float("-inf"), (m + gl.log2(gl.where(empty, 1.0, l))) * 0.6931471805599453)
    out = acc * (1.0 / gl.where(empty, 1.0, l))[None, :]
    h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=col_s)
    h_ok = h < H  # heads >= H exist only in this program: never stored
    d = WG * HALF + gl.arange(0, HALF, layout=tok_s)
    _store_out_t(out, h, h_ok, d, row, split, H, out_ptr, ws_out_ptr, stride_wr, stride_ws, stride_wh, D_NOPE, DIRECT)
    if WG == 0:
        _store_lse_t(lse, h, h_ok, row, split, H, lse_ptr, ws_lse_ptr, stride_lr, stride_ls, DIRECT)


# RAW_TILE: one scale block of a tile's bytes ([64 tokens, 128 bytes] of the raw slot) loaded so
# that a thread holds 32 consecutive bytes of each of its two tokens (16-byte loads without bank
# conflicts in the 128-byte swizzle; the values' stores see V_TILE_ORDER), and whose reshapes
# and permutes (_scores_operand) are the wgmma A operand's layout exactly: its K column kappa =
# 16 c + 8 m' + 2 q + j (c: its 8 k-steps, q: lane % 4) is the byte 32 q + 4 c + 2 m' + j of the
# token (q's nope columns are permuted the same way by _permute_q; the scores' sum does not
# depend on the order).
REGS_LOAD = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
    lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 128]))


@gluon.jit
def _permute_q(q_rows):
    """Rewrite q's nope rows ``q_rows`` (``[rows, 512]`` in shared memory) with each 128-value
    block's columns in RAW_TILE's K order (column ``16 c + 8 m' + 2 q + j`` holds value ``32 q + 4 c
    + 2 m' + j``; see :data:`REGS_LOAD`)."""
    ROWS: gl.constexpr = q_rows.shape[0]
    ql: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32],
                                        warps_per_cta=[4, 1], order=[1, 0])
    x = q_rows.load(ql)
    x = gl.reshape(x, [ROWS, 4, 4, 8, 2, 2])  # [row, block, q, c, m', j]
    x = gl.reshape(gl.permute(x, (0, 1, 3, 4, 2, 5)), [ROWS, 512])
    _cta_barrier()  # every thread's loads before any store
    q_rows.store(x)


# RAW_TILE's V tile holds each scale block's 128 columns permuted: bits (6, 5, 4, 3, 0-2) of a
# stored column are bits (4, 6, 5, 3, 0-2) of the value's column. The 8 lanes that shared memory
# serves together (REGS_LOAD's lanes 0-7: two tokens, value columns 0, 32, 64, 96 of each) then
# write 16-byte chunks 0, 2, 4, 6 of one token's 128-byte lines and 1, 3, 5, 7 of the other's
# under the swizzle; in the values' own order columns 0 and 64 lie in two lines at the same chunk
# (a 2-way bank conflict: the V stores at twice their ideal wavefronts, 3% at 16 x 512).
V_TILE_ORDER = gl.constexpr((0, 3, 1, 2, 4, 5))  # the permute of [row, bit 6, bit 5, bit 4, bit 3, bits 0-2]


@gluon.jit
def _v_tile_order(v):
    """A scale block's values ``v`` (``[64, 128]``) with its columns in the V tile's order
    (:data:`V_TILE_ORDER`; :func:`_v_column` maps them back): a relabelling of registers."""
    v = gl.reshape(v, [64, 2, 2, 2, 2, 8])
    return gl.reshape(gl.permute(v, V_TILE_ORDER.value), [64, 128])


@gluon.jit
def _v_column(i):
    """The value column (of V's 512) that column ``i`` of RAW_TILE's V tile holds (``i``: int32
    tensor), so row ``i`` of ``O^T = V^T P^T`` is output column ``_v_column(i)``."""
    return (i & ~127) | (i & 15) | ((i >> 2) & 16) | ((i << 1) & 96)


@gluon.jit
def _scores_operand(x, scale, kn, b: gl.constexpr, a_layout: gl.constexpr):
    """Scale block ``b`` of a tile: its bytes ``x`` (``[64, 128]`` uint8 in :data:`REGS_LOAD`)
    times the tokens' scales ``scale`` (``[64]`` f32), rounded to ``kn``'s dtype (the cache
    dequantised as :func:`~graphattn.kernels.wgmma_dequant._dequantised` does it), stored into the
    consumer's bf16 tile ``kn`` (``[64, 512]``: V for ``V^T P^T``, columns in
    :data:`V_TILE_ORDER`) and returned as the scores' A operand (``[64, 128]`` in ``a_layout``,
    columns in RAW_TILE's order)."""
    v = _dequantised(x, scale, kn.dtype)
    kn.slice(b * FP8_BLOCK, FP8_BLOCK, dim=1).store(_v_tile_order(v))
    return _scores_a(v, a_layout)


@gluon.jit
def _scores_a(v, a_layout: gl.constexpr):
    """A scale block's values ``v`` (``[64, 128]`` in :data:`REGS_LOAD`) as the scores' A operand
    (``[64, 128]`` in ``a_layout``, columns in RAW_TILE's order): no value moves between threads."""
    v = gl.reshape(v, [64, 4, 8, 2, 2])  # byte 32 q + 4 c + 2 m' + j
    v = gl.reshape(gl.permute(v, (0, 2, 3, 1, 4)), [64, 128])  # column 16 c + 8 m' + 2 q + j
    return gl.convert_layout(v, a_layout, assert_trivial=True)


@gluon.jit
def _scores_from_raw(t, kv_ready, kv_free, k_raw, k_scale_rows, k_rope_bits, q_nope, q_rope, kn, z,
                     s_layout: gl.constexpr, WG: gl.constexpr):
    """``RAW_TILE``: tile ``t``'s ``S^T = K q^T`` (``[64, BLOCK_H]`` f32) with every A operand from
    registers. Waits for the tile in the raw slot (its consumer's ready barrier), loads all of it
    (FP8 bytes, scales, the bf16 rope: rounded to fp16 for fp16 q) and frees the slot at once, so
    the next gather does not wait for this tile's products; then per scale block dequantises
    into the A registers and ``kn`` (V, for ``V^T P^T``: the caller's softmax fences and syncs
    those stores) and issues its product, two blocks' products in flight under the next
    block's conversion. ``z``: 0, not known to be (q's descriptors stay in the loop)."""
    dtype: gl.constexpr = kn.dtype
    BLOCK_H: gl.constexpr = q_nope.shape[1]
    BLOCK_N: gl.constexpr = kn.shape[0]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    sc_layout: gl.constexpr = gl.SliceLayout(1, REGS_LOAD)
    mbarrier.wait(kv_ready.index(WG), (t // 2) & 1)  # the slot's barrier for my tiles
    raw = k_raw.index(0)
    qn = q_nope.index(z)
    ra = k_rope_bits.index(0).load(a_layout).to(dtype)
    x0 = raw.slice(0, FP8_BLOCK, dim=1).load(REGS_LOAD)
    x1 = raw.slice(FP8_BLOCK, FP8_BLOCK, dim=1).load(REGS_LOAD)
    x2 = raw.slice(2 * FP8_BLOCK, FP8_BLOCK, dim=1).load(REGS_LOAD)
    x3 = raw.slice(3 * FP8_BLOCK, FP8_BLOCK, dim=1).load(REGS_LOAD)
    c0 = k_scale_rows.index(0).load(sc_layout)
    c1 = k_scale_rows.index(1).load(sc_layout)
    c2 = k_scale_rows.index(2).load(sc_layout)
    c3 = k_scale_rows.index(3).load(sc_layout)
    _cta_barrier()  # every thread has read the slot: the gather may refill it
    mbarrier.arrive(kv_free.index(0))
    s = warpgroup_mma(ra, q_rope.index(z).permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=s_layout),
                      use_acc=False, is_async=True)
    a0 = _scores_operand(x0, c0, kn, 0, a_layout)
    s = warpgroup_mma(a0, qn.slice(0, FP8_BLOCK, dim=1).permute((1, 0)), s, is_async=True)
    a1 = _scores_operand(x1, c1, kn, 1, a_layout)
    s = warpgroup_mma(a1, qn.slice(FP8_BLOCK, FP8_BLOCK, dim=1).permute((1, 0)), s, is_async=True)
    # The operands stay live until a wait names them (their registers are read asynchronously).
    ra, a0 = warpgroup_mma_wait(num_outstanding=1, deps=(ra, a0))
    a2 = _scores_operand(x2, c2, kn, 2, a_layout)
    s = warpgroup_mma(a2, qn.slice(2 * FP8_BLOCK, FP8_BLOCK, dim=1).permute((1, 0)), s, is_async=True)
    a1 = warpgroup_mma_wait(num_outstanding=1, deps=(a1,))
    a3 = _scores_operand(x3, c3, kn, 3, a_layout)
    s = warpgroup_mma(a3, qn.slice(3 * FP8_BLOCK, FP8_BLOCK, dim=1).permute((1, 0)), s, is_async=True)
    s, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(s, a2, a3))
    return s


@gluon.jit
def _softmax_t(s, idx_s, pool, qk_scale, m, l_part, acc, p_buf):
    """One tile's online softmax over its tokens (``s``: ``S^T`` ``[BLOCK_N, BLOCK_H]``, tokens
    outside ``[0, pool)`` masked): the running max ``m``, the per-token sums ``l_part`` and the
    output ``acc`` rescaled, and ``P^T`` stored into ``p_buf`` for the wgmma. Returns ``(m,
    l_part, acc)``."""
    valid = (idx_s >= 0) & (idx_s < pool)
    s = gl.where(valid[:, None], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, axis=0))
    # While a head has seen nothing valid its max is -inf; subtract 0 instead (no inf - inf).
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m - m_ref)
    p = gl.exp2(s - m_ref[None, :])
    l_part = l_part * alpha[None, :] + p
    acc = acc * alpha[None, :]
    p_buf.store(p.to(p_buf.dtype))
    fence_async_shared()  # P^T (generic stores) before the wgmma reads it (async proxy)
    _cta_barrier()
    return m_new, l_part, acc


@gluon.jit
def _store_out_t(out, h, h_ok, d, row, split, H, out_ptr, ws_out_ptr, stride_wr, stride_ws, stride_wh,
                 D_NOPE: gl.constexpr, DIRECT: gl.constexpr):
    """Output columns ``d`` of heads ``h`` (``out``: ``[len(d), BLOCK_H]`` f32): the final output
    in its dtype with ``DIRECT``, else this split's partial; only heads ``h_ok`` (``h < H``: the
    others exist only in this program) are stored."""
    o_mask = h_ok[None, :]
    if DIRECT:
        rh = row.to(gl.int64) * H + h
        gl.store(out_ptr + rh[None, :] * D_NOPE + d[:, None], out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        w_base = ws_out_ptr + row.to(gl.int64) * stride_wr + split * stride_ws
        gl.store(w_base + h[None, :] * stride_wh + d[:, None], out, mask=o_mask)


@gluon.jit
def _store_lse_t(lse, h, h_ok, row, split, H, lse_ptr, ws_lse_ptr, stride_lr, stride_ls, DIRECT: gl.constexpr):
    """The lse of heads ``h`` (those ``h_ok``): the final one with ``DIRECT``, else this split's."""
    if DIRECT:
        gl.store(lse_ptr + row.to(gl.int64) * H + h, lse, mask=h_ok)
    else:
        gl.store(ws_lse_ptr + row.to(gl.int64) * stride_lr + split * stride_ls + h, lse, mask=h_ok)


@gluon.jit
def _merge_view(k_nope, w: gl.constexpr, D_NOPE: gl.constexpr, BLOCK_H: gl.constexpr):
    """Slot ``w``'s nope tile (``[64, 512]`` of q's dtype: 64 KB) as an f32 ``[512, BLOCK_H]``
    output (rows of 128 bytes) in :data:`~graphattn.kernels.wgmma_ws.F32_STAGE`, whose swizzle
    spreads the wgmma accumulator's rows over all 32 banks."""
    WIDTH: gl.constexpr = 32  # 2 x 64 x 512 x 2 bytes = 2 x 512 x 32 x 4
    view = _reinterpret(k_nope, gl.float32, [2, D_NOPE, WIDTH], F32_STAGE)
    return view.index(w).slice(0, BLOCK_H, dim=1)


@gluon.jit
def _flashmla_tn_kernel(
    q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, pool, topk, split_len, num_splits, qk_scale,
    stride_qr, stride_qh, stride_kv, stride_ir,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, DIRECT: gl.constexpr, KV_FP8: gl.constexpr = 0, LAUNCH_DEPENDENTS: gl.constexpr = 0,
    RING: gl.constexpr = 0, RAW_TILE: gl.constexpr = 0, IDX_EARLY: gl.constexpr = 0,
):
    """Arguments, grid and outputs as ``_flashmla_split_kernel`` (graphattn.kernels.flashmla)
    with ``BLOCK_H`` 16 or 32; launch with ``num_warps=4`` and ``maxnreg=168`` (12 warps run:
    producer, two consumers). ``KV_FP8=1``: 656-byte e4m3fn tokens (see wgmma_ws). ``RING=R``
    (FP8 only): the tokens' bytes land in a ring of ``R`` slots of their own, and both
    consumers work on every tile in one bf16 tile (:func:`_consumer_ring`). ``RAW_TILE=1``
    (FP8, 16 heads): the tokens' bytes land in a raw slot of their own, out of which each
    consumer takes its tiles' scores in registers and its V into its own bf16 tile
    (:func:`_tn_raw_tile`).
    ``IDX_EARLY=1``: the producer asks L2 for the split's indices first and loads each tile's
    two tiles ahead (wgmma_ws's ``_producer``)."""
    gl.static_assert((BLOCK_H == 16) | (BLOCK_H == 32), "heads on the wgmma's N side: 16 or 32 per program")
    gl.static_assert(BLOCK_N == 64, "tokens on the wgmma's M side: one M tile per KV tile")
    gl.static_assert(STAGES == 2, "two KV slots, one per consumer")
    gl.static_assert(gl.num_warps() == 4, "the default partition is one warpgroup")
    gl.static_assert((KV_FP8 == 0) | (KV_FP8 == 1), "sm_90 FP8 tokens are e4m3fn")
    gl.static_assert((KV_FP8 == 0) | (D_NOPE == 4 * FP8_BLOCK), "four scale blocks of 128 values")
    gl.static_assert(RING == 0 or (KV_FP8 == 1 and RING >= 2), "the ring holds FP8 tokens' bytes")
    gl.static_assert(RAW_TILE == 0 or (KV_FP8 == 1 and RING == 0 and RAW_TILE == 1),
                     "the raw slot holds FP8 tokens' bytes, instead of RING")
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    if LAUNCH_DEPENDENTS:  # the combine (a programmatic dependent launch) may start its programs
        _launch_dependents()
    hb, split, row, start, end, n_tiles = _program_split(H, topk, split_len, num_splits, BLOCK_H, BLOCK_N)
    if RAW_TILE:  # FP8 tokens through a raw slot, the scores from registers, each consumer its own V
        _tn_raw_tile(q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                     H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                     stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                     stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, IDX_EARLY)
    elif RING:  # FP8 tokens through a ring of their own
        _tn_ring(q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                 H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                 stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                 BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, RING, IDX_EARLY)
    else:
        smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # P^T [64 tokens, BLOCK_H]: the wgmma's B operand, heads contiguous (rows of 32 or 64 bytes).
        p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * BLOCK_H, element_bitwidth=16, rank=2)
        stat_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        q_nope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_NOPE], smem_layout)
        q_rope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_ROPE], smem_layout)
        k_nope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_NOPE], smem_layout)
        k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_ROPE], smem_layout)
        p_buf = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_H], p_layout)
        stats = gl.allocate_shared_memory(gl.float32, [4, BLOCK_H], stat_layout)  # (max, sum) per consumer
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        l_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        if KV_FP8:
            k_raw, k_scale, k_rope_bits, k_scale_rows = _fp8_views(k_nope, k_rope, STAGES, BLOCK_N, D_NOPE, D_ROPE)
        else:
            k_raw = k_nope
            k_scale = stats
            k_scale_rows = stats
            k_rope_bits = k_rope
        mbarrier.init(q_ready, count=128)  # one cp.async arrival per producer thread
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(i), count=128)
            mbarrier.init(kv_free.index(i), count=1)  # the slot's one consumer
        for i in gl.static_range(2):
            mbarrier.init(l_ready.index(i), count=1)

        smem = (q_nope, q_rope, k_nope, k_rope, p_buf, stats, k_raw, k_scale, k_rope_bits, k_scale_rows)
        # The producer's barrier tuple has wgmma_ws's shape; its p_ready and d_ready places (unused
        # here) hold l_ready.
        bars = (q_ready, kv_ready, kv_free, l_ready, l_ready, l_ready)
        gl.warp_specialize([
            (_producer, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                         H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                         stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                         stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, KV_FP8, 0, q_ready, stats, 2, 1,
                         IDX_EARLY)),
            (_consumer_t, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                           H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                           stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                           stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, KV_FP8, 0)),
            (_consumer_t, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                           H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                           stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                           stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, KV_FP8, 1)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


@gluon.jit
def _tn_ring(q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
             H, pool, qk_scale, row, hb, split, start, end, n_tiles,
             stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
             BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
             DIRECT: gl.constexpr, RING: gl.constexpr, IDX_EARLY: gl.constexpr = 0):
    """``_flashmla_tn_kernel`` with ``RING`` (FP8 tokens): the producer gathers each tile's
    bytes, scales and rope into a ring of ``RING`` slots (41 KB each: three beside q and one
    bf16 tile at 16 heads), freed once both consumers have dequantised the bytes and computed the
    scores, so the gather runs up to ``RING`` tiles ahead of the products instead of waiting for
    a consumer to finish a tile; the two consumers share one bf16 tile (:func:`_consumer_ring`)."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    raw_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * BLOCK_H, element_bitwidth=16, rank=2)
    rows_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    q_nope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_NOPE], smem_layout)
    q_rope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_ROPE], smem_layout)
    k_nope = gl.allocate_shared_memory(dtype, [1, BLOCK_N, D_NOPE], smem_layout)  # the bf16 tile
    k_rope = gl.allocate_shared_memory(dtype, [RING, BLOCK_N, D_ROPE], smem_layout)  # rope ring: as gathered
    k_raw = gl.allocate_shared_memory(gl.uint8, [RING, BLOCK_N, D_NOPE], raw_layout)
    k_scale = gl.allocate_shared_memory(gl.float32, [RING, 4, BLOCK_N], gl.SwizzledSharedLayout(
        vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    p_buf = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_H], p_layout)
    k_scale_rows = _reinterpret(k_scale, gl.float32, [RING * 4, BLOCK_N], rows_layout)
    k_rope_bits = _reinterpret(k_rope, gl.bfloat16, [RING, BLOCK_N, D_ROPE], smem_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    kv_free = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    work_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    work_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=128)  # one cp.async arrival per producer thread
    for i in gl.static_range(RING):
        mbarrier.init(kv_ready.index(i), count=128)
        mbarrier.init(kv_free.index(i), count=2)  # both consumers
    mbarrier.init(work_ready, count=2)
    mbarrier.init(work_free, count=2)

    # The producer's tuples have wgmma_ws's shape; the places it does not use hold q_ready.
    p_smem = (q_nope, q_rope, k_nope, k_rope, p_buf, p_buf, k_raw, k_scale, k_rope_bits, k_scale_rows)
    p_bars = (q_ready, kv_ready, kv_free, q_ready, q_ready, q_ready)
    smem = (q_nope, q_rope, k_nope, k_rope, p_buf, k_raw, k_scale_rows, k_rope_bits)
    bars = (q_ready, kv_ready, kv_free, work_ready, work_free)
    gl.warp_specialize([
        (_producer, (p_smem, p_bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                     H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                     stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                     stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, 1, 0, q_ready, p_buf, RING, 1,
                     IDX_EARLY)),
        (_consumer_ring, (smem, bars, idx_ptr, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr,
                          H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                          stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                          BLOCK_H, BLOCK_N, D_NOPE, DIRECT, RING, 0)),
        (_consumer_ring, (smem, bars, idx_ptr, out_ptr, lse_ptr, ws_out_ptr, ws_lse_ptr,
                          H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                          stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                          BLOCK_H, BLOCK_N, D_NOPE, DIRECT, RING, 1)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


@gluon.jit
def _tn_raw_tile(q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                 H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                 stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                 BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                 DIRECT: gl.constexpr, IDX_EARLY: gl.constexpr = 0):
    """``_flashmla_tn_kernel`` with ``RAW_TILE=1`` (FP8 tokens, 16 heads): the producer gathers
    each tile (bytes, scales and rope: 41 KB) into one raw slot, with a ready barrier per
    consumer (tile ``t`` is consumer ``t % 2``'s); the consumer loads the whole tile into
    registers and frees the slot, then computes its scores from registers and stores its V into
    its own bf16 tile (:func:`_consumer_t` with ``RAW_TILE``, :func:`_scores_from_raw`). So the
    next gather waits only for the loads, not for any product, and one consumer's conversions
    overlap the other's products. Shared memory: q 18 KiB + two bf16 V tiles 128 KiB + the raw
    slot 41 KiB + P^T 4 KiB (no bf16 rope tiles: the rope's product reads the raw slot's)."""
    gl.static_assert(BLOCK_H == 16, "q, two bf16 tiles and the raw slot fill the shared memory at 16 heads")
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    raw_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * BLOCK_H, element_bitwidth=16, rank=2)
    rows_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    stat_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    q_nope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_NOPE], smem_layout)
    q_rope = gl.allocate_shared_memory(dtype, [1, BLOCK_H, D_ROPE], smem_layout)
    k_nope = gl.allocate_shared_memory(dtype, [2, BLOCK_N, D_NOPE], smem_layout)  # one V tile per consumer
    p_buf = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_H], p_layout)
    k_raw = gl.allocate_shared_memory(gl.uint8, [1, BLOCK_N, D_NOPE], raw_layout)
    k_rope_bits = gl.allocate_shared_memory(gl.bfloat16, [1, BLOCK_N, D_ROPE], smem_layout)
    k_scale = gl.allocate_shared_memory(gl.float32, [1, 4, BLOCK_N], gl.SwizzledSharedLayout(
        vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    stats = gl.allocate_shared_memory(gl.float32, [4, BLOCK_H], stat_layout)  # (max, sum) per consumer
    k_scale_rows = _reinterpret(k_scale, gl.float32, [4, BLOCK_N], rows_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # one per consumer
    kv_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())  # q's columns permuted
    mbarrier.init(q_ready, count=128)  # one cp.async arrival per producer thread
    mbarrier.init(q_done, count=2)  # both consumers
    mbarrier.init(kv_ready.index(0), count=128)
    mbarrier.init(kv_ready.index(1), count=128)
    mbarrier.init(kv_free.index(0), count=1)  # the tile's one consumer
    for i in gl.static_range(2):
        mbarrier.init(l_ready.index(i), count=1)

    # The tuples have wgmma_ws's shape; the places a partition does not use hold stats (the
    # producer's bf16 tiles, and the consumers' rope tiles: the raw slot's rope is read instead).
    p_smem = (q_nope, q_rope, k_nope, stats, stats, stats, k_raw, k_scale, k_rope_bits, k_scale_rows)
    smem = (q_nope, q_rope, k_nope, stats, p_buf, stats, k_raw, k_scale, k_rope_bits, k_scale_rows)
    bars = (q_ready, kv_ready, kv_free, l_ready, l_ready, l_ready)
    gl.warp_specialize([
        (_producer, (p_smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                     H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                     stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                     stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, 1, 0, q_ready, stats, 1, 2,
                     IDX_EARLY)),
        (_consumer_t, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                       H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                       stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                       stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, 1, 0, 1, q_done)),
        (_consumer_t, (smem, bars, q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
                       H, pool, qk_scale, row, hb, split, start, end, n_tiles,
                       stride_qr, stride_qh, stride_kv, stride_ir, stride_wr, stride_ws, stride_wh, stride_lr,
                       stride_ls, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DIRECT, 1, 1, 1, q_done)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
