"""The graph segment protocol and the part of it CUDA and HIP segments share.

A *segment* is one captured graph sharing a memory pool with others::

    seg = SegmentClass(pool=None, tracker=None)  # pool: share one handle across segments
    seg.capture_begin(); ...work...; seg.capture_end()
    seg.replay()

``current_platform().graph_segment_class()`` picks the class:
:class:`~graphattn.graphs.emulated.EmulatedGraphSegment` (CPU),
``graphattn.cuda.graphs.CudaGraphSegment`` (``torch.cuda.CUDAGraph``) or
``graphattn.hip.graphs.HipGraphSegment`` (HIP rules). The platform segments build on
:class:`StreamGraphSegment`, which knows streams and pools but no platform rule.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Iterator, Protocol

import torch

from ..common.capture import capture_scope
from .sanitizer import CaptureSanitizer, StorageTracker


class GraphSegment(Protocol):
    """What :class:`~graphattn.graphs.breakable.BreakableGraph` needs of a segment class.

    ``emulated`` is True for the CPU emulator (it always records borrowed storages);
    ``pool`` is the handle to pass to the next segment's constructor.
    """

    emulated: bool
    pool: Any

    def __init__(self, pool: Any = None, tracker: StorageTracker | None = None) -> None: ...

    @classmethod
    def warmup_scope(cls) -> AbstractContextManager[Any]:
        """Context for eager warm-up runs (the stream captures will use)."""
        ...

    def capture_begin(self) -> None:
        """Start capturing into ``pool`` (inside ``capture_scope``)."""
        ...

    def capture_end(self) -> None:
        """End the capture begun by :meth:`capture_begin`."""
        ...

    def replay(self) -> None:
        """Run the captured work again on the captured addresses."""
        ...


class StreamGraphSegment:
    """A segment on ``torch.cuda.CUDAGraph`` (a hipGraph under ROCm torch), captured on a side
    stream shared by every segment of the class on a device (a subclass per platform sets
    ``stream_key``, so CUDA and HIP rules never share a stream).

    Args:
        pool: graph pool handle to share (``torch.cuda.graph_pool_handle()`` when ``None``).
        tracker: when given, a :class:`CaptureSanitizer` records borrowed storages into it.
    """

    emulated = False
    stream_key = "cuda"
    _streams: dict[tuple[str, int], torch.cuda.Stream] = {}
    # torch's default: while a capture is open, a CUDA call that is unsafe during capture fails on
    # any thread. Isolated segments (:meth:`isolated`) use "thread_local".
    capture_error_mode = "global"

    def __init__(self, pool: Any = None, tracker: StorageTracker | None = None):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.tracker = tracker
        self._stack: ExitStack | None = None

    @classmethod
    def isolated(cls, capture_error_mode: str = "thread_local") -> type:
        """A subclass whose segments warm up and capture on side streams of their own (a new
        one per device for each class this returns), capturing with ``capture_error_mode``
        (``"thread_local"`` by default; runners keep torch's ``"global"``).

        For graphs captured behind an eager call (the torch backend's private graphs): torch keys
        cuBLAS workspaces by (handle, stream) and, from PR #175276 on, frees a capture stream's
        workspaces when any graph captured on that stream is destroyed, while other live graphs
        captured there still hold their addresses (pytorch/pytorch#193402). On a stream of their
        own, such graphs can be dropped without touching the workspace of any graph a runner
        captured, and an implicit capture does not make other threads' CUDA calls fail."""
        return type(cls.__name__, (cls,), {"_streams": {}, "stream_key": f"{cls.stream_key}/isolated",
                                           "capture_error_mode": capture_error_mode, "__module__": cls.__module__})

    @classmethod
    def capture_stream(cls) -> torch.cuda.Stream:
        """The side stream this class warms up and captures on (one per device)."""
        key = (cls.stream_key, torch.cuda.current_device())
        if key not in cls._streams:
            cls._streams[key] = torch.cuda.Stream()
        return cls._streams[key]

    @classmethod
    @contextmanager
    def warmup_scope(cls) -> Iterator[None]:
        """Run eager warm-up work on the capture stream, ordered after the caller's stream."""
        caller, side = torch.cuda.current_stream(), cls.capture_stream()
        side.wait_stream(caller)
        try:
            with torch.cuda.stream(side):
                yield
        finally:
            caller.wait_stream(side)

    def _end_graph(self) -> None:
        self.graph.capture_end()

    def capture_begin(self) -> None:
        """Begin capturing on the side stream into ``self.pool`` (inside ``capture_scope``)."""
        if self._stack is not None:
            raise RuntimeError("capture_begin() twice on one segment")
        stack = ExitStack()
        caller, side = torch.cuda.current_stream(), self.capture_stream()
        side.wait_stream(caller)
        stack.callback(caller.wait_stream, side)  # runs last: the caller waits for the capture
        try:
            stack.enter_context(torch.cuda.stream(side))
            self.graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
            stack.callback(self._end_graph)
            stack.enter_context(capture_scope())
            if self.tracker is not None:
                stack.enter_context(CaptureSanitizer(self.tracker))
        except BaseException:
            stack.close()  # never leave the caller on the side stream or a capture open
            raise
        self._stack = stack

    def capture_end(self) -> None:
        """End the capture (sanitizer, scope, graph, stream, in that order)."""
        if self._stack is None:
            raise RuntimeError("capture_end() without capture_begin()")
        stack, self._stack = self._stack, None
        stack.close()

    def replay(self) -> None:
        """Launch the captured graph on the current stream."""
        self.graph.replay()
