"""One conformance case's context and the checks every mode shares (output against the float64
reference, the multi-CTA counter back at zero, inputs left bit for bit as they were, out= pairs
written and returned, outputs not changed by a later call), and the layout of a ``strided``
spec's q and kv. ``checks`` (eager mode and the entry point) and ``graph_checks`` (graph modes)
both build on it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ..backends.base import AttentionBackend
from ..common.kv_layout import KV_AUTO, TOKEN_BYTES, quantize_kv
from ..common.metadata import D_QK, D_V, GraphMetadata
from ..common.platform import Platform
from ..common.reference import sparse_mla_reference
from ..common.tolerances import tolerance
from .specs import Q_STD, BatchSpec, SuiteShape, make_indices, selectable_tokens

SENTINEL = 0xA5  # byte value victims are filled with
OUT_FILL = 0xFF  # byte value of the out= pairs the suite passes: all ones, a NaN in every float dtype
# A ``strided`` spec's views: q is heads 1..H of [rows, H + Q_EXTRA_HEADS, row], kv the first
# columns of [pool, row] (rows padded by ROW_PAD elements past the data; 16-byte aligned).
Q_EXTRA_HEADS = 2
ROW_PAD = 64


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

    @property
    def strided(self) -> bool:
        """The spec's q and kv are non-contiguous views (``layout="strided"``)."""
        return self.spec.layout == "strided"

    def _feature_stride(self, fp8: bool = False) -> int:
        """Stride of a strided view's last dim: 1 where the backend declares
        ``unit_stride_only`` (and for FP8 tokens, always), else 2."""
        return 1 if fp8 or getattr(self.backend, "unit_stride_only", True) else 2

    def q_storage(self, rows: int) -> torch.Tensor:
        """A ``strided`` spec's q storage ``[rows, heads + 2, row]``, NaN everywhere."""
        row = D_QK * self._feature_stride() + ROW_PAD
        return torch.full((rows, self.spec.num_heads + Q_EXTRA_HEADS, row), float("nan"),
                          dtype=self.backend.dtype, device=self.platform.device)

    def q_view(self, storage: torch.Tensor) -> torch.Tensor:
        """``[rows, heads, 576]`` view of a :meth:`q_storage`: heads ``1..heads``, every
        feature (stride 1) or every other one (stride 2)."""
        s = self._feature_stride()
        return storage[:, 1:1 + self.spec.num_heads, 0:D_QK * s:s]

    def widen_q(self, q: torch.Tensor) -> torch.Tensor:
        """A :meth:`q_storage` holding ``q`` in its :meth:`q_view` (NaN around it)."""
        storage = self.q_storage(q.shape[0])
        self.q_view(storage).copy_(q)
        return storage

    def layout_q(self, q: torch.Tensor) -> torch.Tensor:
        """``q`` as the spec's layout passes it to ``forward``: itself, or a strided view."""
        return self.q_view(self.widen_q(q)) if self.strided else q

    def _strided_kv(self, kv: torch.Tensor) -> torch.Tensor:
        """``kv`` copied into the first columns of a cache with padded rows (padding: NaN, or
        0xFF bytes for FP8 tokens); returns the view."""
        fp8 = kv.dtype == torch.uint8
        s = self._feature_stride(fp8)
        width = kv.shape[1]
        storage = torch.empty(kv.shape[0], width * s + ROW_PAD, dtype=kv.dtype, device=kv.device)
        if fp8:
            storage.fill_(0xFF)
        else:
            storage.fill_(float("nan"))
        view = storage[:, 0:width * s:s]
        view.copy_(kv)
        return view

    def layout_note(self) -> str:
        """What a ``strided`` spec passes (for failure messages); ``""`` for ``contiguous``."""
        if not self.strided:
            return ""
        s = self._feature_stride()
        q_row = D_QK * s + ROW_PAD
        fp8 = self.kv_dtype != KV_AUTO
        width = TOKEN_BYTES if fp8 else D_QK
        kv_s = self._feature_stride(fp8)
        return (f"layout 'strided': q is heads 1..{self.spec.num_heads} of [rows, "
                f"{self.spec.num_heads + Q_EXTRA_HEADS}, {q_row}] (strides "
                f"({(self.spec.num_heads + Q_EXTRA_HEADS) * q_row}, {q_row}, {s})), kv the first "
                f"columns of [pool, {width * kv_s + ROW_PAD}] (strides ({width * kv_s + ROW_PAD}, "
                f"{kv_s})), NaN around both: a kernel that assumes dense q or kv reads the wrong "
                f"elements")

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
        NaN scales). A ``strided`` spec's pool is a view of a cache with padded rows."""
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
        return self._strided_kv(kv) if self.strided else kv

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


