"""flashmla's split kernel for sm_90 reading 656-byte FP8 KV tokens (Gluon: cp.async ring + wgmma).

One program per (row, split, 64-head block), 8 warps = two warpgroups that both gather and
compute (not warp-specialised, unlike the bf16 kernel ``wgmma_ws``): q resident in shared
memory, a 2-slot ring of 64-token tiles gathered with 16-byte ``cp.async`` copies, the copies of
the next tile issued before the products of this one. The token's three parts are gathered
separately: the 512 FP8 bytes of the latent part, its 4 float32 block scales, its 64 bf16 rotary
values (:mod:`graphattn.common.kv_layout`). Per tile:

* **convert**: the landed slot's FP8 bytes are dequantised into q's dtype, as
  ``kv_layout.dequantize_kv`` defines the cache: each value converted to float32, times its
  token's float32 scale of its 128-value block (read from the slot's scales), rounded once to
  q's dtype, into one shared-memory tile ``kc`` (a block at a time through registers). With
  fp16 q the bf16 rotary values are rounded to fp16 on their way into the rope slot (through
  registers); with bf16 q they are copied as they are.
* **scores**: ``S = q_rope k_rope^T + q_nope kc^T``, one chain of two wgmma on the converted
  tile, as the bf16 kernel computes them on a bf16 tile.
* **output**: ``O += P V`` with ``P`` rounded to q's dtype once: one ``[64, 512]`` float32
  accumulator (each warpgroup owns half the columns). From the conversion on, the tile is
  multiplied exactly as a plain cache in q's dtype.

Shared memory (q bf16/fp16): q 72 KB, the FP8 ring 2 x 32 KB, the rope ring 2 x 8 KB, the
scales 2 x 1 KB, the converted tile 64 KB: 218 KB, one program per SM.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common.kv_layout import ROPE_OFFSET, SCALE_OFFSET, TILE
from .wgmma import _async_load, _cta_barrier, _launch_dependents, _load_indices, _load_q, _program_split

# The token layout (graphattn.common.kv_layout), as kernel constants.
FP8_SCALE_OFFSET = gl.constexpr(SCALE_OFFSET)  # bytes: the 4 float32 scales after the 512 FP8 values
FP8_ROPE_OFFSET = gl.constexpr(ROPE_OFFSET)  # bytes: then the 64 bf16 rotary values
FP8_BLOCK = gl.constexpr(TILE)  # values per scale


@gluon.jit
def _issue_gather_fp8(kv_ptr, stride_kv, pool, idx_n, idx_r, idx_c, k8_slot, kr_slot, sc_slot,
                      D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                      gather_n: gl.constexpr, gather_r: gl.constexpr, gather_c: gl.constexpr):
    """cp.async the tokens ``idx`` into one ring slot: FP8 bytes ``[BLOCK_N, 512]`` u8, rope
    ``[BLOCK_N, 64]`` bf16, scales ``[BLOCK_N, 4]`` f32; one copy group. ``idx_n``/``idx_r``/
    ``idx_c``: the same indices in the three gather layouts. Invalid tokens read nothing (zeros)."""
    valid_n = (idx_n >= 0) & (idx_n < pool)
    rows_n = gl.where(valid_n, idx_n, 0).to(gl.int64) * stride_kv
    cols_n = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, gather_n))
    _async_load(k8_slot, kv_ptr + rows_n[:, None] + cols_n[None, :], mask=valid_n[:, None])
    if kr_slot.dtype == gl.bfloat16:  # else the rope is converted on its way (_rope_to_q_dtype)
        _async_load(kr_slot, _rope_ptrs(kv_ptr, stride_kv, pool, idx_r, D_ROPE, gather_r), mask=(
            (idx_r >= 0) & (idx_r < pool))[:, None])
    valid_c = (idx_c >= 0) & (idx_c < pool)
    rows_c = gl.where(valid_c, idx_c, 0).to(gl.int64) * stride_kv
    scales = (kv_ptr + rows_c + FP8_SCALE_OFFSET).to(gl.pointer_type(gl.float32))
    cols_c = gl.arange(0, 4, layout=gl.SliceLayout(0, gather_c))
    _async_load(sc_slot, scales[:, None] + cols_c[None, :], mask=valid_c[:, None])
    _async_copy.commit_group()


@gluon.jit
def _rope_ptrs(kv_ptr, stride_kv, pool, idx, D_ROPE: gl.constexpr, layout: gl.constexpr):
    """Pointers ``[BLOCK_N, 64]`` to the tokens' bf16 rotary values (row 0 for invalid ones)."""
    valid = (idx >= 0) & (idx < pool)
    rows = gl.where(valid, idx, 0).to(gl.int64) * stride_kv
    rope = (kv_ptr + rows + FP8_ROPE_OFFSET).to(gl.pointer_type(gl.bfloat16))
    return rope[:, None] + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, layout))[None, :]


