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
    ``stride_kv`` in bytes) with e4m3fn / e4m3fnuz values, attended by :func:`_attend_range_fp8`:
    each 128-column nope block is loaded as bytes, bitcast to FP8 and converted straight to q's
    dtype (exact: e4m3 has 4 significant bits), and its per-token float32 scale is applied to
    the products, not to the tile (scores: ``s = sum_b scale_b * (q_b . k_b)`` in float32;
    output: ``acc_b += (p * scale_b) . v_b``, the weights rounded to q's dtype). The products run
    in bf16/fp16 (never FP8 products); no float32 ``[BLOCK_N, 512]`` tile exists.
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
             D_ROPE: tl.constexpr):
    """Gather the KV rows ``idx [BLOCK_N]`` in kv's dtype (rows where ``valid`` is false are not
    read: zeros). Returns ``k_nope [BLOCK_N, D_NOPE]`` and ``k_rope [BLOCK_N, D_ROPE]``."""
    offs_d = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_ROPE)
    kv_row = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * stride_kv  # [BLOCK_N] pointers
    k_nope = tl.load(kv_row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    k_rope = tl.load(kv_row[:, None] + D_NOPE + offs_r[None, :], mask=valid[:, None], other=0.0)
    return k_nope, k_rope


@jit
def _load_fp8_block(kv_row, valid, b: tl.constexpr, KV_FP8: tl.constexpr, DT: tl.constexpr):
    """Nope columns ``[128 b, 128 b + 128)`` of the gathered 656-byte tokens (``kv_row [BLOCK_N]``
    byte pointers) as their FP8 values in ``DT`` (exact in bf16/fp16/f32: no scale applied), and
    the tokens' scale of that block ``[BLOCK_N]`` f32. Tokens where ``valid`` is false are not
    read: values and scale 0."""
    offs = b * FP8_TILE + tl.arange(0, FP8_TILE)
    raw = tl.load(kv_row[:, None] + offs[None, :], mask=valid[:, None], other=0)  # uint8
    if KV_FP8 == 2:
        k = raw.to(tl.float8e4b8, bitcast=True).to(DT)  # e4m3fnuz (gfx942)
    else:
        k = raw.to(tl.float8e4nv, bitcast=True).to(DT)  # e4m3fn
    scale_ptr = (kv_row + FP8_SCALE_OFFSET).to(tl.pointer_type(tl.float32))
    return k, tl.load(scale_ptr + b, mask=valid, other=0.0)


@jit
def _round_to_bf16(x):
    """float32 ``x`` rounded to the nearest bf16 value (ties to even), still float32: what a GPU's
    float32 -> bf16 conversion gives. The Triton interpreter's conversion truncates instead, so
    under it the FP8 path rounds here first (finite values; the conversion after is then exact)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


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
                  KV_MAJOR: tl.constexpr):
    """Online softmax over indices ``[start, end)`` of one row, kv rows in q's dtype.

    Returns ``acc [BLOCK_H, D_NOPE]`` (un-normalised, f32), ``m [BLOCK_H]`` (running max of the
    base-2 scores, −inf while nothing valid was seen) and ``l [BLOCK_H]`` (sum of exp2).
    ``IDX_AHEAD`` (constexpr 0/1): load the next tile's indices one iteration ahead, so the KV
    gather never waits on its own index load (faster on sm_90 with 3 stages; launchers default 0).
    ``KV_MAJOR`` (constexpr 0/1): compute the transposed products ``s^T = K q^T`` and
    ``acc^T += V^T p^T``, so the KV tile (``BLOCK_N`` tokens, ``D_NOPE`` columns) is the MMA's
    M side and the heads its N side; on sm_90 that lets ``BLOCK_N = 64`` reach wgmma with 16-32
    heads per program, while the heads-major form needs ``BLOCK_H >= 64`` for it.
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
        k_nope, k_rope = _load_kv(kv_ptr, stride_kv, idx, valid, BLOCK_N, D_NOPE, D_ROPE)
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
def _as_operand(x, DOT_F32: tl.constexpr, Q_DTYPE: tl.constexpr):
    """float32 ``x`` rounded to q's dtype ``Q_DTYPE`` for a product: on a GPU the conversion;
    under DOT_F32 (the interpreter) the same rounding, kept in float32 (its bf16 conversion
    truncates: :func:`_round_to_bf16` rounds as a GPU does), so the interpreter multiplies the
    values a GPU does."""
    if DOT_F32:
        if Q_DTYPE == tl.bfloat16:
            x = _round_to_bf16(x)
        elif Q_DTYPE == tl.float16:
            x = x.to(tl.float16).to(tl.float32)
    else:
        x = x.to(Q_DTYPE)
    return x


@jit
def _fp8_scores(s, q_b, k_b, scale_b, KV_MAJOR: tl.constexpr):
    """``s + scale_b * (q_b . k_b)``: one 128-column block's share of the scores, its per-token
    scale applied to the float32 product (``q_b`` is transposed when ``KV_MAJOR``)."""
    if KV_MAJOR:
        s = s + tl.dot(k_b, q_b) * scale_b[:, None]  # [BLOCK_N, BLOCK_H]
    else:
        s = s + tl.dot(q_b, tl.trans(k_b)) * scale_b[None, :]  # [BLOCK_H, BLOCK_N]
    return s


@jit
def _fp8_pv(acc_b, p, k_b, scale_b, KV_MAJOR: tl.constexpr, DOT_F32: tl.constexpr, Q_DTYPE: tl.constexpr):
    """``acc_b + (p * scale_b) . v_b``: the weights scaled per token in float32, rounded to q's
    dtype, times the block's FP8 values (``acc_b`` and ``p`` transposed when ``KV_MAJOR``)."""
    if KV_MAJOR:
        w = _as_operand(p * scale_b[:, None], DOT_F32, Q_DTYPE)
        acc_b = tl.dot(tl.trans(k_b), w.to(k_b.dtype), acc_b)  # [128, BLOCK_H]
    else:
        w = _as_operand(p * scale_b[None, :], DOT_F32, Q_DTYPE)
        acc_b = tl.dot(w.to(k_b.dtype), k_b, acc_b)  # [BLOCK_H, 128]
    return acc_b


@jit
def _join4(a0, a1, a2, a3, BLOCK_H: tl.constexpr, WIDTH: tl.constexpr):
    """``[a0 | a1 | a2 | a3]``: four ``[BLOCK_H, WIDTH]`` blocks side by side, ``[BLOCK_H, 4 WIDTH]``."""
    z = tl.join(tl.join(a0, a2), tl.join(a1, a3))  # z[h, d, j, k] = a_{2j + k}[h, d]
    return tl.reshape(tl.permute(z, (0, 2, 3, 1)), (BLOCK_H, 4 * WIDTH))


@jit
def _attend_range_fp8(q_ptr, row, h_offs, H, stride_qr, stride_qh, kv_ptr, stride_kv, idx_row_ptr, pool,
                      start, end, qk_scale, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                      D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, DOT_F32: tl.constexpr,
                      IDX_AHEAD: tl.constexpr, KV_MAJOR: tl.constexpr, KV_FP8: tl.constexpr):
    """:func:`_attend_range` for 656-byte FP8 tokens (same returns, same masking).

    No tile is dequantised: the nope part is four 128-column blocks (q's four blocks loaded once,
    each token's block loaded as bytes and converted exactly to q's dtype) and four float32
    accumulators, joined into ``acc [BLOCK_H, D_NOPE]`` at the end; each token's block scale
    multiplies that block's float32 score product and, for the output, the softmax weights
    (``acc_b += (p * scale_b) . v_b``). Triton has no tensor slicing, hence the four names.
    """
    tl.static_assert(D_NOPE == FP8_TILE * FP8_NUM_TILES and FP8_NUM_TILES == 4)
    Q_DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    DT: tl.constexpr = tl.float32 if DOT_F32 else Q_DTYPE  # the products' operand dtype
    h_mask = h_offs < H
    q_base = q_ptr + row.to(tl.int64) * stride_qr + h_offs[:, None] * stride_qh
    offs_t = tl.arange(0, FP8_TILE)
    q0 = tl.load(q_base + offs_t[None, :], mask=h_mask[:, None], other=0.0).to(DT)
    q1 = tl.load(q_base + FP8_TILE + offs_t[None, :], mask=h_mask[:, None], other=0.0).to(DT)
    q2 = tl.load(q_base + 2 * FP8_TILE + offs_t[None, :], mask=h_mask[:, None], other=0.0).to(DT)
    q3 = tl.load(q_base + 3 * FP8_TILE + offs_t[None, :], mask=h_mask[:, None], other=0.0).to(DT)
    offs_r = tl.arange(0, D_ROPE)
    q_rope = tl.load(q_base + D_NOPE + offs_r[None, :], mask=h_mask[:, None], other=0.0).to(DT)
    offs_n = tl.arange(0, BLOCK_N)
    TOK: tl.constexpr = 1 - KV_MAJOR  # the tokens axis of the scores, which softmax reduces
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    if KV_MAJOR:
        q0 = tl.trans(q0)
        q1 = tl.trans(q1)
        q2 = tl.trans(q2)
        q3 = tl.trans(q3)
        q_rope = tl.trans(q_rope)
        acc0 = tl.zeros([FP8_TILE, BLOCK_H], tl.float32)
    else:
        acc0 = tl.zeros([BLOCK_H, FP8_TILE], tl.float32)
    acc1 = tl.zeros_like(acc0)
    acc2 = tl.zeros_like(acc0)
    acc3 = tl.zeros_like(acc0)
    # With IDX_AHEAD the next tile's indices are loaded one iteration ahead (a loop-carried
    # value), so the KV gather of a tile never waits on its own index load.
    idx_next = _first_indices(idx_row_ptr, start, end, offs_n, IDX_AHEAD)
    for n0 in range(start, end, BLOCK_N):
        idx, valid, idx_next = _tile_indices(idx_row_ptr, n0, end, pool, idx_next, offs_n, BLOCK_N, IDX_AHEAD)
        kv_row = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * stride_kv  # [BLOCK_N] byte pointers
        k0, c0 = _load_fp8_block(kv_row, valid, 0, KV_FP8, DT)
        k1, c1 = _load_fp8_block(kv_row, valid, 1, KV_FP8, DT)
        k2, c2 = _load_fp8_block(kv_row, valid, 2, KV_FP8, DT)
        k3, c3 = _load_fp8_block(kv_row, valid, 3, KV_FP8, DT)
        rope_ptr = (kv_row + FP8_ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16))
        k_rope = tl.load(rope_ptr[:, None] + offs_r[None, :], mask=valid[:, None], other=0.0)
        if Q_DTYPE != tl.bfloat16:  # stored bf16, multiplied in q's dtype (rounded for fp16)
            k_rope = _as_operand(k_rope.to(tl.float32), DOT_F32, Q_DTYPE)
        k_rope = k_rope.to(DT)
        if KV_MAJOR:
            s = tl.dot(k_rope, q_rope)  # [BLOCK_N, BLOCK_H]
        else:
            s = tl.dot(q_rope, tl.trans(k_rope))  # [BLOCK_H, BLOCK_N]
        s = _fp8_scores(s, q0, k0, c0, KV_MAJOR)
        s = _fp8_scores(s, q1, k1, c1, KV_MAJOR)
        s = _fp8_scores(s, q2, k2, c2, KV_MAJOR)
        s = _fp8_scores(s, q3, k3, c3, KV_MAJOR)
        s = tl.where(tl.expand_dims(valid, 1 - TOK), s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, TOK))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.expand_dims(tl.math.exp2(m - m_ref), TOK)
        p = tl.math.exp2(s - tl.expand_dims(m_ref, TOK))
        l = l * tl.math.exp2(m - m_ref) + tl.sum(p, TOK)
        acc0 = _fp8_pv(acc0 * alpha, p, k0, c0, KV_MAJOR, DOT_F32, Q_DTYPE)
        acc1 = _fp8_pv(acc1 * alpha, p, k1, c1, KV_MAJOR, DOT_F32, Q_DTYPE)
        acc2 = _fp8_pv(acc2 * alpha, p, k2, c2, KV_MAJOR, DOT_F32, Q_DTYPE)
        acc3 = _fp8_pv(acc3 * alpha, p, k3, c3, KV_MAJOR, DOT_F32, Q_DTYPE)
        m = m_new
    if KV_MAJOR:
        acc = _join4(tl.trans(acc0), tl.trans(acc1), tl.trans(acc2), tl.trans(acc3), BLOCK_H, FP8_TILE)
    else:
        acc = _join4(acc0, acc1, acc2, acc3, BLOCK_H, FP8_TILE)
    return acc, m, l


