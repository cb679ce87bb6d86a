"""GraphRunner: capture a step function for a list of batch-size buckets and replay it.

Like a serving engine's graph runner (nano-vllm's ``capture_cudagraph``): static input tensors
are sized for the largest bucket; buckets are captured **largest first** into one shared pool;
a replay picks the smallest bucket that fits the live rows, copies the live inputs into
``[:rows]``, fills ``[rows:bucket]`` with inert pad values (indices −1), replays and returns
``out[:rows]``. Rows above the largest bucket run the function eagerly.

A metadata with ``extend_plan_(rows)`` (``GraphMetadata``) gets its planned step padded to the
bucket before each capture and replay, so an engine plans ``backend.plan(metadata, indices)``
with the live rows only and cannot forget the bucket's padding rows.

The runner owns graphs, not buffers: buffers the function uses live in a
:class:`~graphattn.common.metadata.GraphMetadata` (one per runner) that the first capture marks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
from torch.utils._pytree import tree_map

from ..common.buffers import PaddingRows, byte_span
from ..common.platform import Platform, platform_or_current
from ..common.validation import is_int
from .breakable import BreakableGraph, _untracked_message
from .sanitizer import sanitize_enabled

log = logging.getLogger(__name__)

MODES = ("full", "breakable")


class CapturedState(Protocol):
    """What the runner needs of its metadata (e.g. :class:`~graphattn.common.metadata.GraphMetadata`):
    a way to pin its buffers once a graph holds them. The graph layer knows no attention class."""

    def mark_captured(self) -> None:
        """Pin every buffer: growth after this raises instead of freeing captured memory."""
        ...


def _extend_plan(metadata: Any) -> Callable[[int], None] | None:
    """``metadata.extend_plan_`` (pads the planned step to a bucket's rows), or ``None`` for
    metadata without one (duck-typed: this layer knows no attention class)."""
    extend = getattr(metadata, "extend_plan_", None)
    return extend if callable(extend) else None


def _span(t: torch.Tensor) -> tuple[int, int, int]:
    """``(first byte, past the last byte, bytes per row)`` of a static input; an empty one
    gives ``(data_ptr, data_ptr, 0)`` (not :func:`byte_span`'s ``(0, 0)``)."""
    if t.numel() == 0:
        lo = t.data_ptr()
        return lo, lo, 0
    lo, hi = byte_span(t)
    return lo, hi, t.stride(0) * t.element_size()


def default_buckets(max_rows: int) -> list[int]:
    """Serving-engine style buckets: 1, 2, 4, 8, then every 8 up to ``max_rows`` (included)."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    buckets = [b for b in (1, 2, 4, 8) if b <= max_rows]
    buckets += list(range(16, max_rows + 1, 8))
    if buckets[-1] != max_rows:
        buckets.append(max_rows)
    return buckets


def _check_buckets(buckets: Sequence[int] | None, max_rows: int) -> list[int]:
    """Sorted distinct bucket sizes: ``None`` gives :func:`default_buckets`; an empty list or a
    non-integer size is an error, not a silent default."""
    if buckets is None:
        return default_buckets(max_rows)
    sizes = list(buckets)
    if not sizes:
        raise ValueError(
            f"buckets is empty: expected at least one bucket size in [1, {max_rows}]; pass "
            f"buckets=None for the default list ({default_buckets(max_rows)[:6]}...)"
        )
    bad = [b for b in sizes if not is_int(b)]
    if bad:
        raise TypeError(f"buckets must be ints (row counts), got {bad}")
    return sorted(set(int(b) for b in sizes))


class GraphRunner:
    """Captures ``fn`` once per bucket and replays the smallest bucket that fits.

    Args:
        fn: ``fn(**inputs)`` where each input is ``static_inputs[name][:bucket]``; returns a
            tensor or a (nested) tuple of tensors with dim 0 = bucket.
        static_inputs: ``{name: tensor [max_rows, ...]}`` persistent inputs (all with the same
            dim 0); the runner owns their contents.
        pad_values: ``{name: value}`` written into padding rows ``[rows:bucket]`` (e.g. −1 for
            indices so padded rows attend to nothing). Missing names pad with 0.
        metadata: the runner's one metadata object (any :class:`CapturedState`, usually a
            ``GraphMetadata``); marked captured by the first capture. If it has
            ``extend_plan_(rows)``, each capture and replay first pads the planned step to
            the bucket (inert index rows), so callers plan the live rows only.
        buckets: bucket sizes; default :func:`default_buckets` of ``max_rows``.
        mode: ``"full"`` (one graph per bucket, ``eager_on_graph`` captured inline) or
            ``"breakable"`` (``eager_on_graph`` functions become breaks).
        sanitize: check borrowed storages before each replay (default: ``GRAPHATTN_SANITIZE``).
        platform: default ``current_platform()``.
            The runner captures and replays on its static inputs' device (``cuda:N``, current
            or not); a platform bound to another device (``Platform.on_device``) is an error.
        progress: optional ``progress(done, total, bucket, seconds)`` called after each capture.
        log_every: log a progress line every this many captured buckets.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        static_inputs: Mapping[str, torch.Tensor],
        pad_values: Mapping[str, float] | None = None,
        metadata: CapturedState | None = None,
        buckets: Sequence[int] | None = None,
        mode: str = "full",
        sanitize: bool | None = None,
        platform: Platform | None = None,
        progress: Callable[[int, int, int, float], None] | None = None,
        log_every: int = 8,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not static_inputs:
            raise ValueError("static_inputs is empty: the runner needs at least one input")
        for name, t in static_inputs.items():
            if not isinstance(t, torch.Tensor) or t.dim() < 1:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"static input '{name}' must be a tensor [max_rows, ...], got {got}")
        if not callable(fn):
            raise TypeError(f"fn must be callable (the step to capture), got {type(fn).__name__}")
        sizes = {name: t.shape[0] for name, t in static_inputs.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"static inputs must share dim 0 (max rows); got {sizes}")
        self.max_rows = next(iter(sizes.values()))
        self.fn, self.static = fn, dict(static_inputs)
        self.platform = platform_or_current("GraphRunner", platform)
        # One capture stream for this runner's buckets (they share a pool and die together),
        # not the one every runner shared: see BreakableGraph's segment_class.
        self._segment_class = self.platform.graph_segment_class().isolated("global")
        self.device = self._static_device()
        self.pad_values = {name: 0 for name in self.static} | dict(pad_values or {})
        unknown = set(self.pad_values) - set(self.static)
        if unknown:
            raise ValueError(f"pad_values names {sorted(unknown)} are not static inputs {sorted(self.static)}")
        self.metadata, self.mode = metadata, mode
        self._extend_plan = _extend_plan(metadata)
        self.buckets = _check_buckets(buckets, self.max_rows)
        if self.buckets[0] < 1 or self.buckets[-1] > self.max_rows:
            raise ValueError(
                f"buckets must lie in [1, {self.max_rows}] (the static inputs' rows); got {self.buckets}"
            )
        self.sanitize = sanitize_enabled(sanitize)
        self.progress, self.log_every = progress, max(1, int(log_every))
        self.graphs: dict[int, BreakableGraph] = {}
        self.pool: Any = None
        # Per-step host work kept small (an engine calls run() every decode step): row views of
        # the static inputs and of each bucket's outputs are made once per row count, and
        # padding rows are refilled only where an earlier, larger step wrote live rows.
        # rows -> each static input's first rows, with its data pointer and strides
        self._row_views: dict[int, list[tuple[torch.Tensor, int, tuple[int, ...]]]] = {}
        self._out_views: dict[tuple[int, int], Any] = {}
        self._padding = PaddingRows()
        # Each static input's address range and row size: a live input that lies inside its
        # static tensor (an engine writing its inputs there) writes rows the padding record
        # must know of. (start, end, bytes per row)
        self._spans = [_span(t) for t in self.static.values()]
        # A bucket capture that raised: (bucket, "Type: message"), until capture() succeeds.
        # The text, not the exception: its traceback would keep the failed capture's frames alive.
        self._capture_failure: tuple[int, str] | None = None
        # Graphs of bucket captures that raised, never replayed; they die with the runner (see
        # BreakableGraph._discard_attempt: destroying one would free its capture stream's cuBLAS
        # workspaces, which the captured buckets on that stream still use).
        self._failed_graphs: list[BreakableGraph] = []
        # What run() compares each live input with: (all dims but the rows, dtype, device).
        self._expected = {n: (t.dim(), t.shape[1:], t.dtype, t.device) for n, t in self.static.items()}
        # A GraphMetadata checks that its plan covers a replay (duck-typed: any metadata may).
        self._check_plan = getattr(metadata, "check_replay_rows", None)
        self._capture_rows = getattr(metadata, "capture_rows", None)

    # -- capture ------------------------------------------------------------------------
    def _inputs(self, rows: int) -> dict[str, torch.Tensor]:
        return {name: t[:rows] for name, t in self.static.items()}

    def _pad(self, start: int, stop: int) -> None:
        for name, t in self.static.items():
            if stop > start:
                t[start:stop].fill_(self.pad_values[name])

    def capture(self) -> None:
        """Capture every bucket, largest first, into one pool; mark the metadata after the first.

        Static inputs are filled with pad values first, so captures run on inert rows. If a
        bucket's capture raises, the buckets captured before it stay in use and a later
        ``capture()`` captures the ones still missing (once the cause is fixed).
        """
        missing = self._missing_buckets()
        if not missing:
            raise RuntimeError("GraphRunner.capture() was already called (every bucket is captured)")
        if self.graphs:
            log.info("capture resumes with the missing buckets %s", missing)
        self._pad(0, self.max_rows)
        self._padding = PaddingRows()  # every row holds its pad value now
        total, t_all = len(self.buckets), time.perf_counter()
        for bucket in missing:
            try:
                seconds, nbytes = self._capture_bucket(bucket)
            except BaseException as exc:
                self._capture_failure = (bucket, f"{type(exc).__name__}: {exc}")
                raise
            done = len(self.graphs)
            log.debug("captured bucket %d in %.3f s (+%d bytes device memory)", bucket, seconds, nbytes)
            if self.progress is not None:
                self.progress(done, total, bucket, seconds)
            if done % self.log_every == 0 or done == total:
                log.info(
                    "graph capture %d/%d buckets (last %d rows, %.3f s; %.2f s total)",
                    done, total, bucket, seconds, time.perf_counter() - t_all,
                )
        self._capture_failure = None

    def _missing_buckets(self) -> list[int]:
        """Buckets not captured yet, largest first (the order captures run in)."""
        return [b for b in sorted(self.buckets, reverse=True) if b not in self.graphs]

    def _capture_bucket(self, bucket: int) -> tuple[float, int]:
        """Warm up and capture one bucket; returns (seconds, device bytes allocated)."""
        mem0 = self._memory()
        t0 = time.perf_counter()
        roots = [("metadata", self.metadata)] if self.metadata is not None else []
        graph = BreakableGraph(
            self.platform, self.sanitize, self.pool, self.mode == "breakable", roots, device=self.device,
            segment_class=self._segment_class,
        )
        inputs = self._inputs(bucket)
        if self._extend_plan is not None:
            self._extend_plan(bucket)  # capture on a plan of the bucket's rows (padding inert)
        # The metadata lets the bucket's forward read unplanned rows while capturing: inputs
        # are inert, and each replay checks the plan that covers it.
        try:
            with self._capture_rows(bucket) if self._capture_rows else contextlib.nullcontext():
                graph.warmup(self.fn, **inputs)  # as engines do: first-call work happens outside
                self._synchronize()
                graph.capture(self.fn, **inputs)
                self._synchronize()
        except BaseException:
            self._failed_graphs.append(graph)
            raise
        self.pool = graph.pool
        self.graphs[bucket] = graph
        if self.metadata is not None:
            self.metadata.mark_captured()  # after the first capture; never undone
        return time.perf_counter() - t0, self._memory() - mem0

    def _not_captured(self, bucket: int, rows: int) -> str:
        """Why ``run`` has no graph for ``bucket``."""
        if self._capture_failure is None:
            return "GraphRunner.run() before capture(): call runner.capture() first"
        failed, why = self._capture_failure
        return (
            f"GraphRunner.run(): bucket {bucket} (for {rows} rows) is not captured: capture() "
            f"failed at bucket {failed} ({why}). Fix the cause and call capture() again (it "
            f"captures the missing buckets {self._missing_buckets()}), or make a new GraphRunner."
        )

    def _check_no_self_overlap(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        """Refuse a live input that overlaps the static rows it is copied into (a later slice
        of ``runner.static`` whose rows run into ``[:rows]``): the copy would read what it
        overwrites."""
        for d, t in zip(dst, src):
            (d0, d1, _), (s0, s1, _) = _span(d), _span(t)
            if d0 < s1 and s0 < d1:
                name = next(n for n, v in self.static.items() if v.data_ptr() <= d0 < _span(v)[1])
                raise ValueError(
                    f"GraphRunner.run: live input '{name}' (a slice of runner.static['{name}']) "
                    f"overlaps the rows [:{d.shape[0]}] it is copied into, so the copy would read "
                    f"what it overwrites. Fix: pass runner.static['{name}'][:rows] itself (no "
                    f"copy), or a tensor outside runner.static."
                )

    def _static_rows_written(self, live: Mapping[str, torch.Tensor]) -> int:
        """The leading static rows that live inputs lying inside their static tensors reach
        (up to the largest bucket: no graph reads rows past it); 0 when none does."""
        top, largest = 0, self.buckets[-1]
        for name, (lo, hi, row_bytes) in zip(self.static, self._spans):
            t = live[name]
            p = t.data_ptr()
            if not lo <= p < hi or t.numel() == 0:
                continue
            if row_bytes <= 0:
                return largest
            last = byte_span(t)[1] - t.element_size()  # the first byte of its furthest element
            top = max(top, (last - lo) // row_bytes + 1)
        return min(top, largest)

    def _memory(self) -> int:
        if self.platform.has_gpu:
            return torch.cuda.memory_allocated(self.device)
        return 0

    def _synchronize(self) -> None:
        if self.platform.has_gpu:
            torch.cuda.synchronize(self.device)

    # -- devices --------------------------------------------------------------------------
    def _static_device(self) -> torch.device:
        """The one device of the static inputs (and of the platform, where it names one)."""
        devices = {name: t.device for name, t in self.static.items()}
        device = next(iter(devices.values()))
        if len(set(devices.values())) != 1:
            raise ValueError(f"static inputs must be on one device; got {devices}")
        bound = self.platform.device
        if bound.index is not None and bound != device:
            raise ValueError(
                f"static inputs are on {device} but the platform is bound to {bound}; make them "
                f"on {bound} or pass platform=current_platform().on_device({str(device)!r})"
            )
        return device

    # -- replay -------------------------------------------------------------------------
    def bucket_for(self, rows: int) -> int | None:
        """The smallest bucket >= ``rows``; ``None`` when ``rows`` exceeds every bucket."""
        for b in self.buckets:
            if b >= rows:
                return b
        return None

    def _live_rows(self, live: Mapping[str, torch.Tensor]) -> int:
        if live.keys() != self.static.keys():
            raise ValueError(f"run() expects inputs {sorted(self.static)}, got {sorted(live)}")
        n = None
        for name, t in live.items():
            dim, tail, dtype, device = self._expected[name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"GraphRunner.run: input '{name}' must be a tensor, got {type(t).__name__}")
            if t.dim() != dim or t.shape[1:] != tail or t.dtype != dtype or t.device != device:
                # Refused, not broadcast or cast by copy_: a [rows, 1, d] q would fill every head.
                want = "[rows" + "".join(f", {d}" for d in tail) + "]"
                raise ValueError(
                    f"GraphRunner.run: input '{name}' must be {want} {dtype} on {device} (its "
                    f"static tensor's dims after the rows, dtype and device), got "
                    f"{tuple(t.shape)} {t.dtype} on {t.device}; convert it first"
                )
            if n is None:
                n = t.shape[0]
            elif t.shape[0] != n:
                rows = {k: v.shape[0] for k, v in live.items()}
                raise ValueError(f"GraphRunner.run: live inputs must share dim 0 (rows); got {rows}")
        if n < 1:
            raise ValueError(f"GraphRunner.run: needs at least one row, got {n} (skip the step instead)")
        return n

    def run(self, **live: torch.Tensor) -> Any:
        """Run one step on ``live`` inputs ``{name: [rows, ...]}``; returns outputs ``[:rows]``.

        Each live input is copied into its static tensor's first rows, except one that already
        is them (``runner.static[name][:rows]``, written in place by the caller): no copy then.
        Graph outputs are views of captured memory: the next ``run`` overwrites them, so copy
        what must outlive it. Rows above the largest bucket run ``fn`` eagerly (slices of the
        captured buffers up to the metadata's reserved rows, temporaries beyond them). The
        metadata's planned step is padded to the bucket first (see ``extend_plan_``).
        """
        rows = self._live_rows(live)
        bucket = self.bucket_for(rows)
        if bucket is None or bucket not in self.graphs:
            if bucket is not None:
                raise RuntimeError(self._not_captured(bucket, rows))
            # Rows the caller wrote into the static inputs themselves are live data now, where
            # the next replay of a bucket may expect padding.
            written = self._static_rows_written(live)
            if written:
                self._padding.wrote(written)
            return self.fn(**live)
        if self._extend_plan is not None:
            self._extend_plan(bucket)  # the bucket's padding rows attend to nothing
        if self._check_plan is not None:
            self._check_plan(rows, bucket)
        views = self._row_views.get(rows)
        if views is None:
            views = self._row_views[rows] = [(t.narrow(0, 0, rows), t.data_ptr(), t.stride())
                                             for t in self.static.values()]
        # An input that is its static tensor's first rows already (an engine that writes its
        # inputs into ``runner.static``) is not copied onto itself. The rest go in one launch on
        # a GPU (a multi-tensor copy where the inputs are contiguous, as _live_rows made their
        # dtypes and devices the static ones'), not one launch each: a copy launch costs ~5 µs of
        # host time.
        dst, src = [], []
        inside = False
        for (view, ptr, stride), name, (lo, hi, _) in zip(views, self.static, self._spans):
            t = live[name]
            p = t.data_ptr()
            if p != ptr or t.stride() != stride:
                dst.append(view)
                src.append(t)
                inside = inside or lo <= p < hi  # other static rows: the caller wrote them
        if inside:
            self._check_no_self_overlap(dst, src)
        if dst:
            torch._foreach_copy_(dst, src)
        if inside:
            self._padding.wrote(self._static_rows_written(live))
        self._padding.pad(rows, bucket, self._pad)
        out = self.graphs[bucket].replay()
        if rows == bucket:
            return out
        key = (bucket, rows)
        sliced = self._out_views.get(key)
        if sliced is None:
            sliced = self._out_views[key] = tree_map(
                lambda t: t.narrow(0, 0, rows) if isinstance(t, torch.Tensor) else t, out)
        return sliced

    def pools(self) -> list[Any]:
        """The pool handle of every captured segment of every bucket (all the same object when
        the buckets share one pool, as they must: graph memory then does not grow with the
        number of buckets)."""
        return [seg.pool for graph in self.graphs.values() for seg in graph.segments]

    @property
    def tracking(self) -> bool:
        """True when the captured buckets recorded their borrowed storages (sanitizer on, or
        the CPU emulator), so :meth:`check` and :meth:`held_storages` have something to go on;
        False before capture."""
        return bool(self.graphs) and all(g.tracking for g in self.graphs.values())

    def check(self) -> None:
        """Sanitize every captured bucket's graph now (nothing to do before capture).

        Raises:
            FreedCaptureBufferError: a borrowed storage was freed or moved since capture.
            RuntimeError: the buckets were captured without the sanitizer (``tracking`` is
                False: ``sanitize=False`` on a GPU, the default), so nothing can be checked.
        """
        for graph in self.graphs.values():
            if not graph.tracking:
                raise RuntimeError(_untracked_message(
                    "GraphRunner.check()", "GraphRunner", captured="the buckets were", before="capture()"
                ))
            graph.tracker.check()

    def held_storages(self) -> list[Any]:
        """Distinct borrowed storages all buckets' graphs touch (``BorrowedStorage``); empty
        when :attr:`tracking` is False (nothing was recorded, not nothing held)."""
        seen: dict[int, Any] = {}
        for graph in self.graphs.values():
            for rec in graph.held_storages():
                seen.setdefault(rec.ref.cdata, rec)
        return list(seen.values())
