"""Shared ``@triton.jit`` building blocks of the sparse MLA kernels (no launches here).

Every path computes, for one query row and a block of ``BLOCK_H`` heads, online-softmax attention
over a range of the row's top-k indices. The 576-wide QK dot product is split into the 512
"nope" columns and the 64 "rope" columns (two ``tl.dot`` calls: 576 is not a power of two), and
the gathered 512-column tile is reused as V, so each KV row is read once per head block.

Conventions shared by all kernels:
  * scores are kept in base 2 (``qk_scale = sm_scale * log2(e)``) so ``exp2`` can be used;
    the lse that leaves a kernel is in natural log.
  * an index outside ``[0, pool)`` (−1 included) is skipped: its KV row is never read
    (masked load) and its score is −inf. Duplicates count as many times as they appear.
  * a split partial is stored **normalised**: ``out_s = sum(p·v) / sum(p)`` in float32 and
    ``lse_s`` (natural log, −inf for a split with no valid index, whose ``out_s`` is 0).
  * ``KV_FP8`` (constexpr): 0 = kv rows are 576 values in q's dtype; 1 / 2 = kv rows are the
    656-byte FP8 tokens of ``graphattn.common.kv_layout`` (``kv_ptr`` a uint8 pointer,
    ``stride_kv`` in bytes) with e4m3fn / e4m3fnuz values. :func:`_load_fp8` dequantises each
    gathered tile into q's dtype as ``kv_layout.dequantize_kv`` defines it (the FP8 bytes bitcast,
    converted to float32, times the token's float32 scale of their 128-value block, rounded once
    to q's dtype; the bf16 rope values converted to q's dtype), and the loop then runs the plain
    path's products on it, unchanged (bf16/fp16 products, P rounded to q's dtype).
"""

from __future__ import annotations

from ._jit import jit, tl

from ..common import kv_layout

LOG2E = 1.4426950408889634
# The 656-byte token's layout, as constexprs the kernels can read.
FP8_TILE = tl.constexpr(kv_layout.TILE)
FP8_NUM_TILES = tl.constexpr(kv_layout.NUM_TILES)
FP8_SCALE_OFFSET = tl.constexpr(kv_layout.SCALE_OFFSET)
FP8_ROPE_OFFSET = tl.constexpr(kv_layout.ROPE_OFFSET)


@jit
def _load_q(q_ptr, row, h_offs, H, stride_qr, stride_qh,
            D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, DOT_F32: tl.constexpr):
    """q tiles of one row: ``q_nope [BLOCK_H, D_NOPE]``, ``q_rope [BLOCK_H, D_ROPE]``."""
    h_mask = h_offs < H
    base = q_ptr + row.to(tl.int64) * stride_qr + h_offs[:, None] * stride_qh
    q_nope = tl.load(base + tl.arange(0, D_NOPE)[None, :], mask=h_mask[:, None], other=0.0)
    q_rope = tl.load(base + D_NOPE + tl.arange(0, D_ROPE)[None, :], mask=h_mask[:, None], other=0.0)
    if DOT_F32:
        # The Triton interpreter's bf16 tl.dot is wrong (triton 3.9); fp32 dots are exact.
        q_nope = q_nope.to(tl.float32)
        q_rope = q_rope.to(tl.float32)
    return q_nope, q_rope


