"""flashmla-style sparse MLA: any head count, split-KV partials in a workspace, separate combine.

Launch 1 (``_flashmla_split_kernel``, or on sm_90 a Gluon kernel of :data:`GLUON_KERNELS`): one
program per (row, split, head block) attends over its slice of the row's top-k and writes a
normalised partial (out f32, natural-log lse) into the caller's workspace. Launch 2
(``_flashmla_combine_kernel``, or the Gluon ``_flashmla_combine_native_kernel`` of
:mod:`graphattn.kernels.wgmma_ws` for partials a Gluon kernel stored in its accumulator's
order) merges the partials; where the launch table says so (sm_90, few rows) it is a
programmatic dependent launch that starts while the split programs finish and waits for their
stores inside the kernel. With a single split the first launch writes
``out``/``lse`` directly and the combine is skipped; so it is where the launch setting says
``cluster_merge`` and a Gluon kernel of :data:`CLUSTER_MERGE_KERNELS` runs two splits: they
run as a thread-block cluster of two and merge inside the first launch.

q is read as it comes, ``[rows, H, 576]`` with any ``H >= 1``: the last head block of a row
masks heads ``>= H`` (q loaded as zeros, nothing stored), so no caller pads q or narrows the
outputs, and the workspace holds ``H`` heads per partial.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from ..common.kv_layout import is_fp8_kv
from ..common.metadata import D_QK, D_V
from ..common.platform import Platform, current_platform, device_scope, triton_interpreter_env
from . import checks
from ._core import LOG2E, _split_program, _store_final, _store_partial
from ._jit import gdc_launch_dependents, gdc_wait, jit, tl, triton
from .launch import FLASHMLA, KeyedLaunch, LaunchPlan, aligned_16, call_key, make_launch, memoised
from .plan import cdiv, empty_outputs, kv_fp8_constexpr, launch_parts, path_config, split_layout

PATH = FLASHMLA.name
D_ROPE = D_QK - D_V


@jit
def _flashmla_split_kernel(
    q_ptr, kv_ptr, idx_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, pool, topk, split_len, num_splits, qk_scale,
    stride_qr, stride_qh, stride_kv, stride_ir,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
    DIRECT: tl.constexpr, DOT_F32: tl.constexpr, IDX_AHEAD: tl.constexpr, KV_MAJOR: tl.constexpr,
    KV_FP8: tl.constexpr = 0, LAUNCH_DEPENDENTS: tl.constexpr = 0,
):
    if LAUNCH_DEPENDENTS:  # the combine (a programmatic dependent launch) may start its programs
        gdc_launch_dependents()
    row, split, hb, h_offs, out, lse = _split_program(
        q_ptr, kv_ptr, idx_ptr, H, pool, topk, split_len, num_splits, qk_scale,
        stride_qr, stride_qh, stride_kv, stride_ir,
        BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DOT_F32, IDX_AHEAD, KV_MAJOR, KV_FP8)
    if DIRECT:
        _store_final(out_ptr, lse_ptr, row, h_offs, H, out, lse, D_NOPE)
    else:
        _store_partial(ws_out_ptr, ws_lse_ptr, row, split, h_offs, H, out, lse,
                       stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, D_NOPE)


@jit
def _flashmla_combine_kernel(
    ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr, H, num_splits,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_S: tl.constexpr, D_NOPE: tl.constexpr, PDL: tl.constexpr = 0, HOLD_SMEM: tl.constexpr = 0,
    HEADS: tl.constexpr = 1,
):
    # HOLD_SMEM: bytes of shared memory the launch reserves for each program (Launch in
    # graphattn.kernels.launch: the larger of it and what the code uses itself, which is none at
    # one head a program and 4-16 KB at several), so that programs placed early by a
    # programmatic dependent launch do not share an SM.
    # One program per (row, HEADS consecutive heads): all of their splits are loaded as one
    # [HEADS, BLOCK_S, D_NOPE] tile, so the combine pays one memory latency instead of one per
    # split; grid rows * cdiv(H, HEADS).
    if PDL:  # launched before the split kernel finished: wait for it (and its stores) here
        gdc_wait()
    if HEADS == 1:
        # [BLOCK_S, D_NOPE]: the [1, BLOCK_S, D_NOPE] tile below took its reduction over the
        # splits through shared memory (7 barriers; 16 heads x 1 row 8.8 -> 9.7 us on the H200)
        pid = tl.program_id(0)
        h = pid % H
        row = (pid // H).to(tl.int64)
        s_offs = tl.arange(0, BLOCK_S)
        s_mask = s_offs < num_splits
        lse_s = tl.load(ws_lse_ptr + row * stride_lr + s_offs * stride_ls + h, mask=s_mask, other=float("-inf"))
        m = tl.max(lse_s, 0)
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp(lse_s - m_ref)  # 0 for empty and unused splits
        w_sum = tl.sum(w, 0)
        d = tl.arange(0, D_NOPE)
        o_s = tl.load(ws_out_ptr + row * stride_wr + s_offs[:, None] * stride_ws + h * stride_wh + d[None, :],
                      mask=s_mask[:, None], other=0.0)
        out = tl.sum(w[:, None] * o_s, 0) / tl.where(w_sum == 0.0, 1.0, w_sum)
        lse = tl.where(w_sum == 0.0, float("-inf"), m_ref + tl.log(tl.where(w_sum == 0.0, 1.0, w_sum)))
        tl.store(out_ptr + (row * H + h) * D_NOPE + d, out.to(out_ptr.dtype.element_ty))
        tl.store(lse_ptr + row * H + h, lse)
    else:
        pid = tl.program_id(0)
        n_hg = tl.cdiv(H, HEADS)
        h = (pid % n_hg) * HEADS + tl.arange(0, HEADS)
        row = (pid // n_hg).to(tl.int64)
        h_mask = h < H
        s_offs = tl.arange(0, BLOCK_S)
        hs_mask = h_mask[:, None] & (s_offs < num_splits)[None, :]
        lse_s = tl.load(ws_lse_ptr + row * stride_lr + s_offs[None, :] * stride_ls + h[:, None], mask=hs_mask,
                        other=float("-inf"))  # [HEADS, BLOCK_S]
        m = tl.max(lse_s, 1)
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp(lse_s - m_ref[:, None])  # 0 for empty and unused splits
        w_sum = tl.sum(w, 1)
        d = tl.arange(0, D_NOPE)
        o_ptrs = (ws_out_ptr + row * stride_wr + s_offs[None, :, None] * stride_ws + h[:, None, None] * stride_wh
                  + d[None, None, :])
        o_s = tl.load(o_ptrs, mask=hs_mask[:, :, None], other=0.0)
        out = tl.sum(w[:, :, None] * o_s, 1) / tl.where(w_sum == 0.0, 1.0, w_sum)[:, None]
        lse = tl.where(w_sum == 0.0, float("-inf"), m_ref + tl.log(tl.where(w_sum == 0.0, 1.0, w_sum)))
        tl.store(out_ptr + (row * H + h[:, None]) * D_NOPE + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=h_mask[:, None])
        tl.store(lse_ptr + row * H + h, lse, mask=h_mask)


# The Gluon kernels (sm_90) a launch config's "kernel" key names: key -> (module, function),
# imported only where the platform picks one.
GLUON_KERNELS = {
    "wgmma_ws": ("wgmma_ws", "_flashmla_ws_kernel"),  # warp-specialised: bf16/fp16 kv and FP8 tokens
    "wgmma_tn": ("wgmma_tn", "_flashmla_tn_kernel"),  # the same for <= 32 heads: heads on the N side
    "wgmma_rr": ("wgmma_rr", "_flashmla_rr_kernel"),  # bf16/fp16 kv in rounds of two tiles
}


# Gluon kernels whose two splits of a (row, head block) can run as a thread-block cluster and
# merge in the kernel (``CLUSTER=2``), where the launch setting says ``cluster_merge`` (sm_90:
# wgmma_rr's, and wgmma_ws's for FP8 tokens) and the launch's CTAs fill at least the fraction
# ``cluster_min_fill`` (default 0) of the compute units.
CLUSTER_MERGE_KERNELS = ("wgmma_rr", "wgmma_ws")

# Gluon kernels that can store their split partials in their accumulator's own order
# (``PARTIAL_NATIVE``: a warp's store is whole sectors, where head-major rows make it 8 rows of
# 32 bytes; in f32 with ``partial_native`` 1, in q's dtype with 2), read back by
# ``_flashmla_combine_native_kernel``: where the launch setting says ``partial_native``, the
# heads are a multiple of NATIVE_HEADS (a partly-masked last block stores its own heads only,
# whole warps of the accumulator, so its partial stays inside the workspace's heads), more than
# one warp's (a launch of one 16-head block keeps the head-major combine: its 16 programs a row
# beat the native combine's 64 with three quarters of their lanes masked, FP8 16 x 1 9.81 vs
# 10.06 us, docs/benchmarks.md) and the splits go through the combine.
PARTIAL_NATIVE_KERNELS = ("wgmma_rr", "wgmma_ws")
# The kernels whose head-major combine may take several heads a program (``combine_heads``):
# measured with wgmma_tn's partials only (graphattn.cuda.configs); wgmma_rr's and wgmma_ws's
# head-major partials (heads not a multiple of 16) keep one head a program until measured.
HEADS_COMBINE_KERNELS = ("wgmma_tn",)
NATIVE_HEADS = 16  # the rows of one warp of a wgmma accumulator
# Gluon kernels that can gather FP8 tokens into a ring of raw slots of their own (``RING``), where
# the launch setting says ``fp8_ring`` (the slots) and a split has at most ``ring_max_tiles``
# KV tiles (sm_90: wgmma_tn, three slots at 16 heads and two at 32).
RING_KERNELS = ("wgmma_tn",)
# Kernels whose producer can take its index loads off its path (IDX_EARLY), where the launch
# setting says ``idx_early_min_heads`` and a launch of that many heads is not a cluster merge and
# gathers in place (wgmma_tn's FP8 ring and raw halves were measured slower with it; the raw tile
# replaced the halves).
IDX_EARLY_KERNELS = ("wgmma_rr", "wgmma_tn")
# Gluon, reading what wgmma_ws._store_partial stores
NATIVE_COMBINE = ("wgmma_combine", "_flashmla_combine_native_kernel")


def _split_kernel(q, kv, topk):
    """``(kernel, cfg)`` of the first launch (see :func:`_select`)."""
    return _select(q.shape[0], q.shape[1], topk, aligned_16(q, kv), is_fp8_kv(kv))[:2]


def _select(rows: int, heads: int, topk: int, aligned: bool,
            kv_fp8: bool = False, platform: Platform | None = None) -> tuple[Any, dict[str, Any], str]:
    """``(kernel, cfg, name)`` of the first launch: the platform's choice, or flashmla's
    heads-major Triton tiles (``flashmla_triton``) where it chose a kernel that needs 16-byte
    aligned rows and the inputs are not aligned.

    Two kinds need them: the Gluon kernels (their 16-byte ``cp.async`` copies do not
    compile otherwise) and the tokens-major tile (``KV_MAJOR``), which triton 3.6 compiles for
    an unaligned kv into ``wgmma`` operand reads past its shared-memory tile: compute-sanitizer
    reports invalid ``__shared__`` reads, and the result is an illegal access or garbage (issue
    10: 48 heads x 2 rows with a kv row stride of 600). The heads-major tiles are correct for
    any stride.

    The config's ``"kernel"`` key names the Gluon kernel (:data:`GLUON_KERNELS`); for 656-byte
    FP8 tokens sm_90's table names the same kernels with ``KV_FP8=1`` (``graphattn.kernels.wgmma_ws``,
    and ``wgmma_tn`` at <= 32 heads).
    """
    cfg = path_config(PATH, rows, heads, topk, platform, kv_fp8)
    gluon = cfg.get("kernel") in GLUON_KERNELS
    if (gluon or cfg.get("KV_MAJOR")) and not aligned:
        return (_flashmla_split_kernel, path_config(PATH + "_triton", rows, heads, topk, platform, kv_fp8),
                "triton")
    if not gluon:
        return _flashmla_split_kernel, cfg, "triton_kv_major" if cfg.get("KV_MAJOR") else "triton"
    return _gluon(*GLUON_KERNELS[cfg["kernel"]]), cfg, cfg["kernel"]


def _gluon(module: str, fn: str) -> Callable:
    """Gluon function ``fn`` of kernel module ``module``, imported on first use."""
    # Where kernels are interpreted (a CPU process planning with sm_90's table) Gluon imports
    # only with the interpreter's knob on, like every kernel module here; it never runs there.
    with triton_interpreter_env():
        gluon_module = importlib.import_module(f"{__package__}.{module}")
    return getattr(gluon_module, fn)


def kernel_name(q: torch.Tensor, kv: torch.Tensor, topk: int) -> str:
    """The split kernel a launch over ``q`` and ``kv`` runs: a key of :data:`GLUON_KERNELS`
    (Gluon, sm_90: ``"wgmma_tn"`` at <= 32 heads from ``TN_MIN_ROWS`` rows, else ``"wgmma_rr"`` for
    kv in q's dtype where the launch has enough programs, ``"wgmma_ws"`` where not and for FP8 tokens),
    ``"triton_kv_major"`` (the tokens-major Triton tile) or ``"triton"`` (the heads-major tiles)."""
    return _select(q.shape[0], q.shape[1], topk, aligned_16(q, kv), is_fp8_kv(kv))[2]


@memoised
def _plan(platform: Platform, rows: int, heads: int, topk: int, ws_splits: int, aligned: bool,
          kv_fp8: bool = False) -> LaunchPlan:
    kernel, cfg, name = _select(rows, heads, topk, aligned, kv_fp8, platform)
    splits, split_len = split_layout(rows, heads, topk, cfg, ws_splits, platform)
    meta, opts = launch_parts(cfg)
    if kernel is _flashmla_split_kernel:
        meta["DOT_F32"] = platform.uses_triton_interpreter
        meta["KV_FP8"] = kv_fp8_constexpr(platform, kv_fp8)
    if cfg.get("fp8_ring") and name in RING_KERNELS and cdiv(split_len, meta["BLOCK_N"]) <= cfg["ring_max_tiles"]:
        meta["RING"] = cfg["fp8_ring"]
    elif cfg.get("fp8_raw_tile") and name in RING_KERNELS:  # more tiles: scores from registers
        meta["RAW_TILE"] = 1
    head_blocks = cdiv(heads, meta["BLOCK_H"])
    ctas = rows * splits * head_blocks
    if (splits == 2 and cfg.get("cluster_merge") and name in CLUSTER_MERGE_KERNELS
            and ctas >= cfg.get("cluster_min_fill", 0) * platform.num_compute_units()):
        meta["CLUSTER"] = 2  # the two splits merge in the kernel, as a cluster: no combine launch
    if (cfg.get("idx_early_min_heads") and name in IDX_EARLY_KERNELS and heads >= cfg["idx_early_min_heads"]
            and not (meta.get("CLUSTER") or meta.get("RING") or meta.get("RAW_TILE"))):
        meta["IDX_EARLY"] = 1  # the producer's index loads off its path
    combine = None
    if splits > 1 and not meta.get("CLUSTER"):
        ccfg = path_config(PATH + "_combine", rows, heads, topk, platform)
        cmeta, copts = launch_parts(ccfg)
        # one program per SM at most: the setting's count, capped by this GPU's SMs
        pdl_programs = min(ccfg.get("pdl_max_programs", 0), platform.num_compute_units())
        block_s = max(2, triton.next_power_of_2(splits))
        if (cfg.get("partial_native") and name in PARTIAL_NATIVE_KERNELS and heads % NATIVE_HEADS == 0
                and heads > NATIVE_HEADS):
            meta["PARTIAL_NATIVE"] = cfg["partial_native"]
            if cfg["partial_native"] == 2:
                cmeta["PARTIAL_16"] = 1
            runs = _native_runs(rows * head_blocks * (D_V // 8), block_s, cfg["partial_native"] == 2,
                                ccfg.get("native_runs", 1), pdl_programs)
            if runs > 1:
                cmeta["RUNS"] = runs
                copts["num_warps"] = 4 * runs
            combine_fn, combine_grid = _gluon(*NATIVE_COMBINE), rows * head_blocks * (D_V // 8 // runs)
        else:
            most = ccfg.get("combine_heads", 1) if name in HEADS_COMBINE_KERNELS else 1
            group = _combine_heads(rows, heads, block_s, most, pdl_programs)
            if group > 1:
                cmeta["HEADS"] = group
                copts["num_warps"] = min(16, 4 * group)
            combine_fn, combine_grid = _flashmla_combine_kernel, rows * -(-heads // group)
        # Where the combine has at most ``pdl_max_programs`` programs it is a programmatic
        # dependent launch: its programs are placed on the SMs the split programs leave idle
        # once every split program has started (they say so first thing), each reserving
        # ``pdl_hold_smem`` bytes of shared memory so that no two crowd onto one SM
        # (graphattn.cuda.configs says what was measured).
        if combine_grid <= pdl_programs:
            cmeta.update(PDL=1, HOLD_SMEM=ccfg.get("pdl_hold_smem", 0))
            copts["launch_pdl"] = True
            meta.setdefault("LAUNCH_DEPENDENTS", 1)
        combine = make_launch(combine_fn, (combine_grid,), BLOCK_S=block_s, D_NOPE=D_V, **cmeta, **copts)
    main = make_launch(kernel, (ctas,), D_NOPE=D_V, D_ROPE=D_ROPE,
                       DIRECT=splits == 1, **meta, **opts)
    return LaunchPlan(FLASHMLA, rows, heads, topk, splits, split_len, head_blocks, name, main, combine)


def _fewest_that_fit(fits: Callable[[int], bool], most: int) -> int:
    """The fewest power of two ``g`` up to ``most`` with ``fits(g)`` (the combine's programs,
    each taking ``g`` of its one-wide programs' work, fill at most one wave); 1 where none
    does."""
    g = 1
    while 2 * g <= most and not fits(g):
        g *= 2
    return g if fits(g) else 1


def _native_runs(programs: int, block_s: int, partial_16: bool, native_runs: int, pdl_programs: int) -> int:
    """Runs of 8 columns per program of the native combine (four warps each): the fewest, a
    power of two up to ``native_runs`` (the combine setting's), that bring its ``programs`` (at
    one run each) down to ``pdl_programs`` (one per SM), so that it can be a programmatic
    dependent launch; 1 where none does (the combine then runs as a plain launch of one-run
    programs). A thread holds ``4 * block_s`` partial values at any runs, and a program of
    ``4 * runs`` warps leaves it ``512 / runs`` registers: ptxas (sm_90) spills from
    ``runs * block_s`` 256 with 16-bit partials (``partial_16``) and 128 with f32 ones, so runs
    stay below that."""
    most = min(native_runs, max(1, (128 if partial_16 else 64) // block_s))
    return _fewest_that_fit(lambda runs: programs <= runs * pdl_programs, most)


def combine_heads_most(block_s: int) -> int:
    """The most heads a program of the head-major combine takes at ``block_s`` splits: a thread
    of its ``min(16, 4 * HEADS)`` warps holds at most 64 of the ``HEADS * block_s * 512`` partial
    values (ptxas, sm_90: no spills there); 1 (the one-head tile, which keeps its own rule)
    where 2 would hold more. ``graphattn.cuda.configs`` compiles each ``HEADS`` at the largest
    ``BLOCK_S`` this allows."""
    most = 1
    while (2 * most) * block_s * D_V <= 64 * 32 * min(16, 4 * (2 * most)):
        most *= 2
    return most


def _combine_heads(rows: int, heads: int, block_s: int, combine_heads: int, pdl_programs: int) -> int:
    """Heads per program of the head-major combine (``HEADS``): the fewest, a power of two up
    to ``combine_heads`` (the combine setting's) and :func:`combine_heads_most`, that bring its
    ``rows * heads`` one-head programs down to ``pdl_programs`` (one per SM), so that it can be
    a programmatic dependent launch; 1 where none does."""
    return _fewest_that_fit(lambda group: rows * -(-heads // group) <= pdl_programs,
                            min(combine_heads, combine_heads_most(block_s)))


def plan_flashmla(rows: int, heads: int, topk: int, ws_splits: int, aligned: bool = True,
                  kv_fp8: bool = False, platform: Platform | None = None) -> LaunchPlan:
    """The memoised :class:`LaunchPlan` for ``q [rows, heads, 576]`` (any ``heads >= 1``) and
    ``indices [rows, topk]`` with a workspace of ``ws_splits`` splits per row; ``aligned``:
    q and kv rows are 16-byte aligned (:func:`aligned_16`); ``kv_fp8``: kv is 656-byte FP8
    tokens (``[pool, 656]`` uint8); ``platform``: whose launch table (default current)."""
    return _plan(platform or current_platform(), rows, heads, topk, ws_splits, aligned, kv_fp8)


def bind_flashmla(plan: LaunchPlan, indices, sm_scale: float, ws_out, ws_lse) -> Callable[..., Any]:
    """``plan`` with its fixed arguments bound: returns ``call(q, kv, dst=None) -> (out, lse)``
    that launches both kernels (``out [rows, H, 512]`` in q's dtype, ``lse [rows, H]`` f32;
    written into ``dst = (out, lse)`` when given, contiguous, else allocated).

    ``indices`` ``[rows, topk]`` and the workspace views stay the same objects for the bound
    call's life (a backend keeps one per metadata and row count); each call keys its
    specialised launchers by what may differ (:func:`call_key`); once a key has launched, its
    calls pass every pointer as an int (:meth:`KeyedLaunch.run`). No input checks:
    :func:`sparse_mla_flashmla` checks before it binds, and backends check what they pass (q,
    kv and ``dst`` on the current GPU: the ints are not checked again).
    """
    main = KeyedLaunch(plan.main)
    combine = KeyedLaunch(plan.combine) if plan.combine is not None else None
    ws = (ws_out.stride(0), ws_out.stride(1), ws_out.stride(2), ws_lse.stride(0), ws_lse.stride(1))
    heads, topk, split_len, splits = plan.heads, plan.topk, plan.split_len, plan.splits
    qk_scale, idx_stride = sm_scale * LOG2E, indices.stride(0)
    idx_p, wo_p, wl_p = indices.data_ptr(), ws_out.data_ptr(), ws_lse.data_ptr()  # fixed: see above

    def call(q, kv, dst=None):
        out, lse = empty_outputs(q) if dst is None else dst
        if not plan.rows:
            return out, lse
        key, qs, kv_stride, (q_p, kv_p, out_p, lse_p) = call_key(q, kv, out, lse)
        main.run(key, (q, kv, indices, ws_out, ws_lse, out, lse), (q_p, kv_p, idx_p, wo_p, wl_p, out_p, lse_p),
                 heads, kv.shape[0], topk, split_len, splits, qk_scale, qs[0], qs[1], kv_stride, idx_stride, *ws)
        if combine is not None:
            combine.run(key, (ws_out, ws_lse, out, lse), (wo_p, wl_p, out_p, lse_p), heads, splits, *ws)
        return out, lse

    return call


def run_flashmla(plan: LaunchPlan, q, kv, indices, sm_scale: float, ws_out, ws_lse):
    """Launch ``plan`` once (see :func:`bind_flashmla`); returns ``out``, ``lse``."""
    return bind_flashmla(plan, indices, sm_scale, ws_out, ws_lse)(q, kv)


def _check(q, kv, indices, sm_scale, ws_out, ws_lse) -> None:
    checks.check_attention_inputs(PATH, q, kv, indices, sm_scale)
    checks.check_workspace(PATH, q, ws_out, ws_lse)


@torch.library.custom_op("graphattn::sparse_mla_flashmla", mutates_args=("ws_out", "ws_lse"))
def sparse_mla_flashmla(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
    ws_out: torch.Tensor, ws_lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flashmla-style sparse MLA attention with split-KV partials in a caller workspace.

    Args:
        q: ``[rows, H, 576]`` bf16/fp16, any ``H >= 1`` (read as it is: no head padding);
            last dim contiguous.
        kv: ``[pool_tokens, 576]`` same dtype (V = ``kv[:, :512]``), or 656-byte FP8 tokens
            ``[pool_tokens, 656]`` uint8 in the platform's FP8 format
            (``graphattn.common.kv_layout``); last dim contiguous.
        indices: ``[rows, topk]`` int32 pool rows; −1 **or any value outside
            ``[0, pool_tokens)``** is skipped (never read); duplicates count each time.
        sm_scale: softmax scale applied to ``q·k``.
        ws_out: ``[>=rows, S, >=H, 512]`` f32 workspace (``GraphMetadata.workspace_for(rows)``),
            overwritten with normalised split partials; the op uses at most ``S`` splits
            (``S = 0``: one split, written directly, workspace untouched).
        ws_lse: ``[>=rows, S, >=H]`` f32 workspace (split lse, natural log).

    Returns:
        ``out [rows, H, 512]`` in q's dtype and ``lse [rows, H]`` f32 (natural log); a row with
        no valid index gives out 0 and lse −inf.
    """
    _check(q, kv, indices, sm_scale, ws_out, ws_lse)
    plan = plan_flashmla(q.shape[0], q.shape[1], indices.shape[1], ws_out.shape[1], aligned_16(q, kv),
                         is_fp8_kv(kv))
    with device_scope(q.device):  # Triton launches on the current device: make it q's
        return run_flashmla(plan, q, kv, indices, sm_scale, ws_out, ws_lse)


@sparse_mla_flashmla.register_fake
def _(q, kv, indices, sm_scale, ws_out, ws_lse):
    _check(q, kv, indices, sm_scale, ws_out, ws_lse)
    return empty_outputs(q)