def assert_matches_reference(ctx: CaseContext, step: int, q, kv, indices, out, lse, call: str = "",
                             note: str = "") -> None:
    """Compare ``out``/``lse`` with the float64 reference at the dtype's tolerance (FP8 kv:
    against the reference of the cache dequantised into q's dtype, at the same tolerance).
    ``call`` names the call in the message (e.g. the step's second call); ``note`` is appended
    to it (what the mode's wiring implies), and a strided spec's layout."""
    rows, heads = q.shape[0], q.shape[1]
    where = f"{ctx.label} step {step} ({rows} rows{', ' + call if call else ''})"
    tail = "".join(f"\n{n}" for n in (note, ctx.layout_note()) if n)
    expected_out = (rows, heads, D_V)
    assert tuple(out.shape) == expected_out and out.dtype == q.dtype, (
        f"{where}: expected out {expected_out} {q.dtype}, got {tuple(out.shape)} {out.dtype}{tail}"
    )
    assert tuple(lse.shape) == (rows, heads) and lse.dtype == torch.float32, (
        f"{where}: expected lse {(rows, heads)} float32, got {tuple(lse.shape)} {lse.dtype}{tail}"
    )
    # The reference reads its own dense copies (a strided spec's views are the backend's test).
    ref_out, ref_lse = sparse_mla_reference(q.contiguous(), kv.contiguous(), indices, ctx.backend.sm_scale,
                                            fp8_dtype=ctx.platform.fp8_dtype)
    tol = tolerance(q.dtype, ctx.kv_dtype)
    checks = (("out", out, ref_out, tol.atol, tol.rtol), ("lse", lse, ref_lse, tol.lse_atol, tol.lse_rtol))
    for name, got, ref, atol, rtol in checks:
        # equal_nan: NaN must appear exactly where the reference has it (NaN in q), nowhere else.
        torch.testing.assert_close(
            got.double(), ref, atol=atol, rtol=rtol, equal_nan=True,
            msg=lambda m, name=name, atol=atol, rtol=rtol: f"{where}: {name} differs from the "
            f"float64 reference (dtype {tol.dtype}, atol {atol}, rtol {rtol}):\n{m}{tail}",
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


# -- inputs left alone --------------------------------------------------------------------------
# Integer dtypes of each element size: a float tensor viewed as one compares bit for bit.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NAN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` (same shape and dtype) for :func:`_changed_rows`."""
    return t.detach().clone(memory_format=torch.contiguous_format)


def _changed_rows(now: torch.Tensor, saved: torch.Tensor) -> list[int]:
    """Indices along dim 0 where ``now`` differs from its :func:`_snapshot` ``saved`` bit for
    bit, except that any NaN equals any NaN: torch's CUDA copies (the graph runner's
    ``_foreach_copy_`` of a step's q into its static input) turn bf16 NaN 0x7FC0 into 0x7FFF,
    a payload no attention result depends on."""
    now = now.detach().contiguous()
    bits = _BITS[now.element_size()]
    differ = now.view(bits) != saved.view(bits)
    if now.dtype in _NAN_DTYPES:
        differ &= ~(now.isnan() & saved.isnan())
    return differ.reshape(now.shape[0], -1).any(dim=1).nonzero().flatten().tolist()


class Untouched:
    """A bitwise snapshot of an input a call must leave alone: the tensor and, for a view, the
    whole tensor it views (a strided spec's padding and hidden heads belong to the engine too).

    Args:
        what: the input's name in messages (``kv``, ``q``).
        unit: what its dim 0 counts (``token``, ``row``).
    """

    def __init__(self, what: str, unit: str, tensor: torch.Tensor):
        self.what, self.unit, self.tensor = what, unit, tensor
        base = tensor._base
        self.base = base if base is not None and base.dim() >= 1 else None
        self.saved = _snapshot(tensor)
        self.saved_base = _snapshot(self.base) if self.base is not None else None

    def _fail(self, where: str, changed: list[int], by: str, around: bool = False) -> None:
        if around:
            raise AssertionError(
                f"{where}: memory around the {self.what} view modified at {self.unit} {changed[0]} "
                f"({len(changed)} {self.unit}s) by {by}: it wrote outside {self.what}'s elements "
                f"(the row padding or heads the view skips, which the engine owns); {self.what} "
                f"strides {tuple(self.tensor.stride())}"
            )
        raise AssertionError(
            f"{where}: {self.what} modified at {self.unit} {changed[0]} ({len(changed)} of "
            f"{self.saved.shape[0]} {self.unit}s changed) by {by}: forward must leave its inputs "
            f"bit for bit as they were (the engine reads its {self.what} again)"
        )

    def check(self, ctx: CaseContext, step: int | str, by: str) -> None:
        """Raise ``AssertionError`` naming the first changed token/row unless the bits are as
        snapshotted (``step``: a step number or a phase such as ``"capture"``; ``by``: what
        ran, e.g. ``forward``)."""
        where = f"{ctx.label} step {step}" if isinstance(step, int) else f"{ctx.label} {step}"
        changed = _changed_rows(self.tensor, self.saved)
        if changed:
            self._fail(where, changed, by)
        if self.base is not None:
            changed = _changed_rows(self.base, self.saved_base)
            if changed:
                self._fail(where, changed, by, around=True)

    def check_copy(self, ctx: CaseContext, step: int, by: str, seen: torch.Tensor) -> None:
        """Like :meth:`check`, for ``seen``: the copy of the snapshotted tensor that a graph step
        handed to the backend (a strided spec's whole q storage, padding included), as the
        step left it."""
        changed = _changed_rows(seen, self.saved)
        if changed:
            self._fail(f"{ctx.label} step {step}", changed, f"{by} (in the step's copy of it)")


# -- outputs: out= and a later call -------------------------------------------------------------
def filled_out_pair(rows: int, num_heads: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """An ``(out [rows, heads, 512], lse [rows, heads] float32)`` pair whose every byte is
    :data:`OUT_FILL` (NaN bits no computation produces), to pass as ``forward(out=...)``."""
    out = torch.empty(rows, num_heads, D_V, dtype=dtype, device=device)
    lse = torch.empty(rows, num_heads, dtype=torch.float32, device=device)
    for t in (out, lse):
        t.view(torch.uint8).fill_(OUT_FILL)
    return out, lse


def check_out_written(ctx: CaseContext, step: int, given, returned) -> None:
    """``forward(out=given)`` must write ``given`` and return the very objects: a breakable
    graph's later segments read ``given``, never what the call returned."""
    where = f"{ctx.label} step {step}"
    same = (isinstance(returned, (tuple, list)) and len(returned) == 2
            and returned[0] is given[0] and returned[1] is given[1])
    assert same, (
        f"{where}: forward(out=(out, lse)) returned other tensors than the out= pair it was given "
        f"(expected the very objects passed, as AttentionBackend.forward documents: a breakable "
        f"graph's replay passes out= and later segments read it, not the return value)"
    )
    for name, t in zip(("out", "lse"), given):
        elsize = t.element_size()
        unwritten = (t.view(torch.uint8).reshape(-1, elsize) == OUT_FILL).all(dim=1)
        n = int(unwritten.sum())
        assert n == 0, (
            f"{where}: out= not written: {n} of {t.numel()} elements of the given {name} still hold "
            f"the 0x{OUT_FILL:02X} bytes the suite filled it with (the first at flat index "
            f"{int(unwritten.nonzero()[0])}); forward(out=...) must write every element"
        )


class ResultGuard:
    """A bitwise copy of a call's ``(out, lse)``, to check that a later call did not change it
    (a backend that returns views of a buffer it reuses hands every caller the last result)."""

    def __init__(self, out: torch.Tensor, lse: torch.Tensor):
        self.pair = (out, lse)
        self.saved = [_snapshot(t) for t in self.pair]

    def check(self, ctx: CaseContext, step: int, later: str) -> None:
        """``step``: the step that returned the pair; ``later``: the call that ran since."""
        for name, t, saved in zip(("out", "lse"), self.pair, self.saved):
            changed = _changed_rows(t, saved)
            assert not changed, (
                f"{ctx.label} step {step}: the {name} that step's forward returned changed when "
                f"{later} ran (rows {changed[:8]}): forward returned memory it reuses across calls, "
                f"so a model's layer 0 output is overwritten by layer 1; each call's outputs must be "
                f"its own (forward allocates nothing that outlives the call, and keeps nothing it "
                f"returned)"
            )