@jit
def _load_kv(kv_ptr, stride_kv, idx, valid, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr,
             D_ROPE: tl.constexpr, DOT_F32: tl.constexpr, KV_FP8: tl.constexpr, Q_DTYPE: tl.constexpr):
    """Gather the KV rows ``idx [BLOCK_N]`` (rows where ``valid`` is false are not read: zeros).

    Returns ``k_nope [BLOCK_N, D_NOPE]`` and ``k_rope [BLOCK_N, D_ROPE]`` in kv's dtype, or for
    656-byte FP8 tokens (``KV_FP8``) the dequantised values in q's dtype ``Q_DTYPE``
    (:func:`_load_fp8`; float32 holding those values under ``DOT_F32``).
    """
    kv_row = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * stride_kv  # [BLOCK_N] row pointers
    if KV_FP8:
        k_nope, k_rope = _load_fp8(kv_row, valid, BLOCK_N, D_NOPE, D_ROPE, DOT_F32, KV_FP8, Q_DTYPE)
    else:
        offs_d = tl.arange(0, D_NOPE)
        offs_r = tl.arange(0, D_ROPE)
        k_nope = tl.load(kv_row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        k_rope = tl.load(kv_row[:, None] + D_NOPE + offs_r[None, :], mask=valid[:, None], other=0.0)
    return k_nope, k_rope


@jit
def _load_fp8(kv_row, valid, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
              DOT_F32: tl.constexpr, KV_FP8: tl.constexpr, Q_DTYPE: tl.constexpr):
    """The gathered 656-byte tokens (``kv_row [BLOCK_N]`` byte pointers) dequantised into q's
    dtype: ``k_nope = Q_DTYPE(float32(fp8) * scale)`` per 128-value block (one rounding),
    ``k_rope`` = the stored bf16 values in ``Q_DTYPE``. Invalid tokens are not read (zeros)."""
    offs_b = tl.arange(0, FP8_NUM_TILES)
    offs_t = tl.arange(0, FP8_TILE)
    cols = offs_b[:, None] * FP8_TILE + offs_t[None, :]  # [4, 128]: the nope bytes by block
    raw = tl.load(kv_row[:, None, None] + cols[None, :, :], mask=valid[:, None, None], other=0)  # u8
    if KV_FP8 == 2:
        x = raw.to(tl.float8e4b8, bitcast=True).to(tl.float32)  # e4m3fnuz (gfx942)
    else:
        x = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)  # e4m3fn
    if DOT_F32:
        # The interpreter (triton 3.9) decodes the NaN bytes as numbers (e4m3fn's 0x7F/0xFF as
        # +-480, e4m3fnuz's 0x80 as -0); a GPU's conversion gives NaN, as the format says.
        if KV_FP8 == 2:
            x = tl.where(raw == 0x80, float("nan"), x)
        else:
            x = tl.where((raw & 0x7F) == 0x7F, float("nan"), x)
    scale_ptr = (kv_row + FP8_SCALE_OFFSET).to(tl.pointer_type(tl.float32))
    scale = tl.load(scale_ptr[:, None] + offs_b[None, :], mask=valid[:, None], other=0.0)  # [BLOCK_N, 4]
    k_nope = tl.reshape(_as_operand(x * scale[:, :, None], DOT_F32, Q_DTYPE), (BLOCK_N, D_NOPE))
    rope_ptr = (kv_row + FP8_ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16))
    k_rope = tl.load(rope_ptr[:, None] + tl.arange(0, D_ROPE)[None, :], mask=valid[:, None], other=0.0)
    if Q_DTYPE != tl.bfloat16:  # fp16 q: rounded to fp16 (float32 q: exact)
        k_rope = _as_operand(k_rope.to(tl.float32), DOT_F32, Q_DTYPE)
    return k_nope, k_rope


@jit
def _as_operand(x, DOT_F32: tl.constexpr, Q_DTYPE: tl.constexpr):
    """float32 ``x`` rounded to q's dtype ``Q_DTYPE`` for a product: on a GPU the conversion
    (round to nearest even; beyond fp16's range inf); under DOT_F32 (the interpreter) the same
    rounding, kept in float32 (its bf16 conversion truncates: :func:`_round_to_bf16` rounds as
    a GPU does), so the interpreter multiplies the values a GPU does."""
    if DOT_F32:
        if Q_DTYPE == tl.bfloat16:
            x = _round_to_bf16(x)
        elif Q_DTYPE == tl.float16:
            x = x.to(tl.float16).to(tl.float32)
    else:
        x = x.to(Q_DTYPE)
    return x


