"""flashmla's split kernel for sm_90 (Hopper), hand-scheduled in Gluon: cp.async ring + wgmma.

One program per (row, split, 64-head block), 8 warps = two warpgroups. q is read unpadded
(``[rows, H, 576]``, any ``H >= 1``): the last head block's heads ``>= H`` are masked, so their q
rows in shared memory are zeros and their outputs are never stored. Per KV tile of ``BLOCK_N``
tokens:

* **gather**: every thread issues ``cp.async`` copies of the tile's 576-column rows into a ring
  of ``STAGES`` shared-memory slots (invalid indices are masked: nothing read, zeros written).
  The copies of tile ``i + STAGES - 1`` are issued before the products of tile ``i``, so the
  gather of the next tiles overlaps the tensor-core work of this one; the index tile two
  gathers ahead is loaded one iteration early so issuing never waits on it.
* **scores**: ``S = q K^T`` as wgmma with q ``[64, 576]`` resident in shared memory and the
  K slot read through a transposed view; the two warpgroups each take half of the tokens.
* **output**: ``O += P V`` as wgmma with ``P`` in registers and ``V`` = the same slot (its first
  512 columns); each warpgroup owns half of the 512 output columns (``[64, 256]`` f32 each, 128
  registers per thread), so every KV tile is gathered once per 64 heads and q never lives in
  registers.

Why Gluon: with 72 KB tiles the Triton compiler's own 2-stage schedule issues the next tile's
gather after the current products, and its 64-head tiles either spilled or gathered each KV
tile twice; docs/benchmarks.md has the measurements. Outputs and conventions are those of
``_flashmla_split_kernel`` (graphattn.kernels._core): a normalised partial (or the final
``out``/``lse`` with ``DIRECT``), scores in base 2, an index outside ``[0, pool)`` never read.
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

# The Gluon API is experimental; these two builtins were renamed between triton 3.6 and 3.9.
_async_load = getattr(_async_copy, "async_load", None) or _async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _launch_dependents():
    """``griddepcontrol.launch_dependents``: a programmatic dependent launch after this kernel
    (flashmla's combine) may start once every program has run this."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _program_split(H, topk, split_len, num_splits, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr):
    """This program's place in the grid ``rows x splits x cdiv(H, BLOCK_H)``: ``(head block,
    split, row, first index, end index, KV tiles)`` of its slice of the row's top-k."""
    pid = gl.program_id(0)
    head_blocks = gl.cdiv(H, BLOCK_H)
    hb = pid % head_blocks
    split = (pid // head_blocks) % num_splits
    row = pid // (head_blocks * num_splits)
    start = split * split_len
    end = gl.minimum(start + split_len, topk)
    return hb, split, row, start, end, gl.cdiv(end - start, BLOCK_N)


@gluon.jit
def _load_indices(idx_row_ptr, n0, end, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Indices ``[n0, n0 + BLOCK_N)`` of a row in ``layout`` (−1 past ``end``)."""
    cols = n0 + gl.arange(0, BLOCK_N, layout=layout)
    return gl.load(idx_row_ptr + cols, mask=cols < end, other=-1)


@gluon.jit
def _gather_tile(kv_ptr, stride_kv, pool, idx_n, idx_r, kn_slot, kr_slot,
                 D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                 gather_n: gl.constexpr, gather_r: gl.constexpr):
    """cp.async the KV rows ``idx`` into one ring slot (nope ``[BLOCK_N, 512]``, rope
    ``[BLOCK_N, 64]``; ``idx_n``/``idx_r``: the same indices in the two gather layouts). An index
    outside ``[0, pool)`` reads nothing and writes zeros."""
    valid_n = (idx_n >= 0) & (idx_n < pool)
    rows_n = gl.where(valid_n, idx_n, 0).to(gl.int64) * stride_kv
    cols_n = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, gather_n))
    _async_load(kn_slot, kv_ptr + rows_n[:, None] + cols_n[None, :], mask=valid_n[:, None])
    valid_r = (idx_r >= 0) & (idx_r < pool)
    rows_r = gl.where(valid_r, idx_r, 0).to(gl.int64) * stride_kv
    cols_r = D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, gather_r))
    _async_load(kr_slot, kv_ptr + rows_r[:, None] + cols_r[None, :], mask=valid_r[:, None])


@gluon.jit
def _issue_gather(kv_ptr, stride_kv, pool, idx_n, idx_r, kn_slot, kr_slot,
                  D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                  gather_n: gl.constexpr, gather_r: gl.constexpr):
    """:func:`_gather_tile`, committed as one copy group."""
    _gather_tile(kv_ptr, stride_kv, pool, idx_n, idx_r, kn_slot, kr_slot, D_NOPE, D_ROPE, gather_n, gather_r)
    _async_copy.commit_group()


@gluon.jit
def _flashmla_wgmma_kernel(
    q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, pool, topk, split_len, num_splits, qk_scale,
    stride_qr, stride_qh, stride_kv, stride_ir,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    STAGES: gl.constexpr, DIRECT: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr = 0,
):
    """Arguments, grid and outputs as ``_flashmla_split_kernel`` (graphattn.kernels.flashmla);
    launch with ``num_warps=8``. q/kv bf16 or fp16 with 16-byte aligned rows; any ``H >= 1``
    (``cdiv(H, 64)`` head blocks; heads ``>= H`` are neither read nor written)."""
    gl.static_assert(BLOCK_H == 64, "one wgmma M tile of heads per program")
    gl.static_assert(gl.num_warps() == 8, "two warpgroups: launch with num_warps=8")
    gl.static_assert(STAGES >= 2, "the ring needs a slot to gather into while one is computed")
    dtype: gl.constexpr = kv_ptr.dtype.element_ty

    # Layouts. Both products split their N side over the two warpgroups ([4, 2] warps): the
    # scores by tokens, the output by columns. The gathers give each warp whole 512-byte runs.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D_NOPE // 2, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    gather_n: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[1, 32], warps_per_cta=[8, 1], order=[1, 0])
    gather_r: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[8, 1], order=[1, 0])
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    if LAUNCH_DEPENDENTS:  # the combine (a programmatic dependent launch) may start its programs
        _launch_dependents()
    hb, split, row, start, end, n_tiles = _program_split(H, topk, split_len, num_splits, BLOCK_H, BLOCK_N)
    idx_row_ptr = idx_ptr + row.to(gl.int64) * stride_ir

    q_nope = gl.allocate_shared_memory(dtype, [BLOCK_H, D_NOPE], smem_layout)
    q_rope = gl.allocate_shared_memory(dtype, [BLOCK_H, D_ROPE], smem_layout)
    k_nope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_NOPE], smem_layout)
    k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D_ROPE], smem_layout)

    # q of this row and head block joins the first gather's copy group. Heads >= H are masked:
    # their copies read nothing and write zeros (cp.async with a source size of 0).
    q_base = q_ptr + row.to(gl.int64) * stride_qr
    h_n = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, gather_n))
    h_r = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, gather_r))
    _async_load(q_nope, q_base + h_n[:, None] * stride_qh
                + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, gather_n))[None, :],
                mask=(h_n < H)[:, None])
    _async_load(q_rope, q_base + h_r[:, None] * stride_qh
                + D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, gather_r))[None, :],
                mask=(h_r < H)[:, None])
    for j in gl.static_range(STAGES - 1):
        n0 = start + j * BLOCK_N
        _issue_gather(kv_ptr, stride_kv, pool,
                      _load_indices(idx_row_ptr, n0, end, BLOCK_N, gl.SliceLayout(1, gather_n)),
                      _load_indices(idx_row_ptr, n0, end, BLOCK_N, gl.SliceLayout(1, gather_r)),
                      k_nope.index(j), k_rope.index(j), D_NOPE, D_ROPE, gather_n, gather_r)
    n_ahead = start + (STAGES - 1) * BLOCK_N
    idx_n = _load_indices(idx_row_ptr, n_ahead, end, BLOCK_N, gl.SliceLayout(1, gather_n))
    idx_r = _load_indices(idx_row_ptr, n_ahead, end, BLOCK_N, gl.SliceLayout(1, gather_r))

    m = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=row_s)
    l = gl.full([BLOCK_H], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_H, D_NOPE], gl.float32, layout=o_layout)
    for i in range(0, n_tiles):
        slot = i % STAGES
        # Tile i has landed (this thread's copies: wait; everyone's: fence + barrier), and every
        # warp has finished the products of tile i - 1, whose slot is refilled next.
        _async_copy.wait_group(STAGES - 2)
        fence_async_shared()
        _cta_barrier()
        n_next = start + (i + STAGES - 1) * BLOCK_N
        _issue_gather(kv_ptr, stride_kv, pool, idx_n, idx_r,
                      k_nope.index((i + STAGES - 1) % STAGES), k_rope.index((i + STAGES - 1) % STAGES),
                      D_NOPE, D_ROPE, gather_n, gather_r)
        idx_n = _load_indices(idx_row_ptr, n_next + BLOCK_N, end, BLOCK_N, gl.SliceLayout(1, gather_n))
        idx_r = _load_indices(idx_row_ptr, n_next + BLOCK_N, end, BLOCK_N, gl.SliceLayout(1, gather_r))
        idx_s = _load_indices(idx_row_ptr, start + i * BLOCK_N, end, BLOCK_N, gl.SliceLayout(0, s_layout))

        kn = k_nope.index(slot)
        s = warpgroup_mma(q_nope, kn.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout),
                          use_acc=False, is_async=True)
        s = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))

        valid = (idx_s >= 0) & (idx_s < pool)
        s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, axis=1))
        # While a row has seen nothing valid m_new is -inf; subtract 0 instead (no inf - inf).
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m - m_ref)
        p = gl.exp2(s - m_ref[:, None])
        l = l * alpha + gl.sum(p, axis=1)
        m = m_new
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), kn, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _async_copy.wait_group(0)  # the ring's trailing (masked-off) groups

    empty = l == 0.0
    lse = gl.where(empty, float("-inf"), (m + gl.log2(gl.where(empty, 1.0, l))) * 0.6931471805599453)
    out = acc / gl.convert_layout(gl.where(empty, 1.0, l), row_o)[:, None]
    h_o = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_o)
    d_o = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, o_layout))
    h_s = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
    o_mask = (h_o < H)[:, None]  # heads >= H exist only in this program: never stored
    if DIRECT:
        rh = row.to(gl.int64) * H + h_o
        gl.store(out_ptr + rh[:, None] * D_NOPE + d_o[None, :], out.to(out_ptr.dtype.element_ty), mask=o_mask)
        gl.store(lse_ptr + row.to(gl.int64) * H + h_s, lse, mask=h_s < H)
    else:
        w_base = ws_out_ptr + row.to(gl.int64) * stride_wr + split * stride_ws
        gl.store(w_base + h_o[:, None] * stride_wh + d_o[None, :], out, mask=o_mask)
        gl.store(ws_lse_ptr + row.to(gl.int64) * stride_lr + split * stride_ls + h_s, lse, mask=h_s < H)