@gluon.jit
def _rope_to_q_dtype(kv_ptr, stride_kv, pool, idx, kr_slot, D_ROPE: gl.constexpr, layout: gl.constexpr):
    """fp16 q: the tokens' bf16 rotary values rounded to fp16 into the rope slot (what the
    reference multiplies); they go through registers, as ``cp.async`` cannot convert."""
    valid = (idx >= 0) & (idx < pool)
    rope = gl.load(_rope_ptrs(kv_ptr, stride_kv, pool, idx, D_ROPE, layout), mask=valid[:, None], other=0.0)
    kr_slot.store(rope.to(kr_slot.dtype))


@gluon.jit
def _convert_block(k8_slot, sc_slot, kc, b: gl.constexpr, conv: gl.constexpr):
    """FP8 columns ``[128 b, 128 b + 128)`` of the landed slot, dequantised into the converted
    tile: ``dtype(float32(fp8) * scale_b)`` with each token's scale of block ``b``."""
    raw = k8_slot.slice(b * FP8_BLOCK, FP8_BLOCK, dim=1).load(conv)  # [BLOCK_N, 128] u8
    scale = sc_slot.slice(b, 1, dim=1).load(conv)  # [BLOCK_N, 1] f32, broadcast along the row
    x = raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale
    kc.slice(b * FP8_BLOCK, FP8_BLOCK, dim=1).store(x.to(kc.dtype))