@jit
def _round_to_bf16(x):
    """float32 ``x`` rounded to the nearest bf16 value (ties to even), still float32: what a GPU's
    float32 -> bf16 conversion gives. The Triton interpreter's conversion truncates instead, so
    under it the FP8 path rounds here first (the conversion after is then exact); NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)


@jit
def _first_indices(idx_row_ptr, start, end, offs_n, IDX_AHEAD: tl.constexpr):
    """With ``IDX_AHEAD`` the first tile's indices (loaded before the loop), else a placeholder."""
    if IDX_AHEAD:
        first = tl.load(idx_row_ptr + start + offs_n, mask=start + offs_n < end, other=-1)
    else:
        first = offs_n  # unused
    return first


@jit
def _tile_indices(idx_row_ptr, n0, end, pool, idx_next, offs_n, BLOCK_N: tl.constexpr,
                  IDX_AHEAD: tl.constexpr):
    """``idx, valid, idx_next`` of the tile at ``n0``: with ``IDX_AHEAD`` the indices loaded one
    iteration ahead and the next tile's loaded now; out-of-range indices are not valid."""
    if IDX_AHEAD:
        idx = idx_next
        cols = n0 + BLOCK_N + offs_n
        idx_next = tl.load(idx_row_ptr + cols, mask=cols < end, other=-1)
    else:
        cols = n0 + offs_n
        idx = tl.load(idx_row_ptr + cols, mask=cols < end, other=-1)
    valid = (idx >= 0) & (idx < pool)  # out-of-range indices are skipped, never read
    return idx, valid, idx_next


