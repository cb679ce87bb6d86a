"""Input checks of the kernel ops: each failure says what was expected, what came, and the fix.

Shared by the real implementations and the fake (meta) ones, so ``torch.compile`` tracing
rejects bad inputs the same way an eager call does.
"""

from __future__ import annotations

import math

import torch

from ..common.kv_layout import TOKEN_BYTES, check_fp8_kv, is_fp8_kv
from ..common.metadata import D_QK, D_V
from ..common.platform import current_platform
from ..common.validation import check_sm_scale

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_attention_inputs(path: str, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                           sm_scale: float | None = None) -> None:
    """Check ``q [rows, H, 576]``, ``kv [pool, 576]`` (or ``[pool, 656]`` uint8 FP8 tokens),
    ``indices [rows, topk] int32``, and ``sm_scale`` (a finite float > 0) where given.

    Requirements: q bf16 or fp16 and kv in q's dtype, or kv in the 656-byte FP8 layout
    (:mod:`graphattn.common.kv_layout`: 4-byte aligned rows); the last dim of q, kv and indices
    has stride 1 (other strides are free, e.g. a head slice of a larger q); all on one device of
    the current platform.
    """
    if isinstance(sm_scale, (int, float)):  # a symbolic float under torch.compile is not checked
        check_sm_scale(path, sm_scale)
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{path}: q must be bfloat16 or float16, got {q.dtype}; cast q first")
    if is_fp8_kv(kv):
        check_fp8_kv(path, kv)
    elif kv.dtype != q.dtype:
        raise TypeError(
            f"{path}: kv dtype must equal q dtype {q.dtype} (or be uint8 [pool, {TOKEN_BYTES}] FP8 "
            f"tokens), got {kv.dtype}"
        )
    if indices.dtype != torch.int32:
        raise TypeError(f"{path}: indices must be int32, got {indices.dtype}; use indices.int()")
    if q.dim() != 3 or q.shape[2] != D_QK:
        raise ValueError(f"{path}: q must be [rows, heads, {D_QK}], got {_shape(q)}")
    width = TOKEN_BYTES if is_fp8_kv(kv) else D_QK
    if kv.dim() != 2 or kv.shape[1] != width:
        raise ValueError(
            f"{path}: kv must be [pool_tokens, {width}] (V = the first {D_V} values), got "
            f"{_shape(kv)}; flatten a paged cache to [pages * page_size, {width}]"
        )
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(
            f"{path}: indices must be [rows={q.shape[0]}, topk], got {_shape(indices)}"
        )
    if q.shape[1] < 1 or indices.shape[1] < 1 or kv.shape[0] < 1:
        raise ValueError(
            f"{path}: heads, topk and pool_tokens must be >= 1, got q {_shape(q)}, "
            f"kv {_shape(kv)}, indices {_shape(indices)}"
        )
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"{path}: {name} needs a contiguous last dim (stride 1), got strides "
                f"{t.stride()}; pass {name}.contiguous()"
            )
    check_devices(path, q, kv=kv, indices=indices)


def check_devices(path: str, q: torch.Tensor, **others: torch.Tensor) -> None:
    """All tensors on q's device, and that device of the platform's kind (cpu only if no GPU)."""
    want = current_platform().device.type
    if q.device.type not in (want, "meta"):
        raise ValueError(f"{path}: tensors must be on {want!r} on this platform, q is on {q.device}")
    for name, t in others.items():
        if t.device != q.device:
            raise ValueError(f"{path}: {name} is on {t.device} but q is on {q.device}; move it")


