"""Gluon pieces for flashmla's sm_90 split kernels (``wgmma_ws`` and, at <= 32 heads,
``wgmma_tn``; bf16/fp16 kv and 656-byte FP8 tokens): the program's place in the grid, index
loads, the 16-byte ``cp.async`` copies of q and of a KV tile, shared-memory views of another
dtype, and the early signal of a programmatic dependent launch.

Conventions of every kernel here are those of ``_flashmla_split_kernel``
(graphattn.kernels.flashmla): one program per (row, split, head block of 64, or 16/32 in
``wgmma_tn``); q read unpadded
(``[rows, H, 576]``, any ``H >= 1``), the last head block's heads ``>= H`` masked (zeros in
shared memory, outputs never stored); an index outside ``[0, pool)`` never read.

Why Gluon: with 72 KB tiles the Triton compiler's own 2-stage schedule issues the next tile's
gather after the current products, and its 64-head tiles either spilled or gathered each KV
tile twice; docs/benchmarks.md has the measurements. The first Gluon kernel (8 warps that issued
the gathers between their products, ``_flashmla_wgmma_kernel``) was replaced by the
warp-specialised one at 4e1066f; its schedule lived on in an 8-warp FP8 kernel until 073cbe1.
"""

from __future__ import annotations

import re

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy

# The Gluon API is experimental; these two builtins were renamed between triton 3.6 and 3.9.
_async_load = getattr(_async_copy, "async_load", None) or _async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# Shared-memory views of another dtype: ``reinterpret`` from triton 3.7 on, ``_reinterpret`` before.
_NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
# Indices that are 0 but that the compiler must not know to be: the wgmma descriptors built from
# a known slot are loop-invariant, hoisted and held in registers across the loop (72 of q's: ~144
# registers). Under triton 3.6 ``(a + b < 0)`` of two values >= 0 hides the 0; triton 3.9's range
# analysis folds it, so from 3.9 on the 0 comes from inline PTX (ptxas under 3.9, bytes spilled a
# thread: wgmma_ws 240-416 -> 4-96, wgmma_rr 8-24 -> 0, wgmma_tn's raw tile 88-100 -> 16; its in-place
# tiles keep the foldable form, ``OPAQUE=0``: 8 B there, 104 opaque). wgmma_ws's consumer 0 runs its tile 0
# before its loop with a constant index under 3.6 (hidden there, it spills 284 B) and a hidden
# one from 3.9 (constant there, the same 268-416 B). Only triton 3.6 and 3.9 were compiled.
_TRITON = re.match(r"(\d+)\.(\d+)", triton.__version__)  # None for a version string of another form: 3.6's path
_OPAQUE_ZERO = gl.constexpr(_TRITON is not None and tuple(map(int, _TRITON.groups())) >= (3, 9))


@gluon.jit
def _opaque_zero():
    """An int32 0 the compiler cannot know (inline PTX, not hoisted or folded)."""
    return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _unknown_zero(a, b, OPAQUE: gl.constexpr = 1):
    """0 (int32) for ``a, b >= 0``, which the compiler is not to know: see :data:`_OPAQUE_ZERO`
    (``OPAQUE=0``: ``(a + b < 0)`` under every triton, where 3.9 folding it measured better)."""
    z = (a + b < 0).to(gl.int32)
    if OPAQUE:
        if _OPAQUE_ZERO:
            z = _opaque_zero()
    return z


@gluon.jit
def _reinterpret(buf, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """``buf``'s bytes (a shared-memory descriptor) as a view of ``dtype``, ``shape`` and ``layout``."""
    if _NEW_REINTERPRET:
        view = buf.reinterpret(dtype, shape, layout)
    else:
        view = buf._reinterpret(dtype, shape, layout)
    return view


@gluon.jit
def _launch_dependents():
    """``griddepcontrol.launch_dependents``: a programmatic dependent launch after this kernel
    (flashmla's combine) may start once every program has run this."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _gdc_wait():
    """``griddepcontrol.wait``: in a programmatic dependent launch, wait until the kernel before
    has finished and its stores are visible."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_arrive(RELEASE: gl.constexpr):
    """``barrier.cluster.arrive`` in every thread (``RELEASE``: this thread's earlier stores are
    visible to the threads of the cluster that pass the matching :func:`_cluster_wait`)."""
    if RELEASE:
        gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; mov.u32 $0, 0;", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("barrier.cluster.arrive.relaxed.aligned; mov.u32 $0, 0;", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _cluster_wait():
    """``barrier.cluster.wait.acquire``: until every thread of the cluster that has not exited
    has arrived (:func:`_cluster_arrive`), whose released stores this thread then sees."""
    gl.inline_asm_elementwise("barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _program_split(H, topk, split_len, num_splits, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                   CLUSTER: gl.constexpr = 0):
    """This program's place in the grid ``rows x splits x cdiv(H, BLOCK_H)``: ``(head block,
    split, row, first index, end index, KV tiles)`` of its slice of the row's top-k. With
    ``CLUSTER`` (= ``num_splits``) the splits of a (row, head block) are consecutive programs,
    so that they form one thread-block cluster."""
    pid = gl.program_id(0)
    head_blocks = gl.cdiv(H, BLOCK_H)
    if CLUSTER:
        split = pid % CLUSTER
        hb = (pid // CLUSTER) % head_blocks
        row = pid // (CLUSTER * head_blocks)
    else:
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
def _prefetch_indices_l2(idx_row_ptr, start, end, THREADS: gl.constexpr = 128):
    """Ask L2 for a row's indices ``[start, end)`` (``prefetch.global.L2``, one 128-byte line a
    thread, ``THREADS`` threads): the gather's index loads of later tiles then hit L2 instead of
    waiting on memory on the producer's path."""
    LINE: gl.constexpr = 32  # int32 indices a 128-byte line
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [THREADS // 32], [0])
    for off in range(start, end, THREADS * LINE):
        cols = off + gl.arange(0, THREADS, layout=layout) * LINE
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [idx_row_ptr + cols, (cols < end).to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _load_q(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope,
            BLOCK_H: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
            gather_n: gl.constexpr, gather_r: gl.constexpr):
    """cp.async this program's q (``[BLOCK_H, 512]`` nope, ``[BLOCK_H, 64]`` rope) into shared
    memory; heads ``>= H`` read nothing and are written as zeros."""
    q_base = q_ptr + row.to(gl.int64) * stride_qr
    h_n = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, gather_n))
    h_r = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, gather_r))
    _async_load(q_nope, q_base + h_n[:, None] * stride_qh
                + gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, gather_n))[None, :],
                mask=(h_n < H)[:, None])
    _async_load(q_rope, q_base + h_r[:, None] * stride_qh
                + D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, gather_r))[None, :],
                mask=(h_r < H)[:, None])


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
