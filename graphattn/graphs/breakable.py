"""BreakableGraph: a function captured as graph segments separated by eager breaks.

Segments follow the protocol in :mod:`graphattn.graphs.segments`; the platform picks their
class (``current_platform().graph_segment_class()``).

A :class:`BreakableGraph` captures a function as segments separated by *breaks*. Calling a
function decorated with :func:`eager_on_graph` during the capture ends the current segment, runs
that function eagerly, and starts the next segment. Its output is held strongly; every replay
re-runs it with the recorded arguments and copies its result into that held output, the address
later segments captured. A full graph is a BreakableGraph with no breaks.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_flatten

from ..common.buffers import GrowOnlyBuffer, recording_capture_marks, release_capture_marks
from ..common.platform import Platform, device_scope, indexed_device, platform_or_current
from .sanitizer import (
    BorrowedStorage,
    StorageTracker,
    collect_buffer_names,
    named_roots,
    sanitize_enabled,
    walk_objects,
)

log = logging.getLogger(__name__)
class _Active(threading.local):
    graph: Any = None  # the BreakableGraph capturing on this thread, if any (a class default:
    # reading a missing thread-local attribute raises inside and costs ~0.5 µs a break)


_active = _Active()


def eager_on_graph(fn: Callable | None = None, *, out: str | None = None,
                   bind: Callable[[tuple, dict], Callable[[], Any] | None] | None = None) -> Callable:
    """Mark ``fn`` as a graph break: during a BreakableGraph capture it runs eagerly between
    two segments (and again on every replay); anywhere else it is just called.

    ``fn`` must return tensors (or nested tuples/lists/dicts of them, or None) whose shapes do
    not change between capture and replay; later segments read those tensors' addresses, so a
    replay copies each new result into them. ``out``: the name of a keyword through which
    ``fn`` writes into given tensors and returns them (``AttentionBackend.forward``'s
    ``out``): replays then pass the captured outputs and nothing is copied (when they are
    contiguous; a non-contiguous captured output is copied into, as without ``out``). Use as
    ``eager_on_graph(f)``, ``eager_on_graph(f, out="out")`` or ``@eager_on_graph(out="out")``.

    ``bind``: called once per break at capture, after ``fn`` ran, with the ``(args, kwargs)``
    every replay passes (``kwargs`` holding ``out`` where it is used); it may return a
    zero-argument callable that replays run instead of ``fn(*args, **kwargs)``, doing the same
    work on the same objects with what ``fn`` checks on every call checked once
    (``AttentionBackend.bind_break``), or ``None``.
    """
    if fn is None:
        return functools.partial(eager_on_graph, out=out, bind=bind)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        graph = _active.graph
        if graph is None or not graph.breaks:
            return fn(*args, **kwargs)
        return graph._run_break(fn, args, kwargs, out, bind)

    wrapper.eager_on_graph = True
    return wrapper


class _Break:
    """A recorded break: the eager function, its arguments (held strongly), its output, and
    the keyword (if any) through which a replay hands ``fn`` that output to write into."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, out: Any, out_kwarg: str | None = None,
                 bind: Callable[[tuple, dict], Callable[[], Any] | None] | None = None):
        self.fn, self.args, self.out = fn, args, out
        self.held, _ = tree_flatten(out)
        # Only contiguous outputs can be handed back to write into (``forward(out=)`` requires
        # it); a view such as a padding backend's ``out[:, :heads]`` is copied into instead.
        direct = out_kwarg and all(t.is_contiguous() for t in self.held if isinstance(t, torch.Tensor))
        self.kwargs = {**kwargs, out_kwarg: out} if direct else kwargs
        self.bound = bind(args, self.kwargs) if bind is not None else None

    def run(self) -> None:
        """Re-run the function and copy its result into the output later segments read
        (nothing to copy when it wrote there itself)."""
        res = self.bound() if self.bound is not None else self.fn(*self.args, **self.kwargs)
        if res is self.out:  # it wrote into the captured output and returned it
            return
        held = self.held
        if type(res) is tuple and len(res) == len(held) and all(n is h for n, h in zip(res, held)):
            return
        new, _ = tree_flatten(res)
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        if len(new) != len(held):
            raise RuntimeError(f"break '{name}' returned {len(new)} values, captured {len(held)}")
        for n, h in zip(new, held):
            if isinstance(h, torch.Tensor):
                if not isinstance(n, torch.Tensor) or n.shape != h.shape:
                    raise RuntimeError(
                        f"break '{name}' must return the captured shape {tuple(h.shape)} on "
                        f"replay, got {getattr(n, 'shape', type(n).__name__)}"
                    )
                if n.data_ptr() != h.data_ptr():
                    h.copy_(n)
            elif n != h:
                raise RuntimeError(
                    f"break '{name}' returned {n!r} on replay but {h!r} at capture; non-tensor "
                    f"outputs are baked into the graph"
                )


