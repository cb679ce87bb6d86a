"""The conformance checks: one backend, one batch spec, one mode, against the float64 reference.

``check_case(backend, spec, mode)`` is the whole harness; the pytest plugin parametrizes it and
any test can call it directly. Modes:

* ``eager``: ``plan`` then ``forward`` per step; where ``forward`` takes ``out``, odd steps pass
  an out= pair of 0xFF bytes (NaN), which must be written and returned as the very objects.
  Each step's outputs must be unchanged by the next step's call (they are the call's own, not
  views of a buffer the backend reuses).
* ``full``: the step is captured as one graph per bucket by :class:`GraphRunner` (largest first,
  one pool, one metadata); the attention call is captured inline.
* ``breakable``: the same step, but the attention call is an ``eager_on_graph`` break between
  captured segments, wired as README and ``graphattn bench`` wire it:
  ``eager_on_graph(forward, out="out", bind=backend.bind_break)`` (plain ``eager_on_graph(forward)``
  for a ``forward`` without ``out``), so replays write into the captured outputs. In a spec
  with ``second_call`` (``decode``) each step calls attention a second time (``-q[:1]``, one
  row: the next layer) except oversized steps: two breaks, and the first break's outputs must
  survive the second.

In every mode q and kv must be left bit for bit as they were, any NaN counting as any other (and
the memory around a strided view), a ``strided`` spec passes q and kv as non-contiguous views, and a spec with ``reserve``
below its largest step runs oversized steps (eagerly, on temporaries) with replays after them.

In graph modes every step also flushes the allocator cache, allocates *victim* tensors filled
with a sentinel (sized like every tensor the backend and metadata held at capture, so a block
freed by a rebinding backend is handed to a victim, as in the H200 reproduction), replays with the
sanitizer on, then checks the output, the victims, the counter (all zeros between launches) and
that no captured buffer moved. Every failure message starts with the backend name.
"""

from __future__ import annotations

import zlib

import torch

from ..backends.base import AttentionBackend, GraphSupport, accepts_out, kv_kwargs
from ..common.kv_layout import KV_AUTO
from ..common.platform import Platform, current_platform
from .case import (CaseContext, ResultGuard, Untouched, assert_matches_reference, check_counter_clean,
                   check_out_written, filled_out_pair)
from .graph_checks import run_graph_case
from .specs import MODES, BatchSpec, SuiteShape

# Re-exported: these lived here before graph_checks and checks shared them through .case.
__all__ = ["CaseContext", "assert_matches_reference", "check_case", "check_counter_clean", "pick_dtype",
           "skip_reason"]


def pick_dtype(cls: type[AttentionBackend], platform: Platform, requested: torch.dtype | None) -> torch.dtype:
    """The requested dtype, else bf16 on a GPU / fp16 in the interpreter, else the first supported."""
    if requested is not None:
        return requested
    preferred = torch.float16 if platform.uses_triton_interpreter else torch.bfloat16
    return preferred if preferred in cls.supported_dtypes else cls.supported_dtypes[0]


def skip_reason(cls: type[AttentionBackend], spec: BatchSpec, mode: str, dtype: torch.dtype,
                platform: Platform | None = None, kv_dtype: str = KV_AUTO) -> str | None:
    """Why this case cannot run here (``None``: it can). Used for pytest skip markers."""
    platform = platform or current_platform()
    reasons = cls.refusal_reasons(spec.num_heads, dtype, spec.topk, platform, **kv_kwargs(kv_dtype))
    if reasons:
        return f"backend '{cls.name}' refuses this configuration: " + "; ".join(reasons)
    if mode == "full" and cls.graph_support < GraphSupport.FULL:
        return f"backend '{cls.name}' declares graph_support={cls.graph_support.name} (no full graph)"
    if mode == "breakable" and cls.graph_support < GraphSupport.BREAK_ONLY:
        return f"backend '{cls.name}' declares graph_support={cls.graph_support.name} (eager only)"
    return None


def check_case(
    cls: type[AttentionBackend],
    spec: BatchSpec,
    mode: str,
    shape: SuiteShape,
    dtype: torch.dtype | None = None,
    platform: Platform | None = None,
    sanitize: bool = True,
    kv_dtype: str = KV_AUTO,
) -> None:
    """Run one conformance case; raises ``AssertionError`` (or a ``GraphSafetyError``) on failure.

    Args:
        cls: the backend class.
        spec: the batch spec; ``shape``: the shape set it belongs to (pool size, buckets).
        mode: ``eager``, ``full`` or ``breakable``.
        dtype: q/kv dtype (default: :func:`pick_dtype`).
        sanitize: replay through the capture sanitizer (graph modes).
        kv_dtype: the KV layout: ``"auto"`` (kv in q's dtype) or ``"fp8"`` (656-byte FP8 tokens,
            checked against the reference of the cache dequantised into q's dtype).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    platform = platform or current_platform()
    dtype = pick_dtype(cls, platform, dtype)
    seed = zlib.crc32(f"{spec.name}/{mode}/{shape.name}".encode())
    ctx = CaseContext(
        backend=cls(spec.num_heads, spec.topk, dtype, platform=platform, **kv_kwargs(kv_dtype)),
        spec=spec, shape=shape, mode=mode, platform=platform,
        generator=torch.Generator().manual_seed(seed), kv_dtype=kv_dtype,
    )
    try:
        if mode == "eager":
            _run_eager(ctx)
        else:
            run_graph_case(ctx, sanitize=sanitize)
    except Exception as exc:
        if hasattr(exc, "add_note") and not isinstance(exc, AssertionError):
            exc.add_note(f"conformance case: {ctx.label}")
        raise


def _run_eager(ctx: CaseContext) -> None:
    """Per step: plan, forward (through a NaN-filled ``out=`` pair on odd steps where forward
    takes ``out``), q and kv unchanged, the previous step's outputs unchanged, the output right."""
    backend, spec = ctx.backend, ctx.spec
    metadata = backend.make_metadata(spec.reserved_rows)
    kv = ctx.kv_cache()  # [pool, 576] or [pool, 656] uint8 FP8 tokens (a view if strided)
    kv_guard = Untouched("kv", "token", kv)
    takes_out = accepts_out(backend.forward)
    previous: ResultGuard | None = None  # the last step's outputs, as it returned them
    for step, rows in enumerate(spec.steps):
        q = ctx.layout_q(ctx.query(rows))  # a strided view for layout="strided"
        indices = ctx.indices(rows)
        ctx.plan(metadata, indices)
        q_guard = Untouched("q", "row", q)
        if takes_out and step % 2:
            given = filled_out_pair(rows, spec.num_heads, q.dtype, q.device)
            out, lse = returned = backend.forward(q, kv, metadata, out=given)
            by, call = "forward(out=...)", "out="
        else:
            out, lse = returned = backend.forward(q, kv, metadata)
            by, call = "forward", ""
        kv_guard.check(ctx, step, by)
        q_guard.check(ctx, step, by)
        if previous is not None:
            previous.check(ctx, step - 1, f"step {step}'s {by}")
        if call:
            check_out_written(ctx, step, given, returned)
        assert_matches_reference(ctx, step, q, kv, indices, out, lse, call=call)
        check_counter_clean(ctx, metadata, step)
        previous = ResultGuard(out, lse)