@jit
def _attend_row(q_ptr, row, h_offs, H, stride_qr, stride_qh, kv_ptr, stride_kv, idx_row_ptr, pool,
                start, end, qk_scale, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, DOT_F32: tl.constexpr,
                IDX_AHEAD: tl.constexpr, KV_MAJOR: tl.constexpr, KV_FP8: tl.constexpr):
    """Load q of heads ``h_offs`` of ``row`` and attend indices ``[start, end)``: ``acc, m, l``
    as :func:`_attend_range` (kv in q's dtype) or :func:`_attend_range_fp8` (``KV_FP8``)."""
    if KV_FP8:
        acc, m, l = _attend_range_fp8(q_ptr, row, h_offs, H, stride_qr, stride_qh, kv_ptr, stride_kv,
                                      idx_row_ptr, pool, start, end, qk_scale, BLOCK_H, BLOCK_N, D_NOPE,
                                      D_ROPE, DOT_F32, IDX_AHEAD, KV_MAJOR, KV_FP8)
    else:
        q_nope, q_rope = _load_q(q_ptr, row, h_offs, H, stride_qr, stride_qh, D_NOPE, D_ROPE, DOT_F32)
        acc, m, l = _attend_range(q_nope, q_rope, kv_ptr, stride_kv, idx_row_ptr, pool, start, end,
                                  qk_scale, BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DOT_F32, IDX_AHEAD, KV_MAJOR)
    return acc, m, l


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
    out = acc / tl.where(empty, 1.0, l)[:, None]
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