class BreakableGraph:
    """A function captured as graph segments separated by :func:`eager_on_graph` breaks.

    Args:
        platform: whose segment class to use (default: ``current_platform()``).
        sanitize: check borrowed storages before every replay (default: ``GRAPHATTN_SANITIZE``);
            on the CPU emulator the check always runs, since the emulator must revive them.
        pool: a pool handle to share with other graphs (default: the first segment's own).
        breaks: False captures ``eager_on_graph`` functions inline (a full graph).
        name_roots: extra ``(label, object)`` pairs to name buffers in errors (e.g. metadata).
        device: the GPU the graph captures and replays on, current or not (default: the
            platform's device; a bare ``cuda`` is whichever GPU is current at each call).
            Capture streams, captures and Triton launches follow the current device, so the
            graph makes this one current around its warm-up, capture and replay.
        segment_class: the segment class to capture with (default: the platform's,
            ``isolated("global")``: side streams of this graph's own). Graphs freed at different
            times must not share a capture stream: torch frees a stream's cuBLAS workspaces when
            any graph captured on it is destroyed (pytorch/pytorch#193402). A ``GraphRunner``
            passes one class to all its buckets.

    ``capture(fn, *args, **kwargs)`` runs ``fn`` once under capture and returns its outputs;
    ``replay()`` replays every segment and break in order and returns the same output objects,
    overwritten in place.
    """

    def __init__(
        self,
        platform: Platform | None = None,
        sanitize: bool | None = None,
        pool: Any = None,
        breaks: bool = True,
        name_roots: Iterable[tuple[str, Any]] = (),
        device: torch.device | str | None = None,
        segment_class: type | None = None,
    ):
        self.platform = platform_or_current("BreakableGraph", platform)
        self.device = torch.device(device) if device is not None else self.platform.device
        # Capture streams of its own (a GraphRunner passes one class for all its buckets): torch
        # frees a capture stream's cuBLAS workspaces when any graph captured on it is destroyed
        # (pytorch/pytorch#193402), so graphs freed at different times must not share a stream.
        self.segment_class = segment_class or self.platform.graph_segment_class().isolated("global")
        self.sanitize = sanitize_enabled(sanitize)
        self.emulated = bool(getattr(self.segment_class, "emulated", False)) or not self.platform.has_gpu
        self.pool = pool
        self.breaks = breaks
        self.name_roots = list(name_roots)
        self.tracker = StorageTracker()
        self.segments: list[Any] = []
        self._breaks: list[_Break] = []
        self._capturing: Any = None  # the segment being captured
        self.out: Any = None
        self.captured = False
        self._schedule: list[Callable[[], None]] = []
        # Per segment: the borrowed storages its ops touched ({id: record}; empty untracked).
        self._segment_records: list[dict[int, BorrowedStorage]] = []
        self._replay_check: Callable[[], None] | None = None
        self._failed_segments: list[Any] = []  # of captures that raised (see _discard_attempt)
        self._inference = False  # captured in inference mode with breaks: replays run in it

    @property
    def num_segments(self) -> int:
        """Captured segments (breaks + 1)."""
        return len(self.segments)

    @property
    def num_breaks(self) -> int:
        """Eager breaks between segments."""
        return len(self._breaks)

    @property
    def tracking(self) -> bool:
        """True when captures record borrowed storages (sanitizer on, or the emulator)."""
        return self.sanitize or self.emulated

    # -- capture ------------------------------------------------------------------------
    def warmup(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` eagerly on the stream captures use (HIP: hipBLASLt handles are per stream)."""
        if not callable(fn):
            raise TypeError(f"BreakableGraph.warmup: fn must be callable, got {type(fn).__name__}")
        with device_scope(self.device), self.segment_class.warmup_scope():
            out = fn(*args, **kwargs)
        return out

    def capture(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Capture ``fn(*args, **kwargs)`` once; returns its outputs (replays overwrite them).

        A capture that raises leaves nothing behind: its segments, breaks and records are
        dropped and the buffers its views marked are released, so ``capture`` may be called
        again on this object.
        """
        if not callable(fn):
            raise TypeError(f"BreakableGraph.capture: fn must be callable, got {type(fn).__name__}")
        if self.captured:
            raise RuntimeError("this BreakableGraph is already captured; make a new one")
        if _active.graph is not None:
            raise RuntimeError("nested BreakableGraph capture on one thread is not supported")
        roots = named_roots(fn, args, kwargs, self.name_roots)
        names = collect_buffer_names(roots)
        pool, marked = self.pool, []
        try:
            with recording_capture_marks() as marked:
                self._capture(fn, args, kwargs)
            self._finish_capture(roots, names)
        except BaseException:
            self._discard_attempt(pool, marked)
            raise
        self.captured = True
        # Outputs made under inference mode are inference tensors, which a break's copy into
        # them may update only in inference mode: replays then run in it too.
        self._inference = torch.is_inference_mode_enabled() and bool(self._breaks)
        log.debug("captured %d segment(s), %d break(s)", self.num_segments, self.num_breaks)
        return self.out

    def _capture(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        """Run ``fn`` under capture, one segment per stretch between breaks."""
        _active.graph = self
        # No garbage collection while capturing: a collection runs the finalizers of whatever
        # earlier objects it frees (graphs, their pools, tensors) in the middle of the capture.
        # On the H200 the full test suite's conformance capture failed with
        # cudaErrorStreamCaptureInvalidated after other tests had run (twice in two runs of
        # that order) and passed in the one run with the collector off; torch.cuda.graph
        # likewise collects garbage before it captures.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        self.device = indexed_device(self.device)  # replays run where this capture ran
        try:
            with device_scope(self.device):  # capture streams and captures are per device
                self._begin_segment()
                try:
                    self.out = fn(*args, **kwargs)
                except BaseException:
                    self._abort_segment()
                    raise
                self._end_segment()
        finally:
            _active.graph = None
            if gc_was_enabled:
                gc.enable()

    def _finish_capture(self, roots: list[tuple[str, Any]], names: dict[int, str]) -> None:
        """Name the borrowed storages, build the replay schedule, then pin the buffers used
        (last: nothing after it may fail, since a failed capture must pin nothing)."""
        names.update({k: v for k, v in collect_buffer_names(roots).items() if k not in names})
        self.tracker.assign_names(names)
        self.tracker.end_capture()
        # What a replay runs, in order: the segments that recorded work (an empty one is a
        # no-op) and the breaks; built once, so a replay is one loop over bound methods.
        # A break may free or move storage a later segment reads (it rebinds an attribute):
        # a real graph would read it unchecked, so with the sanitizer on each later segment's
        # borrowed storages are checked again just before it replays. The emulator's segments
        # revive theirs before running any op, which checks the same.
        recheck = self.tracking and not all(getattr(seg, "emulated", False) for seg in self.segments)
        self._schedule = []
        for i, seg in enumerate(self.segments):
            records = self._segment_records[i]
            if i > 0 and recheck and records:
                self._schedule.append(functools.partial(_check_storages, tuple(records.values())))
            if not getattr(seg, "empty", False):
                self._schedule.append(seg.replay)
            if i < len(self._breaks):
                self._schedule.append(self._breaks[i].run)
        self._replay_check = self.tracker.check if self.tracking else None
        self._mark_used_buffers(roots)

    def _discard_attempt(self, pool: Any, marked: list[GrowOnlyBuffer]) -> None:
        """Forget a capture that raised, so that a retry records only its own work, and give
        back the marks its views made (no graph holds those buffers)."""
        # Kept, never replayed: torch frees a capture stream's cuBLAS workspaces when any graph
        # captured on it is destroyed (pytorch/pytorch#193402), so these segments must die with
        # the graphs that share their stream, not now.
        self._failed_segments.extend(self.segments)
        self.segments, self._breaks, self._schedule = [], [], []
        self._segment_records = []
        self._capturing = None
        self.tracker = StorageTracker()
        self.pool = pool
        self.out = None
        release_capture_marks(marked)

    def _begin_segment(self) -> None:
        tracker = _SegmentTracker(self.tracker) if self.tracking else None
        seg = self.segment_class(pool=self.pool, tracker=tracker)
        try:
            seg.capture_begin()
        except BaseException:
            self._failed_segments.append(seg)  # dies with this graph (see _discard_attempt)
            raise
        self.pool = seg.pool if self.pool is None else self.pool
        self.segments.append(seg)
        self._segment_records.append(tracker.records if tracker is not None else {})
        self._capturing = seg

    def _end_segment(self) -> None:
        seg, self._capturing = self._capturing, None
        if seg is not None:
            seg.capture_end()

    def _abort_segment(self) -> None:
        """End a capture that raised; a second error from ending it must not hide the first."""
        try:
            self._end_segment()
        except Exception as exc:  # the device may refuse to end an invalidated capture
            log.debug("ending the failed capture also raised: %s", exc)

    def _run_break(self, fn: Callable, args: tuple, kwargs: dict, out_kwarg: str | None = None,
                   bind: Callable[[tuple, dict], Callable[[], Any] | None] | None = None) -> Any:
        """Called by an ``eager_on_graph`` function during capture."""
        self._end_segment()
        _active.graph = None  # breaks called inside a break just run
        try:
            out = fn(*args, **kwargs)
        finally:
            _active.graph = self
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.tracker.add_pool(t.untyped_storage())  # the graph owns it (held below)
        self._breaks.append(_Break(fn, args, kwargs, out, out_kwarg, bind))
        self._begin_segment()
        return out

    def _mark_used_buffers(self, roots: list[tuple[str, Any]]) -> None:
        """Pin every grow-only buffer reachable from the capture whose storage a captured op
        touched, and every holder of such buffers (``GrowOnlyBuffer.view`` during capture
        already marks itself)."""
        if not self.tracking:
            return
        touched = self.tracker.borrowed_cdata()
        for _, obj in walk_objects(roots):
            bufs = _capture_buffers(obj)
            if bufs and any(b.tensor.untyped_storage()._cdata in touched for b in bufs):
                obj.mark_captured()

    # -- replay -------------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`FreedCaptureBufferError` if a borrowed storage was freed or moved.

        Raises:
            RuntimeError: this graph records nothing to check (``tracking`` is False: a real
                GPU graph made with ``sanitize=False``, the default).
        """
        if not self.tracking:
            raise RuntimeError(_untracked_message("BreakableGraph.check()", "BreakableGraph"))
        self.tracker.check()

    def replay(self) -> Any:
        """Check (when tracking), then replay every segment and break in order; with the
        sanitizer on a real graph, each segment after a break is checked again first."""
        if not self.captured:
            raise RuntimeError("replay() before capture()")
        if self._replay_check is not None:
            self._replay_check()
        if self._inference and not torch.is_inference_mode_enabled():
            with torch.inference_mode():
                return self.replay()
        with device_scope(self.device):  # no-op when the graph's device is current
            for step in self._schedule:
                step()
        return self.out

    def held_storages(self) -> list[Any]:
        """The borrowed storages the captured segments touch (``BorrowedStorage`` records);
        always empty when ``tracking`` is False (nothing was recorded, not nothing held)."""
        return self.tracker.borrowed()


class _SegmentTracker:
    """The graph's :class:`StorageTracker` as one segment's capture feeds it: every call goes
    to the shared tracker, and :attr:`records` keeps the borrowed storages this segment's ops
    touched (the storages to check again before it replays after a break)."""

    def __init__(self, tracker: StorageTracker):
        self.tracker = tracker
        self.records: dict[int, BorrowedStorage] = {}

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> dict[int, Any]:
        """:meth:`StorageTracker.observe`, remembering the borrowed storages it met."""
        weak = self.tracker.observe(func, args, kwargs, out)
        for w in weak.values():
            self.records.setdefault(id(w.storage), w.storage)
        return weak

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tracker, name)


def _check_storages(records: tuple[BorrowedStorage, ...]) -> None:
    """Raise :class:`FreedCaptureBufferError` for the first of ``records`` not in place."""
    for rec in records:
        problem = rec.problem()
        if problem is not None:
            raise rec.error(problem)


def _untracked_message(what: str, maker: str, captured: str = "the graph was", before: str = "capturing") -> str:
    """Why ``what`` (a ``check()``) has nothing to check: ``captured`` names what was captured
    untracked ("the graph was"; a GraphRunner's "the buckets were"), ``before`` the capture
    step the fix comes before ("capturing"; a GraphRunner's "capture()")."""
    return (
        f"{what}: nothing to check: {captured} captured without the capture sanitizer "
        f"(sanitize=False on a GPU, the default), so no borrowed storage was recorded. Fix: "
        f"make the {maker} with sanitize=True (or set GRAPHATTN_SANITIZE=1) before {before}."
    )


def _capture_buffers(obj: Any) -> list[GrowOnlyBuffer]:
    """The grow-only buffers ``obj`` holds: itself, or those an attention metadata object
    returns from ``buffers()``; duck-typed (``buffers()`` + ``mark_captured()``) so that the
    graph layer knows no attention class."""
    if isinstance(obj, GrowOnlyBuffer):
        return [obj]
    buffers, mark = getattr(obj, "buffers", None), getattr(obj, "mark_captured", None)
    # A class has both as plain functions; only its instances hold buffers.
    if not (callable(buffers) and callable(mark)) or isinstance(obj, type):
        return []
    return [b for b in buffers() if isinstance(b, GrowOnlyBuffer)]
