"""trtllm-style sparse MLA: any head count, multi-CTA split-KV combined inside ONE launch.

Each program (row, split, head block) writes its normalised partial to the workspace, then
increments the (row, head block) counter. The program that sees ``num_splits - 1`` is the last
to arrive: it merges every partial, writes ``out``/``lse``, and resets the counter to 0, so the
counter is all zeros again after every launch (graph replays rely on that).

Memory ordering: the partial stores of all threads of a program are made to precede the
increment by a CTA barrier (``tl.debug_barrier``) followed by one ``atomic_add`` with
``sem="acq_rel"`` at GPU scope (release: the barrier-ordered stores are visible to whoever
acquires the counter; acquire: the last program then sees every other program's partial).
The last program reads the partials with ``cache_modifier=".cg"`` (from L2, never a stale L1).
No program ever waits on another, so there is no deadlock whatever the scheduling.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..common.capture import is_capturing
from ..common.kv_layout import is_fp8_kv
from ..common.metadata import D_QK, D_V
from ..common.platform import Platform, current_platform, device_scope
from ..common.validation import check_indices_default
from . import checks
from ._core import LOG2E, _combine_splits, _split_program, _store_final, _store_partial
from ._jit import jit, tl
from .launch import TRTLLM, KeyedLaunch, LaunchPlan, call_key, make_launch, memoised
from .plan import cdiv, empty_outputs, kv_fp8_constexpr, launch_parts, path_config, split_layout

PATH = TRTLLM.name


@jit
def _trtllm_kernel(
    q_ptr, kv_ptr, idx_ptr, counter_ptr, ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    H, pool, topk, split_len, num_splits, qk_scale,
    stride_qr, stride_qh, stride_kv, stride_ir, stride_cr,
    stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
    DIRECT: tl.constexpr, DOT_F32: tl.constexpr, IDX_AHEAD: tl.constexpr, KV_MAJOR: tl.constexpr,
    KV_FP8: tl.constexpr = 0,
):
    row, split, hb, h_offs, out, lse = _split_program(
        q_ptr, kv_ptr, idx_ptr, H, pool, topk, split_len, num_splits, qk_scale,
        stride_qr, stride_qh, stride_kv, stride_ir,
        BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DOT_F32, IDX_AHEAD, KV_MAJOR, KV_FP8)
    if DIRECT:
        # One split: nothing to combine and the counter is never touched.
        _store_final(out_ptr, lse_ptr, row, h_offs, H, out, lse, D_NOPE)
    else:
        _store_partial(ws_out_ptr, ws_lse_ptr, row, split, h_offs, H, out, lse,
                       stride_wr, stride_ws, stride_wh, stride_lr, stride_ls, D_NOPE)
        tl.debug_barrier()  # every thread's partial stores precede the release below
        ctr = counter_ptr + row.to(tl.int64) * stride_cr + hb
        arrived = tl.atomic_add(ctr, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            out, lse = _combine_splits(ws_out_ptr, ws_lse_ptr, row, h_offs, H, num_splits,
                                       stride_wr, stride_ws, stride_wh, stride_lr, stride_ls,
                                       BLOCK_H, D_NOPE, ".cg")
            _store_final(out_ptr, lse_ptr, row, h_offs, H, out, lse, D_NOPE)
            # Every split has arrived, so no one else touches this counter in this launch.
            tl.atomic_xchg(ctr, 0, sem="relaxed", scope="gpu")


@memoised
def _plan(platform: Platform, rows: int, heads: int, topk: int, ws_splits: int, kv_fp8: bool = False) -> LaunchPlan:
    cfg = path_config(PATH, rows, heads, topk, platform, kv_fp8)
    # Only non-empty splits are launched, so the arrival count the kernel waits for is exactly
    # the number of programs per counter.
    splits, split_len = split_layout(rows, heads, topk, cfg, ws_splits, platform)
    meta, opts = launch_parts(cfg)
    head_blocks = cdiv(heads, meta["BLOCK_H"])
    main = make_launch(_trtllm_kernel, (rows * splits * head_blocks,), D_NOPE=D_V, D_ROPE=D_QK - D_V,
                       DIRECT=splits == 1, DOT_F32=platform.uses_triton_interpreter,
                       KV_FP8=kv_fp8_constexpr(platform, kv_fp8), **meta, **opts)
    return LaunchPlan(TRTLLM, rows, heads, topk, splits, split_len, head_blocks, "triton", main)


def plan_trtllm(rows: int, heads: int, topk: int, ws_splits: int, kv_fp8: bool = False,
                platform: Platform | None = None) -> LaunchPlan:
    """The memoised :class:`LaunchPlan` for ``q [rows, heads, 576]`` and ``indices [rows, topk]``
    with a workspace of ``ws_splits`` splits per row (``kv_fp8``: 656-byte FP8 kv tokens;
    ``platform``: whose launch table, default current)."""
    return _plan(platform or current_platform(), rows, heads, topk, ws_splits, kv_fp8)


def bind_trtllm(plan: LaunchPlan, indices, sm_scale: float, counter, ws_out, ws_lse) -> Callable[..., Any]:
    """``plan`` with its fixed arguments bound: returns ``call(q, kv, dst=None) -> (out, lse)``
    (``out [rows, H, 512]`` in q's dtype, ``lse [rows, H]`` f32; into ``dst`` when given).
    ``indices``, ``counter`` and the workspace views stay the same objects for the bound
    call's life (see ``flashmla.bind_flashmla``). No input checks (:func:`sparse_mla_trtllm`
    checks first; backends check what they pass)."""
    main = KeyedLaunch(plan.main)
    fixed = (indices.stride(0), counter.stride(0), ws_out.stride(0), ws_out.stride(1),
             ws_out.stride(2), ws_lse.stride(0), ws_lse.stride(1))
    heads, topk, split_len, splits = plan.heads, plan.topk, plan.split_len, plan.splits
    qk_scale = sm_scale * LOG2E
    buffers = (indices, counter, ws_out, ws_lse)
    pointers = tuple(t.data_ptr() for t in buffers)  # fixed for the call's life (see bind_flashmla)

    def call(q, kv, dst=None):
        out, lse = empty_outputs(q) if dst is None else dst
        if not plan.rows:
            return out, lse
        key, qs, kv_stride, (q_p, kv_p, out_p, lse_p) = call_key(q, kv, out, lse)
        main.run(key, (q, kv, *buffers, out, lse), (q_p, kv_p, *pointers, out_p, lse_p),
                 heads, kv.shape[0], topk, split_len, splits, qk_scale, qs[0], qs[1], kv_stride, *fixed)
        return out, lse

    return call


def run_trtllm(plan: LaunchPlan, q, kv, indices, sm_scale: float, counter, ws_out, ws_lse):
    """Launch ``plan`` once (see :func:`bind_trtllm`); returns ``out``, ``lse``."""
    return bind_trtllm(plan, indices, sm_scale, counter, ws_out, ws_lse)(q, kv)


def _check(q, kv, indices, sm_scale, counter, ws_out, ws_lse) -> LaunchPlan:
    checks.check_attention_inputs(PATH, q, kv, indices, sm_scale)
    checks.check_workspace(PATH, q, ws_out, ws_lse)
    plan = plan_trtllm(q.shape[0], q.shape[1], indices.shape[1], ws_out.shape[1], is_fp8_kv(kv))
    checks.check_counter(PATH, q, counter, plan.head_blocks)
    return plan


@torch.library.custom_op(
    "graphattn::sparse_mla_trtllm", mutates_args=("counter", "ws_out", "ws_lse")
)
def sparse_mla_trtllm(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
    counter: torch.Tensor, ws_out: torch.Tensor, ws_lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """trtllm-style sparse MLA attention: multi-CTA split-KV with an in-kernel combine.

    Args:
        q: ``[rows, H, 576]`` bf16/fp16, any ``H >= 1``; last dim contiguous.
        kv: ``[pool_tokens, 576]`` same dtype (V = ``kv[:, :512]``), or 656-byte FP8 tokens
            ``[pool_tokens, 656]`` uint8 in the platform's FP8 format
            (``graphattn.common.kv_layout``); last dim contiguous.
        indices: ``[rows, topk]`` int32; −1 **or any value outside ``[0, pool_tokens)``** is
            skipped (never read); duplicates count each time.
        sm_scale: softmax scale applied to ``q·k``.
        counter: ``[>=rows, >=ceil(H / BLOCK_H)]`` int32, **all zeros** on entry
            (``GraphMetadata.counter_for(rows)``); all zeros again when the launch finishes.
        ws_out: ``[>=rows, S, >=H, 512]`` f32 workspace for normalised split partials; at most
            ``S`` splits run (``S = 0``: one split, written directly, workspace untouched).
        ws_lse: ``[>=rows, S, >=H]`` f32 workspace (split lse, natural log).

    Returns:
        ``out [rows, H, 512]`` in q's dtype and ``lse [rows, H]`` f32 (natural log); a row with
        no valid index gives out 0 and lse −inf.
    """
    plan = _check(q, kv, indices, sm_scale, counter, ws_out, ws_lse)
    if check_indices_default() and not is_capturing():  # the debug switch: it synchronises
        checks.check_counter_zero(PATH, counter, q.shape[0], plan.head_blocks)
    with device_scope(q.device):  # Triton launches on the current device: make it q's
        return run_trtllm(plan, q, kv, indices, sm_scale, counter, ws_out, ws_lse)


@sparse_mla_trtllm.register_fake
def _(q, kv, indices, sm_scale, counter, ws_out, ws_lse):
    _check(q, kv, indices, sm_scale, counter, ws_out, ws_lse)
    return empty_outputs(q)
