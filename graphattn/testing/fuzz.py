"""Random-shape fuzzing of every backend against the float64 reference.

A :class:`FuzzCase` is one call: a backend, ``rows x heads x topk`` over a pool of ``pool``
tokens, how q and kv are laid out in memory (contiguous, a strided view, an odd base offset) and
how the indices mix valid tokens, −1, out-of-range values, duplicates and all-invalid rows.
:func:`draw_case` draws them the way the H200 sweep of issue 10 did (heads 1-128 including odd
counts, top-k 1-4096 including non-multiples of every tile, pools of 1-70,000 tokens);
:data:`REGRESSION_CASES` are the shapes that sweep found broken. :func:`run_case` runs one case
in this process and returns a :class:`CaseResult`; ``graphattn.testing.fuzz_runner`` runs many,
each in a worker process that is replaced after a crash, so one illegal access never hides the
cases after it.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch

from ..backends.base import kv_kwargs
from ..backends.registry import get_backend_class
from ..common.kv_layout import KV_AUTO, KV_FP8, TOKEN_BYTES, quantize_kv
from ..common.metadata import D_QK
from ..common.platform import current_platform
from ..common.reference import sparse_mla_reference
from ..common.tolerances import tolerance
from .specs import Q_STD

Q_LAYOUTS = ("contiguous", "head_slice", "offset")
KV_LAYOUTS = ("contiguous", "row_stride", "offset")
# Index values outside [0, pool) besides -1: each must be skipped, never read.
_FAR = (2**31 - 1, -(2**31), -2)
STATUSES = ("ok", "wrong", "refused", "error", "crash")


@dataclass(frozen=True)
class FuzzCase:
    """One fuzz call.

    Attributes:
        backend: registered backend name (or ``module:Class``).
        rows, heads, topk, pool: ``q [rows, heads, 576]``, ``kv [pool, 576]``, ``indices [rows, topk]``.
        dtype: ``"bfloat16"`` or ``"float16"`` (q and kv).
        q_layout: ``contiguous``; ``head_slice`` (heads 1.. of a wider tensor whose rows are 600
            wide: head stride 600); ``offset`` (a flat buffer starting ``offset`` elements in).
        kv_layout: ``contiguous``; ``row_stride`` (the first 576 columns of ``[pool, stride]``);
            ``offset`` (a flat buffer starting ``offset`` elements in).
        stride: kv row stride for ``row_stride`` (>= 577).
        offset: element offset for the ``offset`` layouts (odd values misalign 16-byte copies).
        invalid: fraction of indices set to −1.
        out_of_range: fraction set to values outside ``[0, pool)`` (pool, pool + 5, ±2**31, -2).
        duplicates: copy some indices of each row onto other positions of the same row.
        empty_rows: rows whose every index is invalid (out 0, lse −inf).
        seed: data seed.
        kv_dtype: ``"auto"`` (kv in q's dtype) or ``"fp8"`` (656-byte FP8 tokens, uint8 rows;
            the layouts in bytes: ``row_stride`` rows of ``656 + 4 * (stride - 576)`` bytes,
            ``offset`` a start ``4 * offset`` bytes in, both 4- but not always 16-byte aligned).
    """

    backend: str
    rows: int
    heads: int
    topk: int
    pool: int
    dtype: str = "bfloat16"
    q_layout: str = "contiguous"
    kv_layout: str = "contiguous"
    stride: int = 600
    offset: int = 8
    invalid: float = 0.1
    out_of_range: float = 0.05
    duplicates: bool = True
    empty_rows: int = 0
    seed: int = 0
    kv_dtype: str = KV_AUTO

    @property
    def label(self) -> str:
        """A one-line description for reports and failure messages."""
        lay = f"q {self.q_layout}, kv {self.kv_layout}" + (" fp8" if self.kv_dtype == KV_FP8 else "")
        if self.kv_layout == "row_stride":
            lay += f" {self.stride}"
        if "offset" in (self.q_layout, self.kv_layout):
            lay += f", offset {self.offset}"
        return (f"backend '{self.backend}' [{self.rows} rows x {self.heads} heads x topk {self.topk}, "
                f"pool {self.pool}, {self.dtype}, {lay}, invalid {self.invalid:.2f}, "
                f"out-of-range {self.out_of_range:.2f}, dup {int(self.duplicates)}, "
                f"empty rows {self.empty_rows}, seed {self.seed}]")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "FuzzCase":
        return cls(**d)


@dataclass
class CaseResult:
    """What one case gave.

    status: ``ok``; ``wrong`` (outside tolerance, NaN, or shape/dtype off); ``refused`` (a clear
    ``ValueError``/``TypeError`` before any launch); ``error`` (any other exception, the process
    still usable); ``crash`` (the process died or the device context was lost).
    """

    case: FuzzCase
    status: str
    message: str = ""
    out_err: float = float("nan")
    lse_err: float = float("nan")
    kernel: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["case"] = self.case.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CaseResult":
        return cls(**{**d, "case": FuzzCase.from_json(d["case"])})


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))) if hi > lo else lo


def _edge_or(rng: random.Random, edges: tuple[int, ...], lo: int, hi: int, p_edge: float = 0.35) -> int:
    value = rng.choice(edges) if rng.random() < p_edge else _log_uniform(rng, lo, hi)
    return max(lo, min(hi, value))


@dataclass(frozen=True)
class FuzzLimits:
    """The ranges :func:`draw_case` draws from (``GPU`` and the interpreter's ``CPU``)."""

    max_heads: int
    max_topk: int
    max_rows: int
    max_pool: int
    # rows x heads x topk bound, so one case's float64 reference stays quick
    max_work: int
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    # KV layouts drawn; with one, no random draw is spent on it (seeds keep their cases)
    kv_dtypes: tuple[str, ...] = (KV_AUTO,)


GPU = FuzzLimits(max_heads=128, max_topk=4096, max_rows=300, max_pool=70_000, max_work=300 * 128 * 2048)
CPU = FuzzLimits(max_heads=20, max_topk=70, max_rows=3, max_pool=300, max_work=2 * 20 * 70,
                 dtypes=("float16", "bfloat16"))


def draw_case(rng: random.Random, backend: str, limits: FuzzLimits = GPU) -> FuzzCase:
    """A random case for ``backend`` within ``limits``; edge values (1, tile sizes ± 1, 64/128
    heads, a pool of 1 token) come up often on purpose."""
    heads = _edge_or(rng, (1, 3, 16, 17, 32, 48, 63, 64, 65, 100, 127, 128), 1, limits.max_heads)
    topk = _edge_or(rng, (1, 5, 15, 16, 17, 63, 64, 65, 1000, 2048, 4095), 1, limits.max_topk)
    rows = _edge_or(rng, (1, 2, 3, 8, 64, 257), 1, limits.max_rows)
    while rows > 1 and rows * heads * topk > limits.max_work:
        rows = max(1, rows // 2)
    if rows * heads * topk > limits.max_work:
        topk = max(1, limits.max_work // (rows * heads))
    pool = _edge_or(rng, (1, 2, 5, 64, 5000, limits.max_pool), 1, limits.max_pool, p_edge=0.4)
    q_layout = rng.choice(Q_LAYOUTS)
    kv_layout = rng.choice(KV_LAYOUTS)
    return FuzzCase(
        backend=backend, rows=rows, heads=heads, topk=topk, pool=pool,
        dtype=rng.choice(limits.dtypes), q_layout=q_layout, kv_layout=kv_layout,
        stride=rng.choice((577, 584, 592, 600, 640)), offset=rng.choice((1, 3, 8, 64)),
        invalid=rng.choice((0.0, 0.1, 0.5, 0.95)), out_of_range=rng.choice((0.0, 0.05, 0.3)),
        duplicates=rng.random() < 0.5, empty_rows=rng.choice((0, 0, 1, rows)) if rows > 1 else rng.choice((0, 0, 1)),
        seed=rng.randrange(2**31),
        kv_dtype=rng.choice(limits.kv_dtypes) if len(limits.kv_dtypes) > 1 else limits.kv_dtypes[0],
    )


def draw_cases(backends: list[str], count: int, seed: int, limits: FuzzLimits = GPU) -> list[FuzzCase]:
    """``count`` cases per backend, interleaved (so a stopped run still covers every backend)."""
    rng = random.Random(seed)
    return [draw_case(rng, b, limits) for _ in range(count) for b in backends]


def _regression(heads, topk, rows, pool, **kw) -> dict:
    return dict(heads=heads, topk=topk, rows=rows, pool=pool, **kw)


# The flashmla shapes of issue 10 (H200 sweep): illegal accesses and wrong answers before the fix.
REGRESSION_SHAPES = (
    _regression(100, 5, 1, 1),
    _regression(128, 5, 1, 1),
    _regression(64, 5, 1, 1),
    _regression(48, 64, 2, 5000, kv_layout="row_stride", stride=600, out_of_range=0.02),
    _regression(48, 64, 2, 5000, invalid=0.0, out_of_range=0.0, duplicates=False),
    _regression(48, 5, 2, 70_000, q_layout="head_slice", kv_layout="row_stride", stride=600, out_of_range=0.2),
    _regression(32, 64, 1, 1, invalid=0.0, out_of_range=0.0),
    _regression(17, 1000, 1, 1),
    _regression(3, 1000, 2, 1, q_layout="head_slice"),
    _regression(100, 5, 1, 1000),
    _regression(100, 64, 1, 65_536),
    _regression(100, 2048, 1, 4096),
    # On sm_90 each of flashmla's Gluon kernels (tests/test_fuzz.py checks which run), with what
    # random draws seldom combine. Two splits merged in a thread-block cluster (wgmma_rr,
    # CLUSTER=2): a second head block of one head, a part-filled second split and an
    # all-invalid row; then a second split of 22 tokens, strided kv and half the indices -1.
    _regression(65, 200, 24, 5000, empty_rows=1),
    _regression(128, 150, 24, 70_000, kv_layout="row_stride", stride=640, invalid=0.5),
    # wgmma_rr in one split (the output stored through shared memory), less than a round of
    # top-k, at 64 heads and at 65 (two head blocks: its producer loads the indices early,
    # IDX_EARLY); wgmma_tn at 13 of its 16 heads in 5 splits.
    _regression(64, 100, 140, 5000, out_of_range=0.2),
    _regression(65, 100, 60, 5000, out_of_range=0.2),
    _regression(13, 300, 5, 300),
    # 656-byte FP8 tokens' two splits merged in a cluster (wgmma_ws, whose producer merges; 28
    # rows: 112 CTAs, enough of the SMs for FP8's cluster merge), with a one-head second head
    # block and an all-invalid row.
    _regression(65, 200, 28, 5000, empty_rows=1, kv_dtype=KV_FP8),
    # Split partials stored in the accumulator's order and merged by the Gluon combine (whole
    # 64-head blocks): wgmma_rr in 4 splits with indices past the pool (its producer loading the
    # indices early, IDX_EARLY, as at every 65+ heads outside a cluster); wgmma_ws at one row in
    # 5 splits, its combine a programmatic dependent launch; FP8 tokens (wgmma_ws) in 5 splits
    # with an all-invalid row.
    _regression(128, 400, 6, 5000, out_of_range=0.2),
    _regression(128, 300, 1, 5000),
    _regression(64, 300, 4, 5000, empty_rows=1, kv_dtype=KV_FP8),
    # The same with a partly-masked head block, whose partial holds its own heads only: wgmma_rr
    # at 32 heads in 9 splits; wgmma_ws at 96 heads (a whole block and half a block) with an
    # all-invalid row; FP8 tokens at 48 heads.
    _regression(32, 1100, 6, 5000, out_of_range=0.2),
    _regression(96, 200, 3, 5000, empty_rows=1),
    _regression(48, 300, 4, 5000, kv_dtype=KV_FP8),
    # FP8 tokens through wgmma_tn's ring of raw slots (few tiles a program): 13 of 16 heads in
    # 5 one-tile splits with indices past the pool; one split of 4 tiles, the last part-filled,
    # storing out/lse directly, with an all-invalid row; 20 of 32 heads (two ring slots) at 2
    # rows, one all-invalid, its combine a programmatic dependent launch.
    _regression(13, 300, 5, 5000, out_of_range=0.2, kv_dtype=KV_FP8),
    _regression(16, 250, 150, 5000, empty_rows=1, kv_dtype=KV_FP8),
    _regression(20, 2000, 2, 5000, empty_rows=1, kv_dtype=KV_FP8),
    # FP8 tokens through wgmma_tn's raw tile (more tiles a split, 16 heads): 7 of 16 heads in
    # splits of 5 tiles, the last part-filled, indices past the pool, an all-invalid row; one
    # split of 5 tiles storing out/lse directly. And in place at 20 of 32 heads (2 splits of 5),
    # its producer loading the indices early (IDX_EARLY).
    _regression(7, 1100, 33, 5000, out_of_range=0.2, empty_rows=1, kv_dtype=KV_FP8),
    _regression(16, 320, 140, 5000, kv_dtype=KV_FP8),
    _regression(20, 640, 64, 5000, kv_dtype=KV_FP8),
    # wgmma_rr's producer loading its indices a round ahead (IDX_EARLY: two head blocks): 100
    # heads in one split, 8 rounds the last part-filled, indices past the pool, an all-invalid
    # row; the same in 6 splits (head-major partials: 100 heads is no multiple of 16).
    _regression(100, 1000, 70, 70_000, out_of_range=0.2, empty_rows=1),
    _regression(100, 700, 5, 70_000, out_of_range=0.2, empty_rows=1),
)


def regression_cases(backends: list[str], dtype: str = "bfloat16", seeds: tuple[int, ...] = (1,)) -> list[FuzzCase]:
    """:data:`REGRESSION_SHAPES` for each backend, once per seed."""
    return [FuzzCase(backend=b, dtype=dtype, seed=seed, **shape)
            for shape in REGRESSION_SHAPES for seed in seeds for b in backends]


def make_inputs(case: FuzzCase, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q [rows, heads, 576]``, ``kv [pool, 576]`` (in the case's layouts) and ``indices``.

    Data is drawn on the CPU from ``case.seed`` (the same on every machine), then moved.
    """
    g = torch.Generator().manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)
    rows, heads, topk, pool = case.rows, case.heads, case.topk, case.pool

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g) * std).to(dtype).to(device)

    if case.q_layout == "head_slice":
        q = randn(rows, heads + 2, 600, std=Q_STD)[:, 1:1 + heads, :D_QK]
    elif case.q_layout == "offset":
        q = randn(case.offset + rows * heads * D_QK, std=Q_STD)[case.offset:].view(rows, heads, D_QK)
    else:
        q = randn(rows, heads, D_QK, std=Q_STD)
    if case.kv_dtype == KV_FP8:
        kv = _fp8_kv(case, torch.randn(pool, D_QK, generator=g)).to(device)
    elif case.kv_layout == "row_stride":
        kv = randn(pool, case.stride)[:, :D_QK]
    elif case.kv_layout == "offset":
        kv = randn(case.offset + pool * D_QK)[case.offset:].view(pool, D_QK)
    else:
        kv = randn(pool, D_QK)
    return q, kv, make_fuzz_indices(case, g).to(device)


def _fp8_kv(case: FuzzCase, values: torch.Tensor) -> torch.Tensor:
    """``values [pool, 576]`` as 656-byte FP8 tokens in the case's layout (in bytes, 4-aligned)."""
    tokens = quantize_kv(values)  # [pool, 656] uint8
    pool = tokens.shape[0]
    if case.kv_layout == "row_stride":
        buf = torch.full((pool, TOKEN_BYTES + 4 * (case.stride - D_QK)), 0xFF, dtype=torch.uint8)
    elif case.kv_layout == "offset":
        start = 4 * case.offset
        buf = torch.full((start + pool * TOKEN_BYTES,), 0xFF, dtype=torch.uint8)[start:].view(pool, TOKEN_BYTES)
    else:
        return tokens
    kv = buf[:, :TOKEN_BYTES]
    kv.copy_(tokens)  # the bytes between rows stay 0xFF (NaN scales): never read
    return kv


def make_fuzz_indices(case: FuzzCase, g: torch.Generator) -> torch.Tensor:
    """``[rows, topk]`` int32: valid tokens mixed with −1, out-of-range values, duplicates and
    ``empty_rows`` all-invalid rows (the last rows)."""
    rows, topk, pool = case.rows, case.topk, case.pool
    idx = torch.randint(0, pool, (rows, topk), generator=g, dtype=torch.int64)
    if case.duplicates and topk > 1:
        src = torch.randint(0, topk, (rows, topk), generator=g)
        dup = torch.rand(rows, topk, generator=g) < 0.3
        idx = torch.where(dup, idx.gather(1, src), idx)
    r = torch.rand(rows, topk, generator=g)
    far = torch.tensor((pool, pool + 5) + _FAR, dtype=torch.int64)
    pick = far[torch.randint(0, len(far), (rows, topk), generator=g)]
    idx = torch.where(r < case.invalid, torch.full_like(idx, -1), idx)
    idx = torch.where((r >= case.invalid) & (r < case.invalid + case.out_of_range), pick, idx)
    if case.empty_rows:
        tail = idx[rows - case.empty_rows:]
        tail.copy_(torch.where(torch.rand(tail.shape, generator=g) < 0.5, -1, pool + 1))
    return idx.to(torch.int32)


@contextlib.contextmanager
def poisoned_empty() -> Iterator[None]:
    """``torch.empty`` fills new memory with NaN (ints with their max) while active, so an
    output element a kernel never writes cannot pass for a right answer."""
    old = torch.utils.deterministic.fill_uninitialized_memory
    was = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = old


def kernel_label(case: FuzzCase, q: torch.Tensor, kv: torch.Tensor, platform=None) -> str:
    """Which kernel a flashmla case runs (a Gluon kernel's key such as ``wgmma_rr``, with
    ``+cluster`` where its two splits merge in a thread-block cluster, ``+native`` where its
    partials go to the combine in the accumulator's order, ``+ring`` where FP8 tokens go
    through a ring of raw slots, ``+raw`` where they go through wgmma_tn's raw tile and
    ``+early`` where its producer loads the indices early, ``triton_kv_major``, ``triton``); the
    backend name for the others. ``platform``: whose launch table (default the current one)."""
    if case.backend != "flashmla":
        return case.backend
    from ..common.kv_layout import is_fp8_kv
    from ..kernels.flashmla import plan_flashmla
    from ..kernels.launch import aligned_16

    plan = plan_flashmla(q.shape[0], q.shape[1], case.topk, 64, aligned_16(q, kv), is_fp8_kv(kv), platform)
    return (plan.kernel + ("+cluster" if plan.main.cluster > 1 else "")
            + ("+native" if plan.main.kwargs.get("PARTIAL_NATIVE") else "")
            + ("+ring" if plan.main.kwargs.get("RING") else "")
            + ("+raw" if plan.main.kwargs.get("RAW_TILE") else "")
            + ("+early" if plan.main.kwargs.get("IDX_EARLY") else ""))


def run_case(case: FuzzCase, device: torch.device | None = None, sm_scale: float = D_QK**-0.5) -> CaseResult:
    """Run ``case`` through its backend (make_metadata, plan, forward) and compare with the
    float64 reference. Outputs are NaN-poisoned, the workspace too.

    Exceptions other than a refusal (``ValueError``/``TypeError`` raised before the launch) are
    re-raised, so a caller can tell a lost device context from a usable one.
    """
    device = device or current_platform().device
    t0 = time.perf_counter()
    q, kv, idx = make_inputs(case, device)
    result = CaseResult(case, "ok", kernel=kernel_label(case, q, kv))
    try:
        backend = get_backend_class(case.backend)(case.heads, case.topk, getattr(torch, case.dtype), sm_scale,
                                                  **kv_kwargs(case.kv_dtype))
        with poisoned_empty():
            md = backend.make_metadata(case.rows)
            for buf in (md.workspace_out, md.workspace_lse):
                if buf is not None:
                    buf.view(buf.capacity).fill_(float("nan"))
            backend.plan(md, idx)
            out, lse = backend.forward(q, kv, md)
    except (ValueError, TypeError) as e:
        result.status, result.message = "refused", f"{type(e).__name__}: {e}"
        return result
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    _compare(result, q, kv, idx, sm_scale, out, lse)
    if result.status == "ok" and device.type != "cpu":
        # The first call compiled or found the kernels through Triton; a second call on the
        # same layouts runs the cached launchers (the launch path's fast path), so check it
        # too, on new q values in the same storage.
        q.neg_()
        with poisoned_empty():
            out, lse = backend.forward(q, kv, md)
        torch.cuda.synchronize(device)
        _compare(result, q, kv, idx, sm_scale, out, lse, "second call: ")
    result.seconds = time.perf_counter() - t0
    return result


def _compare(result: CaseResult, q, kv, idx, sm_scale, out, lse, what: str = "") -> None:
    case = result.case
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, sm_scale)
    if out.shape != ref_out.shape or out.dtype != q.dtype or lse.shape != ref_lse.shape:
        result.status = "wrong"
        result.message = f"{what}out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}: want {tuple(ref_out.shape)}"
        return
    tol = tolerance(q.dtype, case.kv_dtype)
    o, lo = out.double(), lse.double()
    result.out_err = _max_err(o, ref_out)
    result.lse_err = _max_err(lo, ref_lse)
    bad = []
    if not torch.allclose(o, ref_out, atol=tol.atol, rtol=tol.rtol, equal_nan=False):
        bad.append(f"out max error {result.out_err:.3g} (atol {tol.atol}, rtol {tol.rtol})")
    if not torch.allclose(lo, ref_lse, atol=tol.lse_atol, rtol=tol.lse_rtol, equal_nan=False):
        bad.append(f"lse max error {result.lse_err:.3g}")
    if bad:
        result.status, result.message = "wrong", f"{what}{case.label} [{result.kernel}]: " + "; ".join(bad)


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))  # equal infinities count as no error
    d = torch.where(same, torch.zeros_like(a), (a - b).abs())
    return float(d.nan_to_num(float("inf")).max())


@dataclass
class Summary:
    """Counts per backend (and per flashmla kernel) of a fuzz run, and its failures."""

    counts: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)

    def add(self, r: CaseResult) -> None:
        per = self.counts.setdefault(r.case.backend, dict.fromkeys(STATUSES, 0))
        per[r.status] = per.get(r.status, 0) + 1
        kern = self.kernels.setdefault(r.kernel or r.case.backend, dict.fromkeys(STATUSES, 0))
        kern[r.status] = kern.get(r.status, 0) + 1
        if r.status not in ("ok", "refused"):
            self.failures.append(r)

    @property
    def clean(self) -> bool:
        """No wrong answer, error or crash."""
        return not self.failures

    def table(self) -> str:
        """A markdown table of the counts."""
        lines = ["| backend / kernel | " + " | ".join(STATUSES) + " |", "|---" * (len(STATUSES) + 1) + "|"]
        for name, per in [*self.counts.items(), *(
                (f"flashmla: {k}", v) for k, v in self.kernels.items() if k not in self.counts)]:
            lines.append(f"| {name} | " + " | ".join(str(per.get(s, 0)) for s in STATUSES) + " |")
        return "\n".join(lines)