@gluon.jit
def _flashmla_wgmma_fp8_kernel(
    q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, pool, topk, split_len, num_splits, qk_scale,
    stride_qr, stride_qh, stride_kv, stride_ir,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, DIRECT: gl.constexpr, KV_FP8: gl.constexpr = 1,
    LAUNCH_DEPENDENTS: gl.constexpr = 0,
):
    """Arguments, grid and outputs as ``_flashmla_split_kernel``, with ``kv_ptr`` the 656-byte
    tokens ``[pool, 656]`` uint8 (e4m3fn; ``stride_kv`` in bytes, a multiple of 16) and q
    bf16/fp16; launch with ``num_warps=8``."""
    gl.static_assert(BLOCK_H == 64, "one wgmma M tile of heads per program")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups: launch with num_warps=8")
    gl.static_assert(STAGES == 2, "a 2-slot ring: shared memory holds no third")
    gl.static_assert(KV_FP8 == 1, "sm_90 tokens are e4m3fn")
    gl.static_assert(D_NOPE == 4 * FP8_BLOCK, "four scale blocks of 128 values")
    if LAUNCH_DEPENDENTS:
        _launch_dependents()
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D_NOPE // 2, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    gather_q: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[1, 32], warps_per_cta=[8, 1], order=[1, 0])
    gather_n: gl.constexpr = gl.BlockedLayout(  # 16 FP8 bytes per copy, 32 copies per 512-byte row
        size_per_thread=[1, 16], threads_per_warp=[1, 32], warps_per_cta=[8, 1], order=[1, 0])
    gather_r: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[8, 1], order=[1, 0])
    gather_c: gl.constexpr = gl.BlockedLayout(  # one 16-byte copy (4 scales) per token
        size_per_thread=[1, 4], threads_per_warp=[32, 1], warps_per_cta=[8, 1], order=[1, 0])
    conv: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[8, 1], order=[1, 0])
    smem16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    smem8: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    hb, split, row, start, end, n_tiles = _program_split(H, topk, split_len, num_splits, BLOCK_H, BLOCK_N)
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir

    q_nope = gl.allocate_shared_memory(dtype, [BLOCK_H, D_NOPE], smem16)
    q_rope = gl.allocate_shared_memory(dtype, [BLOCK_H, D_ROPE], smem16)
    k8 = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, D_NOPE], smem8)
    k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_ROPE], smem16)
    k_scale = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, 4], plain)
    kc = gl.allocate_shared_memory(dtype, [BLOCK_N, D_NOPE], smem16)

    _load_q(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope, BLOCK_H, D_NOPE, D_ROPE, gather_q, gather_r)
    _issue_gather_fp8(kv_ptr, stride_kv, pool,
                      _load_indices(idx_row_ptr, start, end, BLOCK_N, gl.SliceLayout(1, gather_n)),
                      _load_indices(idx_row_ptr, start, end, BLOCK_N, gl.SliceLayout(1, gather_r)),
                      _load_indices(idx_row_ptr, start, end, BLOCK_N, gl.SliceLayout(1, gather_c)),
                      k8.index(0), k_rope.index(0), k_scale.index(0), D_NOPE, D_ROPE,
                      gather_n, gather_r, gather_c)
    n_ahead = start + BLOCK_N
    idx_n = _load_indices(idx_row_ptr, n_ahead, end, BLOCK_N, gl.SliceLayout(1, gather_n))
    idx_r = _load_indices(idx_row_ptr, n_ahead, end, BLOCK_N, gl.SliceLayout(1, gather_r))
    idx_c = _load_indices(idx_row_ptr, n_ahead, end, BLOCK_N, gl.SliceLayout(1, gather_c))

    zeros = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    m = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_s)
    l = gl.full([BLOCK_H], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_H, D_NOPE], gl.float32, layout=o_layout)
    for i in range(0, n_tiles):
        slot = i % STAGES
        # Tile i has landed (wait + fence + barrier), and every warp is done with tile i - 1:
        # its products read the converted tile, which is rewritten next, and its slot is refilled.
        _async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()
        nxt = (i + 1) % STAGES
        _issue_gather_fp8(kv_ptr, stride_kv, pool, idx_n, idx_r, idx_c,
                          k8.index(nxt), k_rope.index(nxt), k_scale.index(nxt), D_NOPE, D_ROPE,
                          gather_n, gather_r, gather_c)
        n_next = start + (i + 2) * BLOCK_N
        idx_n = _load_indices(idx_row_ptr, n_next, end, BLOCK_N, gl.SliceLayout(1, gather_n))
        idx_r = _load_indices(idx_row_ptr, n_next, end, BLOCK_N, gl.SliceLayout(1, gather_r))
        idx_c = _load_indices(idx_row_ptr, n_next, end, BLOCK_N, gl.SliceLayout(1, gather_c))
        idx_s = _load_indices(idx_row_ptr, start + i * BLOCK_N, end, BLOCK_N, gl.SliceLayout(0, s_layout))

        k8_slot = k8.index(slot)
        if dtype != gl.bfloat16:
            idx_rc = _load_indices(idx_row_ptr, start + i * BLOCK_N, end, BLOCK_N, gl.SliceLayout(1, gather_r))
            _rope_to_q_dtype(kv_ptr, stride_kv, pool, idx_rc, k_rope.index(slot), D_ROPE, gather_r)
        sc_slot = k_scale.index(slot)
        _convert_block(k8_slot, sc_slot, kc, 0, conv)
        _convert_block(k8_slot, sc_slot, kc, 1, conv)
        _convert_block(k8_slot, sc_slot, kc, 2, conv)
        _convert_block(k8_slot, sc_slot, kc, 3, conv)
        fence_async_shared()  # the converted tile, written by every thread, read by wgmma
        _cta_barrier()

        s = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), zeros, use_acc=False, is_async=True)
        s = warpgroup_mma(q_nope, kc.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))

        valid = (idx_s >= 0) & (idx_s < pool)
        s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, axis=1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m - m_ref)
        p = gl.exp2(s - m_ref[:, None])
        l = l * alpha + gl.sum(p, axis=1)
        m = m_new
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), kc, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _async_copy.wait_group(0)  # the ring's trailing (masked-off) group

    empty = l == 0.0
    lse = gl.where(empty, float("-inf"), (m + gl.log2(gl.where(empty, 1.0, l))) * 0.6931471805599453)
    h_o = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_o)
    h_s = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
    d_o = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, o_layout))
    o_mask = (h_o < H)[:, None]  # heads >= H exist only in this program: never stored
    out = acc / gl.convert_layout(gl.where(empty, 1.0, l), row_o)[:, None]
    if DIRECT:
        rh = row.to(gl.int64) * H + h_o
        gl.store(out_ptr + rh[:, None] * D_NOPE + d_o[None, :], out.to(out_ptr.dtype.element_ty), mask=o_mask)
        gl.store(lse_ptr + row.to(gl.int64) * H + h_s, lse, mask=h_s < H)
    else:
        w_base = ws_out_ptr + row.to(gl.int64) * stride_wr + split * stride_ws
        gl.store(w_base + h_o[:, None] * stride_wh + d_o[None, :], out, mask=o_mask)
        gl.store(ws_lse_ptr + row.to(gl.int64) * stride_lr + split * stride_ls + h_s, lse, mask=h_s < H)
