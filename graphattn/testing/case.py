"""One conformance case's context and the checks every mode shares (output against the float64
reference, the multi-CTA counter back at zero). ``checks`` (eager mode and the entry point) and
``graph_checks`` (graph modes) both build on it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ..backends.base import AttentionBackend
from ..common.kv_layout import KV_AUTO, quantize_kv
from ..common.metadata import D_QK, D_V, GraphMetadata
from ..common.platform import Platform
from ..common.reference import sparse_mla_reference
from ..common.tolerances import tolerance
from .specs import Q_STD, BatchSpec, SuiteShape, make_indices, selectable_tokens

SENTINEL = 0xA5  # byte value victims are filled with


@dataclass
class CaseContext:
    """Everything one case needs: the backend instance, spec, shapes, data generator, and
    the KV layout (``kv_dtype``: ``"auto"`` or ``"fp8"``, 656-byte FP8 tokens)."""

    backend: AttentionBackend
    spec: BatchSpec
    shape: SuiteShape
    mode: str
    platform: Platform
    generator: torch.Generator
    kv_dtype: str = KV_AUTO

    @property
    def label(self) -> str:
        """``backend 'NAME' [spec/mode]``: the prefix of every failure message."""
        kv = "" if self.kv_dtype == KV_AUTO else f", kv {self.kv_dtype}"
        return f"backend '{self.backend.name}' [{self.spec.name}/{self.mode}, {self.backend.dtype}{kv}]"

    def randn(self, *shape: int, std: float = 1.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.generator, dtype=torch.float32) * std
        return t.to(self.backend.dtype).to(self.platform.device)

    def query(self, rows: int) -> torch.Tensor:
        """``q [rows, num_heads, 576]`` at the suite's logit scale (:data:`specs.Q_STD`); with
        ``poison="q"``, NaN in every head of row 0 and in one head of the last row."""
        q = self.randn(rows, self.spec.num_heads, D_QK, std=Q_STD)
        if self.spec.poison == "q":
            q[0, :, 3] = float("nan")  # ragged: row 0 attends nothing (out 0, lse -inf)
            q[-1, self.spec.num_heads // 2, 100] = float("nan")  # one head: out and lse NaN
        return q

    def kv_cache(self) -> torch.Tensor:
        """The KV pool in the case's layout: ``[pool_tokens, 576]`` in the backend's dtype, or
        ``[pool_tokens, 656]`` uint8 FP8 tokens (random values quantised in the platform's format).
        With ``poison="kv"`` the tokens no index selects hold NaN and inf (FP8: all bytes 0xFF,
        NaN scales)."""
        pool = self.shape.pool_tokens
        if self.kv_dtype == KV_AUTO:
            kv = self.randn(pool, D_QK)
        else:
            kv = torch.randn(pool, D_QK, generator=self.generator, dtype=torch.float32)
            kv = quantize_kv(kv, self.platform.fp8_dtype).to(self.platform.device)
        if self.spec.poison == "kv":
            unselected = torch.cat([torch.zeros(1, dtype=torch.long),
                                    torch.arange(1 + selectable_tokens(pool), pool)])
            if kv.dtype == torch.uint8:
                kv[unselected.to(kv.device)] = 0xFF
            else:
                kv[unselected[0::2].to(kv.device)] = float("nan")
                kv[unselected[1::2].to(kv.device)] = float("inf")
        return kv

    def plan(self, metadata: GraphMetadata, indices: torch.Tensor, pad_to: int | None = None) -> None:
        """``backend.plan`` with index validation on (``check_indices``, against the pool) where
        the backend's ``plan`` takes it (one written before it need not)."""
        plan = self.backend.plan
        if accepts_kwargs(plan, "check_indices", "pool_tokens"):
            plan(metadata, indices, pad_to=pad_to, check_indices=True, pool_tokens=self.shape.pool_tokens)
        else:
            plan(metadata, indices, pad_to=pad_to)

    def indices(self, rows: int) -> torch.Tensor:
        return make_indices(self.spec, rows, self.shape.pool_tokens, self.generator, self.platform.device)


def assert_matches_reference(ctx: CaseContext, step: int, q, kv, indices, out, lse) -> None:
    """Compare ``out``/``lse`` with the float64 reference at the dtype's tolerance (FP8 kv:
    against the reference of the cache dequantised into q's dtype, at the same tolerance)."""
    rows, heads = q.shape[0], q.shape[1]
    where = f"{ctx.label} step {step} ({rows} rows)"
    expected_out = (rows, heads, D_V)
    assert tuple(out.shape) == expected_out and out.dtype == q.dtype, (
        f"{where}: expected out {expected_out} {q.dtype}, got {tuple(out.shape)} {out.dtype}"
    )
    assert tuple(lse.shape) == (rows, heads) and lse.dtype == torch.float32, (
        f"{where}: expected lse {(rows, heads)} float32, got {tuple(lse.shape)} {lse.dtype}"
    )
    ref_out, ref_lse = sparse_mla_reference(q, kv, indices, ctx.backend.sm_scale,
                                            fp8_dtype=ctx.platform.fp8_dtype)
    tol = tolerance(q.dtype, ctx.kv_dtype)
    checks = (("out", out, ref_out, tol.atol, tol.rtol), ("lse", lse, ref_lse, tol.lse_atol, tol.lse_rtol))
    for name, got, ref, atol, rtol in checks:
        # equal_nan: NaN must appear exactly where the reference has it (NaN in q), nowhere else.
        torch.testing.assert_close(
            got.double(), ref, atol=atol, rtol=rtol, equal_nan=True,
            msg=lambda m, name=name, atol=atol, rtol=rtol: f"{where}: {name} differs from the "
            f"float64 reference (dtype {tol.dtype}, atol {atol}, rtol {rtol}):\n{m}",
        )


def accepts_kwargs(fn: Any, *names: str) -> bool:
    """Whether ``fn`` takes every keyword in ``names`` (or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(n in params for n in names)


def check_counter_clean(ctx: CaseContext, metadata: GraphMetadata, step: int) -> None:
    """The multi-CTA counter must be all zeros between launches (the kernel resets it)."""
    if metadata.counter is None:
        return
    nonzero = int((metadata.counter.tensor != 0).sum())
    assert nonzero == 0, (
        f"{ctx.label} step {step}: {nonzero} multi-CTA counters are not 0 after the launch; the "
        f"kernel must reset every counter it increments, or the next replay miscounts arrivals"
    )
