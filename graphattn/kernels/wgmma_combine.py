"""flashmla's combine of split partials stored in the wgmma accumulator's own order (Gluon, sm_90):
the second launch after ``wgmma_rr``'s and ``wgmma_ws``'s splits where their launch setting says
``partial_native`` (``graphattn.kernels.flashmla``), reading the layout that
:func:`graphattn.kernels.wgmma_ws._store_partial` writes with ``NATIVE``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .wgmma import _gdc_wait

@gluon.jit
def _flashmla_combine_native_kernel(
    ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr, H, num_splits,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_S: gl.constexpr, D_NOPE: gl.constexpr, PDL: gl.constexpr = 0, PARTIAL_16: gl.constexpr = 0,
    HOLD_SMEM: gl.constexpr = 0, RUNS: gl.constexpr = 1,
):
    """flashmla's combine of partials stored in the accumulator's order (``NATIVE`` of
    :func:`_store_partial`; ``H`` a multiple of 16): ``out`` ``[rows, H, D_NOPE]`` in q's dtype and
    natural-log ``lse`` ``[rows, H]`` f32 from ``ws_out`` ``[rows, >= num_splits, H, D_NOPE]`` and
    ``ws_lse`` ``[rows, >= num_splits, H]`` f32, as ``_flashmla_combine_kernel`` does for head-major
    partials (``PARTIAL_16``: stored in ``out``'s dtype, ``NATIVE=2``). A head block of
    ``R = min(64, H - 64 hb)`` heads holds 64 runs of ``8 R`` values: run ``g`` holds columns
    ``[8 g, 8 g + 8)`` of the block's heads as ``[R k, 8 c]``, row ``k`` being head
    ``16 (k' // 8) + 8 (k // (R / 2)) + k' % 8`` with ``k' = k % (R / 2)`` (for ``R`` 64:
    ``16 (k // 8 % 4) + 8 (k // 32) + k % 8``). One program per (row, head block, ``RUNS``
    consecutive runs), grid ``rows * cdiv(H, 64) * 64 / RUNS``, ``num_warps=4 * RUNS`` (a power
    of two up to 8: four warps a run); ``BLOCK_S`` (a power of two >= 2) >= ``num_splits``.
    ``HOLD_SMEM``: bytes of shared memory the launch reserves for each program
    (``graphattn.kernels.launch.Launch``; unused here), so that programs placed early by a
    programmatic dependent launch (``PDL``) do not share an SM."""
    # Each thread holds [BLOCK_S / 2 splits, 1 head, 8 columns]: a head's weight multiplies its 8
    # columns in registers and the sum over the splits stays in the thread but for one shuffle:
    # no shared memory and no barrier (a Triton combine of the same tile converted the
    # weights' layout through shared memory: 13 barriers).
    gl.static_assert(BLOCK_S <= 32, "at most 32 splits (graphattn.cuda.configs.FLASHMLA_MAX_SPLITS)")
    gl.static_assert((D_NOPE // 8) % RUNS == 0, "a program's runs divide the head block's D_NOPE / 8")
    # A run's 8 columns to each of its four warps' threads; the runs' warps side by side, so a
    # thread's registers are the same at every RUNS (the split count sets them).
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[BLOCK_S // 2, 1, 8], threads_per_warp=[2, 16, 1],
                                        warps_per_cta=[1, 4, RUNS], order=[2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)  # [BLOCK_S, 64]: the splits' lse
    LO: gl.constexpr = gl.SliceLayout(0, L3)  # [64, 8 * RUNS]: the output
    if PDL:  # launched before the split kernel finished: wait for it (and its stores) here
        _gdc_wait()
    PROGRAMS: gl.constexpr = D_NOPE // 8 // RUNS  # a head block's programs
    pid = gl.program_id(0)
    g = (pid % PROGRAMS) * RUNS  # the program's first run
    n_hb = (H + 63) // 64
    hb = (pid // PROGRAMS) % n_hb
    row = (pid // (PROGRAMS * n_hb)).to(gl.int64)
    R = gl.minimum(H - hb * 64, 64)  # the block's heads (a partly-masked last block stores only its own)
    s = gl.expand_dims(gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, L2)), 1)
    k1 = gl.arange(0, 64, layout=gl.SliceLayout(0, L2))
    k = gl.expand_dims(k1, 0)
    c = gl.arange(0, 8 * RUNS, layout=gl.SliceLayout(0, LO))  # the program's columns
    c_run = (c // 8) * (8 * R) + c % 8  # their offsets in the partial: run c // 8's column c % 8
    s_mask = s < num_splits
    sk_mask = s_mask & (k < R)
    # The partials' loads first, so that their latency overlaps the lse's and its reductions.
    # NATIVE == 2 of _store_partial (PARTIAL_16): out's dtype, in the first half of each block's f32
    # region, element offsets doubled in the 16-bit view
    if PARTIAL_16:
        run = ws_out_ptr.to(gl.pointer_type(out_ptr.dtype.element_ty)) + 2 * (row * stride_wr + hb * 64 * stride_wh)
    else:
        run = ws_out_ptr + row * stride_wr + hb * 64 * stride_wh
    wide: gl.constexpr = 2 if PARTIAL_16 else 1
    run = run + g * 8 * R
    o_s = gl.load(run + gl.expand_dims(wide * s * stride_ws + k * 8, 2) + gl.expand_dims(gl.expand_dims(c_run, 0), 0),
                  mask=gl.expand_dims(sk_mask, 2), other=0.0).to(gl.float32)  # [BLOCK_S, 64, 8 * RUNS]
    h1 = hb * 64 + _native_head(k1, R)
    lse_s = gl.load(ws_lse_ptr + row * stride_lr + s * stride_ls + gl.expand_dims(h1, 0), mask=sk_mask,
                    other=float("-inf"))
    m = gl.max(lse_s, axis=0)
    m_ref = gl.where(m == float("-inf"), 0.0, m)
    w2 = gl.exp(lse_s - gl.expand_dims(m_ref, 0))  # 0 for empty and unused splits
    w = gl.expand_dims(w2, 2)
    w_sum = gl.sum(w, axis=0)  # [64, 1], in the output's layout
    out = gl.sum(w * o_s, axis=0) / gl.where(w_sum == 0.0, 1.0, w_sum)
    ko = gl.arange(0, 64, layout=gl.SliceLayout(1, LO))
    ho = gl.expand_dims(hb * 64 + _native_head(ko, R), 1)
    gl.store(out_ptr + (row * H + ho) * D_NOPE + g * 8 + gl.expand_dims(c, 0), out.to(out_ptr.dtype.element_ty),
             mask=gl.expand_dims(ko < R, 1))
    if g == 0:
        l = gl.sum(w2, axis=0)  # [64], in the lse's layout
        lse = gl.where(l == 0.0, float("-inf"), m_ref + gl.log(gl.where(l == 0.0, 1.0, l)))
        gl.store(lse_ptr + row * H + h1, lse, mask=k1 < R)


@gluon.jit
def _native_head(k, R):
    """The head (within its block of ``R``) of row ``k`` of a native run (see
    :func:`_flashmla_combine_native_kernel`); any value for ``k >= R``."""
    half = R // 2
    upper = k >= half
    kk = gl.where(upper, k - half, k)
    return (kk // 8) * 16 + upper.to(gl.int32) * 8 + kk % 8