def check_workspace(path: str, q: torch.Tensor, ws_out: torch.Tensor, ws_lse: torch.Tensor) -> None:
    """``ws_out [>=rows, S, >=H, 512]`` f32, ``ws_lse [>=rows, S, >=H]`` f32, S >= 0.

    S = 0 (a pool too small for ``rows`` rows to split) is valid: the launch runs one split,
    which writes ``out`` directly and never touches the workspace.
    """
    rows, heads = q.shape[0], q.shape[1]
    fix = "size GraphMetadata with graphattn.kernels.split_plan(...) and pass workspace_for(rows)"
    if ws_out.dtype != torch.float32 or ws_lse.dtype != torch.float32:
        raise TypeError(f"{path}: workspace must be float32, got {ws_out.dtype}/{ws_lse.dtype}")
    if ws_out.dim() != 4 or ws_out.shape[3] != D_V or ws_lse.dim() != 3:
        raise ValueError(
            f"{path}: expected ws_out [rows, splits, heads, {D_V}] and ws_lse [rows, splits, heads], "
            f"got {_shape(ws_out)} and {_shape(ws_lse)}; {fix}"
        )
    if _shape(ws_out)[:3] != _shape(ws_lse):
        raise ValueError(f"{path}: ws_out {_shape(ws_out)} and ws_lse {_shape(ws_lse)} disagree; {fix}")
    if ws_out.shape[0] < rows or ws_out.shape[2] < heads:
        raise ValueError(
            f"{path}: workspace too small: holds {ws_out.shape[0]} rows x {ws_out.shape[2]} heads, "
            f"need >= {rows} rows x {heads} heads; {fix}"
        )
    if ws_out.stride(-1) != 1 or ws_lse.stride(-1) != 1:
        raise ValueError(f"{path}: workspace needs a contiguous last dim (stride 1); {fix}")
    if not (_dense_blocks(ws_out, (D_V,)) and _dense_blocks(ws_lse, ())):
        # The partials of a (row, split) are one block of heads x 512 (the sm_90 kernels store a
        # head block's partials as one run from its first head): expanded or permuted
        # workspaces would make programs overrun or overwrite each other's.
        raise ValueError(
            f"{path}: workspace strides {ws_out.stride()} / {ws_lse.stride()} for shapes "
            f"{_shape(ws_out)} / {_shape(ws_lse)}: each (row, split) needs its own dense "
            f"[heads, {D_V}] / [heads] block; {fix}"
        )
    check_devices(path, q, ws_out=ws_out, ws_lse=ws_lse)


def _dense_blocks(t: torch.Tensor, inner: tuple[int, ...]) -> bool:
    """``t [rows, splits, heads, *inner]`` (last dim stride 1): heads dense over ``inner``, and
    no two (row, split) blocks overlapping (rows and splits may be slices of larger ones)."""
    if t.numel() == 0:  # no splits: the launch writes out directly
        return True
    rows, splits, heads = t.shape[:3]
    block = heads * math.prod(inner)
    if heads > 1 and t.stride(2) != math.prod(inner):
        return False
    if splits > 1 and t.stride(1) < block:
        return False
    return rows <= 1 or t.stride(0) >= (splits * t.stride(1) if splits > 1 else block)


def check_counter(path: str, q: torch.Tensor, counter: torch.Tensor, head_blocks: int) -> None:
    """``counter [>=rows, >=head_blocks]`` int32 with a contiguous last dim, all zeros."""
    fix = "use GraphMetadata(counter_cols=split_plan('trtllm', heads, topk).counter_cols).counter_for(rows)"
    if counter.dtype != torch.int32:
        raise TypeError(f"{path}: counter must be int32, got {counter.dtype}; {fix}")
    if counter.dim() != 2 or counter.shape[0] < q.shape[0] or counter.shape[1] < head_blocks:
        raise ValueError(
            f"{path}: counter must be [>= {q.shape[0]} rows, >= {head_blocks} head blocks], got "
            f"{_shape(counter)}; {fix}"
        )
    if counter.stride(-1) != 1:
        raise ValueError(f"{path}: counter needs a contiguous last dim (stride 1); {fix}")
    check_devices(path, q, counter=counter)


def check_counter_zero(path: str, counter: torch.Tensor, rows: int, head_blocks: int) -> None:
    """Raise ``ValueError`` unless the ``[rows, head_blocks]`` counters a launch uses are all
    zero (a debug check: it synchronises, so the op runs it only under
    ``GRAPHATTN_CHECK_INDICES=1`` and outside captures). A non-zero counter makes the last-arriving
    split combine too early, and the launch leaves it non-zero for every later call."""
    used = counter[:rows, :head_blocks]
    if bool(used.any()):
        bad = used.nonzero()[0].tolist()
        raise ValueError(
            f"{path}: counter[{bad[0]}, {bad[1]}] is {int(used[bad[0], bad[1]])}, expected all zeros on "
            "entry (a launch leaves them zero; one that was interrupted, or a buffer shared with "
            "other code, does not). Fix: counter.zero_(), and give each launch its own "
            "GraphMetadata.counter_for(rows)"
        )