@jit
def _attend_range(q_nope, q_rope, kv_ptr, stride_kv, idx_row_ptr, pool, start, end, qk_scale,
                  BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr,
                  D_ROPE: tl.constexpr, DOT_F32: tl.constexpr, IDX_AHEAD: tl.constexpr,
                  KV_MAJOR: tl.constexpr, KV_FP8: tl.constexpr, Q_DTYPE: tl.constexpr):
    """Online softmax over indices ``[start, end)`` of one row.

    Returns ``acc [BLOCK_H, D_NOPE]`` (un-normalised, f32), ``m [BLOCK_H]`` (running max of the
    base-2 scores, −inf while nothing valid was seen) and ``l [BLOCK_H]`` (sum of exp2).
    ``IDX_AHEAD`` (constexpr 0/1): load the next tile's indices one iteration ahead, so the KV
    gather never waits on its own index load (faster on sm_90 with 3 stages; launchers default 0).
    ``KV_MAJOR`` (constexpr 0/1): compute the transposed products ``s^T = K q^T`` and
    ``acc^T += V^T p^T``, so the KV tile (``BLOCK_N`` tokens, ``D_NOPE`` columns) is the MMA's
    M side and the heads its N side; on sm_90 that lets ``BLOCK_N = 64`` reach wgmma with 16-32
    heads per program, while the heads-major form needs ``BLOCK_H >= 64`` for it.
    ``KV_FP8`` (constexpr 0/1/2): kv rows in q's dtype, or 656-byte FP8 tokens dequantised into
    q's dtype ``Q_DTYPE`` (the pointee of q; ``q_nope`` is float32 under ``DOT_F32``) by
    :func:`_load_kv`: the products are the same either way.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_ROPE)
    TOK: tl.constexpr = 1 - KV_MAJOR  # the tokens axis of the scores, which softmax reduces
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    if KV_MAJOR:
        acc = tl.zeros([D_NOPE, BLOCK_H], tl.float32)
        q_nope_t = tl.trans(q_nope)
        q_rope_t = tl.trans(q_rope)
    else:
        acc = tl.zeros([BLOCK_H, D_NOPE], tl.float32)
    # With IDX_AHEAD the next tile's indices are loaded one iteration ahead (a loop-carried
    # value), so the KV gather of a tile never waits on its own index load.
    idx_next = _first_indices(idx_row_ptr, start, end, offs_n, IDX_AHEAD)
    for n0 in range(start, end, BLOCK_N):
        idx, valid, idx_next = _tile_indices(idx_row_ptr, n0, end, pool, idx_next, offs_n, BLOCK_N, IDX_AHEAD)
        k_nope, k_rope = _load_kv(kv_ptr, stride_kv, idx, valid, BLOCK_N, D_NOPE, D_ROPE, DOT_F32,
                                  KV_FP8, Q_DTYPE)
        # The products run in q's dtype (float32 under DOT_F32): a no-op on a GPU.
        k_nope = k_nope.to(q_nope.dtype)
        k_rope = k_rope.to(q_rope.dtype)
        if KV_MAJOR:
            s = tl.dot(k_nope, q_nope_t)  # [BLOCK_N, BLOCK_H]
            s = tl.dot(k_rope, q_rope_t, s)
        else:
            s = tl.dot(q_nope, tl.trans(k_nope))  # [BLOCK_H, BLOCK_N]
            s = tl.dot(q_rope, tl.trans(k_rope), s)
        s = tl.where(tl.expand_dims(valid, 1 - TOK), s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, TOK))
        # While a row has seen nothing valid m_new is -inf; subtract 0 instead (no inf - inf).
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_ref)
        p = tl.math.exp2(s - tl.expand_dims(m_ref, TOK))
        l = l * alpha + tl.sum(p, TOK)
        acc = acc * tl.expand_dims(alpha, TOK)
        if KV_MAJOR:
            acc = tl.dot(tl.trans(k_nope), p.to(k_nope.dtype), acc)
        else:
            acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)
        m = m_new
    if KV_MAJOR:
        acc = tl.trans(acc)
    return acc, m, l


@jit
def _attend_row(q_ptr, row, h_offs, H, stride_qr, stride_qh, kv_ptr, stride_kv, idx_row_ptr, pool,
                start, end, qk_scale, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, DOT_F32: tl.constexpr,
                IDX_AHEAD: tl.constexpr, KV_MAJOR: tl.constexpr, KV_FP8: tl.constexpr):
    """Load q of heads ``h_offs`` of ``row`` and attend indices ``[start, end)``: ``acc, m, l``
    as :func:`_attend_range` (kv in q's dtype, or 656-byte FP8 tokens with ``KV_FP8``)."""
    q_nope, q_rope = _load_q(q_ptr, row, h_offs, H, stride_qr, stride_qh, D_NOPE, D_ROPE, DOT_F32)
    return _attend_range(q_nope, q_rope, kv_ptr, stride_kv, idx_row_ptr, pool, start, end, qk_scale,
                         BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DOT_F32, IDX_AHEAD, KV_MAJOR, KV_FP8,
                         q_ptr.dtype.element_ty)


@jit
def _split_program(q_ptr, kv_ptr, idx_ptr, H, pool, topk, split_len, num_splits, qk_scale,
                   stride_qr, stride_qh, stride_kv, stride_ir,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr,
                   D_ROPE: tl.constexpr, DOT_F32: tl.constexpr, IDX_AHEAD: tl.constexpr,
                   KV_MAJOR: tl.constexpr, KV_FP8: tl.constexpr):
    """Attend this program's (row, split, head block) of a flat split-KV grid.

    The head block varies fastest, so the head blocks of one row run together and share its
    gathered KV through L2. Returns ``row, split, hb, h_offs`` and the normalised partial
    ``out [BLOCK_H, D_NOPE]`` f32 / ``lse [BLOCK_H]`` (natural log) of indices
    ``[split * split_len, (split + 1) * split_len)``.
    """
    pid = tl.program_id(0)
    head_blocks = tl.cdiv(H, BLOCK_H)
    hb = pid % head_blocks
    split = (pid // head_blocks) % num_splits
    row = pid // (head_blocks * num_splits)
    h_offs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    start = split * split_len
    end = tl.minimum(start + split_len, topk)
    acc, m, l = _attend_row(q_ptr, row, h_offs, H, stride_qr, stride_qh, kv_ptr, stride_kv,
                            idx_ptr + row.to(tl.int64) * stride_ir, pool, start, end, qk_scale,
                            BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DOT_F32, IDX_AHEAD, KV_MAJOR, KV_FP8)
    out, lse = _finalize(acc, m, l)
    return row, split, hb, h_offs, out, lse


@jit
def _finalize(acc, m, l):
    """Normalise one partial: ``out = acc / l`` (0 where l == 0), natural-log lse (−inf there)."""
    empty = l == 0.0
    out = acc * (1.0 / tl.where(empty, 1.0, l))[:, None]  # a reciprocal a row, not a division an element
    lse = tl.where(empty, float("-inf"), (m + tl.math.log2(tl.where(empty, 1.0, l))) * 0.6931471805599453)
    return out, lse


@jit
def _store_final(out_ptr, lse_ptr, row, h_offs, H, out, lse, D_NOPE: tl.constexpr):
    """Write ``out [BLOCK_H, D_NOPE]`` (cast to the output dtype) and ``lse`` of one row.

    ``out`` is ``[rows, H, D_NOPE]`` contiguous and ``lse`` ``[rows, H]`` contiguous.
    """
    h_mask = h_offs < H
    rh = row.to(tl.int64) * H + h_offs
    o_ptrs = out_ptr + rh[:, None] * D_NOPE + tl.arange(0, D_NOPE)[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])
    tl.store(lse_ptr + rh, lse, mask=h_mask)


@jit
def _store_partial(ws_out_ptr, ws_lse_ptr, row, split, h_offs, H, out, lse,
                   stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, D_NOPE: tl.constexpr):
    """Write one normalised split partial to ``ws_out[row, split, h, :]`` / ``ws_lse[row, split, h]``."""
    h_mask = h_offs < H
    o_ptrs = (ws_out_ptr + row.to(tl.int64) * stride_wr + split * stride_ws
              + h_offs[:, None] * stride_wh + tl.arange(0, D_NOPE)[None, :])
    tl.store(o_ptrs, out, mask=h_mask[:, None])
    tl.store(ws_lse_ptr + row.to(tl.int64) * stride_lr + split * stride_ls + h_offs, lse, mask=h_mask)


@jit
def _combine_splits(ws_out_ptr, ws_lse_ptr, row, h_offs, H, num_splits,
                    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                    BLOCK_H: tl.constexpr, D_NOPE: tl.constexpr, CACHE: tl.constexpr):
    """Merge ``num_splits`` normalised partials of one row and head block (natural-log lse).

    Returns ``out [BLOCK_H, D_NOPE]`` f32 and ``lse [BLOCK_H]``; a head whose every split is
    empty gets out 0 and lse −inf. ``CACHE`` is the load cache modifier (``".cg"`` when the
    partials were written by other programs of the same launch: read them from L2, not L1).
    """
    h_mask = h_offs < H
    o_base = (ws_out_ptr + row.to(tl.int64) * stride_wr + h_offs[:, None] * stride_wh
              + tl.arange(0, D_NOPE)[None, :])
    l_base = ws_lse_ptr + row.to(tl.int64) * stride_lr + h_offs
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    w_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_NOPE], tl.float32)
    for s in range(0, num_splits):
        lse_s = tl.load(l_base + s * stride_ls, mask=h_mask, other=float("-inf"), cache_modifier=CACHE)
        o_s = tl.load(o_base + s * stride_ws, mask=h_mask[:, None], other=0.0, cache_modifier=CACHE)
        m_new = tl.maximum(m, lse_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_ref)
        w = tl.exp(lse_s - m_ref)
        w_sum = w_sum * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * o_s
        m = m_new
    empty = w_sum == 0.0
    out = acc / tl.where(empty, 1.0, w_sum)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, w_sum)))
    return out, lse
