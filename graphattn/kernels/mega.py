"""flashmla_mega-style sparse MLA: any head count, no workspace, one pass over the top-k.

One program per (row, head block) streams the row's whole top-k once and writes ``out``/``lse``
directly. Nothing is split, so it fills the device only when ``rows x head blocks`` is large
(prefill, big decode batches); it needs no workspace and no counter.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..common.kv_layout import is_fp8_kv
from ..common.metadata import D_QK, D_V
from ..common.platform import Platform, current_platform, device_scope
from . import checks
from ._core import LOG2E, _attend_row, _finalize, _store_final
from ._jit import jit, tl
from .launch import MEGA, KeyedLaunch, LaunchPlan, call_key, make_launch, memoised
from .plan import cdiv, empty_outputs, kv_fp8_constexpr, launch_parts, path_config

PATH = MEGA.name


@jit
def _mega_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr,
    H, pool, topk, qk_scale, stride_qr, stride_qh, stride_kv, stride_ir,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
    DOT_F32: tl.constexpr, IDX_AHEAD: tl.constexpr, KV_MAJOR: tl.constexpr,
    KV_FP8: tl.constexpr = 0,
):
    # Head block fastest: the programs of one row run together and share its KV through L2.
    pid = tl.program_id(0)
    head_blocks = tl.cdiv(H, BLOCK_H)
    hb = pid % head_blocks
    row = pid // head_blocks
    h_offs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    acc, m, l = _attend_row(q_ptr, row, h_offs, H, stride_qr, stride_qh, kv_ptr, stride_kv,
                            idx_ptr + row.to(tl.int64) * stride_ir, pool, 0, topk, qk_scale,
                            BLOCK_H, BLOCK_N, D_NOPE, D_ROPE, DOT_F32, IDX_AHEAD, KV_MAJOR, KV_FP8)
    out, lse = _finalize(acc, m, l)
    _store_final(out_ptr, lse_ptr, row, h_offs, H, out, lse, D_NOPE)


@memoised
def _plan(platform: Platform, rows: int, heads: int, topk: int, kv_fp8: bool = False) -> LaunchPlan:
    meta, opts = launch_parts(path_config(PATH, rows, heads, topk, platform, kv_fp8))
    head_blocks = cdiv(heads, meta["BLOCK_H"])
    main = make_launch(_mega_kernel, (rows * head_blocks,), D_NOPE=D_V, D_ROPE=D_QK - D_V,
                       DOT_F32=platform.uses_triton_interpreter,
                       KV_FP8=kv_fp8_constexpr(platform, kv_fp8), **meta, **opts)
    return LaunchPlan(MEGA, rows, heads, topk, 1, topk, head_blocks, "triton", main)


def plan_mega(rows: int, heads: int, topk: int, kv_fp8: bool = False,
              platform: Platform | None = None) -> LaunchPlan:
    """The memoised :class:`LaunchPlan` for ``q [rows, heads, 576]`` and ``indices [rows, topk]``
    (``kv_fp8``: 656-byte FP8 kv tokens; ``platform``: whose launch table, default current)."""
    return _plan(platform or current_platform(), rows, heads, topk, kv_fp8)


def bind_mega(plan: LaunchPlan, indices, sm_scale: float) -> Callable[..., Any]:
    """``plan`` with its index table bound: returns ``call(q, kv, dst=None) -> (out, lse)``
    (``out [rows, H, 512]`` in q's dtype, ``lse [rows, H]`` f32; into ``dst`` when given); see
    ``flashmla.bind_flashmla``. No input checks (:func:`sparse_mla_mega` checks first;
    backends check what they pass)."""
    main = KeyedLaunch(plan.main)
    heads, topk, qk_scale, idx_stride = plan.heads, plan.topk, sm_scale * LOG2E, indices.stride(0)
    idx_p = indices.data_ptr()  # fixed for the call's life (see flashmla.bind_flashmla)

    def call(q, kv, dst=None):
        out, lse = empty_outputs(q) if dst is None else dst
        if not plan.rows:
            return out, lse
        key, qs, kv_stride, (q_p, kv_p, out_p, lse_p) = call_key(q, kv, out, lse)
        main.run(key, (q, kv, indices, out, lse), (q_p, kv_p, idx_p, out_p, lse_p),
                 heads, kv.shape[0], topk, qk_scale, qs[0], qs[1], kv_stride, idx_stride)
        return out, lse

    return call


def run_mega(plan: LaunchPlan, q, kv, indices, sm_scale: float):
    """Launch ``plan`` once (see :func:`bind_mega`); returns ``out``, ``lse``."""
    return bind_mega(plan, indices, sm_scale)(q, kv)


@torch.library.custom_op("graphattn::sparse_mla_mega", mutates_args=())
def sparse_mla_mega(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """flashmla_mega-style sparse MLA attention: one program per (row, head block), no workspace.

    Args:
        q: ``[rows, H, 576]`` bf16/fp16, any ``H >= 1``; last dim contiguous.
        kv: ``[pool_tokens, 576]`` same dtype (V = ``kv[:, :512]``), or 656-byte FP8 tokens
            ``[pool_tokens, 656]`` uint8 in the platform's FP8 format
            (``graphattn.common.kv_layout``); last dim contiguous.
        indices: ``[rows, topk]`` int32; −1 **or any value outside ``[0, pool_tokens)``** is
            skipped (never read); duplicates count each time.
        sm_scale: softmax scale applied to ``q·k``.

    Returns:
        ``out [rows, H, 512]`` in q's dtype and ``lse [rows, H]`` f32 (natural log); a row with
        no valid index gives out 0 and lse −inf.
    """
    checks.check_attention_inputs(PATH, q, kv, indices, sm_scale)
    plan = plan_mega(q.shape[0], q.shape[1], indices.shape[1], is_fp8_kv(kv))
    with device_scope(q.device):  # Triton launches on the current device: make it q's
        return run_mega(plan, q, kv, indices, sm_scale)


@sparse_mla_mega.register_fake
def _(q, kv, indices, sm_scale):
    checks.check_attention_inputs(PATH, q, kv, indices, sm_scale)
    return empty_outputs(q)
