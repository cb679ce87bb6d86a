"""Private graphs for eager calls: replay one captured graph of a call's ops instead of launching
them one by one (what ``torch.compile``'s "reduce-overhead" mode does).

An eager call of the ``torch`` backend runs ~20 ATen ops and pays a launch's host cost for each.
:class:`EagerGraphs` captures a call's ops on the second call with its *call key* (a key seen
once is not worth a capture) and from then on runs a call as four launches: copy q into the
graph's static q, replay, copy the static ``out`` and ``lse`` out. The platform says whether
graphs are real (``Platform.eager_graph_class``); the owner says which calls qualify.

Memory safety, by construction:

* **What a replay reads.** q from the static q (each call copies q in); kv and the index table
  through the addresses captured. The key holds everything the captured work depends on: the
  device and its current stream; q's shape and dtype (q must be contiguous and 16-byte
  aligned, as the static q is, so the ops see the same layout); kv's address, shape, strides
  and dtype; the index view's address, shape and strides. A graph replays only for a call whose
  kv and indices lie at those addresses with that layout, i.e. the caller's live tensors,
  whatever became of the ones seen at capture. Nothing read at capture is held (a KV pool is
  never kept alive).
* **What a replay writes.** Only memory this object owns: the static q/out/lse of its shape
  and the intermediates in its private pool. Callers get clones of the static outputs, or
  copies in their ``out=`` pair; the statics are never handed out.
* **One pool per (device, stream).** The graphs of one stream share a private pool, so it
  holds the intermediates of the largest call, not the sum. A graph may then overwrite pool
  memory another graph of the pool used for its intermediates, which is harmless because each
  use of a graph (copy in, replay, copy out) is issued back to back on that one stream, so
  replays of one pool never overlap and each copy-out reads its graph's outputs before the next
  replay runs. The statics live outside the pool (no other graph writes them). Graphs of
  another caller stream, which may run concurrently, get their own pool and their own capture
  stream (so their own cuBLAS workspace: torch keys it by stream). A pool handle is reused only
  while a graph of it lives (torch refuses to share a pool whose graphs are all gone).
* **Lifetime.** Graphs are kept in a :class:`~graphattn.common.buffers.EpochDict`, emptied
  whenever a grow-only buffer replaces its storage; shapes (each with its statics) are bounded
  in number and bytes, graphs per shape in number. Past a bound every graph goes at once, never
  one alone: torch frees the cuBLAS workspaces of a graph's capture stream when the graph is
  destroyed (from PR #175276 on; pytorch/pytorch#193402), which the other graphs captured on
  that stream still hold. These graphs capture on side streams of their own (the segment
  class's ``isolated()`` subclass per caller stream), never on a ``GraphRunner``'s. Nothing global holds a graph
  and nothing here refers back to the owner: all is freed with it.

One owner's eager calls on one stream are issued by one thread at a time (as its metadata's
``plan``/``forward`` pairs already are).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Hashable

import torch

from ..common.buffers import EpochDict
from ..common.capture import is_capturing
from ..common.errors import FreedCaptureBufferError
from ..common.metadata import D_V
from ..common.platform import current_gpu_index, current_stream_handle
from ..kernels.launch import direct_launch_allowed

log = logging.getLogger(__name__)

_get_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None)


def _tf32() -> bool:
    """Whether float32 matmuls may use TF32 now (``torch.backends.cuda.matmul.allow_tf32``)."""
    return bool(_get_tf32()) if _get_tf32 is not None else False

# attend(q [rows, heads, 576], kv, indices [rows, topk]) -> (out [rows, heads, 512] f32 or q's
# dtype, lse [rows, heads] f32): the ops a graph captures.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Outputs = tuple[torch.Tensor, torch.Tensor]

MAX_SHAPES = 16  # (device, stream, q shape and dtype) entries, each with its static q/out/lse
MAX_STATIC_BYTES = 256 << 20  # their statics together (the newest shape is always kept)
MAX_GRAPHS_PER_SHAPE = 256  # call keys per shape: one per KV pool (layer) and index table
MAX_SEEN = 1024  # keys called once and not captured yet


class _Pool:
    """A private memory pool handle shared by the graphs of one (device, stream). Each graph
    holds its record; the owner's map holds it weakly, so the handle goes with its last graph."""

    __slots__ = ("handle", "__weakref__")

    def __init__(self, handle: Any):
        self.handle = handle


class _Shape:
    """The statics of one (device, stream, q shape and dtype) and its graphs (most recently
    used last).

    Fields: ``q`` ``[rows, heads, 576]`` (q's dtype), ``out`` ``[rows, heads, 512]`` (q's dtype),
    ``lse`` ``[rows, heads]`` float32, all outside any graph pool; ``graphs``: call key ->
    ``(replay, pool record)``; ``nbytes``: the statics' bytes.
    """

    __slots__ = ("q", "out", "lse", "graphs", "nbytes")

    def __init__(self, q: torch.Tensor):
        rows, heads = q.shape[0], q.shape[1]
        # Normal tensors even when made under inference_mode: later calls outside it copy into them.
        with torch.inference_mode(False):
            self.q = torch.empty_like(q, memory_format=torch.contiguous_format)
            self.out = torch.empty(rows, heads, D_V, dtype=q.dtype, device=q.device)
            self.lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
        self.graphs: dict[Hashable, tuple[Callable[[], None], _Pool]] = {}
        self.nbytes = sum(t.numel() * t.element_size() for t in (self.q, self.out, self.lse))


class EagerGraphs:
    """The private graphs of one backend's eager calls (see the module docstring).

    Args:
        segment_class: the platform's graph segment class (``Platform.eager_graph_class()``;
            the CPU emulator's in tests); each caller stream captures with its ``isolated()``
            subclass.
        owner: the backend's name, for the log.

    Attributes:
        captures, replays: graphs captured and replays run so far (tests, diagnostics).
        failed: why capturing was given up (``None`` while it works): a capture that raised
            turns this object off; calls then run their ops.
        max_shapes, max_static_bytes, max_graphs, max_seen: the bounds (module constants).
    """

    def __init__(self, segment_class: type, owner: str):
        self.segment_class, self.owner = segment_class, owner
        self.max_shapes, self.max_static_bytes = MAX_SHAPES, MAX_STATIC_BYTES
        self.max_graphs, self.max_seen = MAX_GRAPHS_PER_SHAPE, MAX_SEEN
        self._shapes = EpochDict()  # (device, stream, q shape, q dtype) -> _Shape, most recently used last
        self._seen = EpochDict()  # (shape key, call key) -> None
        self._pools: weakref.WeakValueDictionary[tuple[int, int], _Pool] = weakref.WeakValueDictionary()
        self._classes: dict[tuple[int, int], type] = {}  # (device, caller stream) -> segment class
        self.captures = self.replays = 0
        self.failed: str | None = None

    def run(self, attend: Attend, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
            out: Outputs | None = None) -> Outputs | None:
        """``attend(q, kv, indices)`` through a private graph: ``(out, lse)`` in q's dtype and
        float32 (fresh tensors, or ``out`` written and returned), or ``None`` where the caller
        must run the ops itself: something watches or records the ops (tracing, compiling, a
        dispatch mode, a capture), q or kv needs grad, q is not contiguous and 16-byte aligned,
        q is not on the current device, or the key's first call.
        """
        if self.failed is not None or not direct_launch_allowed() or is_capturing():
            return None
        keys = self._keys(q, kv, indices)
        if keys is None:
            return None
        shape_key, call_key = keys
        shapes = self._shapes.current()
        shape = shapes.pop(shape_key, None)
        graph = None
        if shape is not None:
            shapes[shape_key] = shape  # most recently used last
            graph = shape.graphs.pop(call_key, None)
        if graph is not None:
            shape.graphs[call_key] = graph
        elif not self._seen_before(keys):
            return None
        elif shape is None:
            shape = self._new_shape(shapes, shape_key, q)
        if graph is None and len(shape.graphs) >= self.max_graphs:
            self._drop_graphs(shapes)  # all of them, before the next capture (see _drop_graphs)
        shape.q.copy_(q)  # before a capture too: its warm-up (and the emulator's capture) runs the ops
        if graph is None:
            graph = self._capture(attend, shapes, shape_key, shape, call_key, kv, indices)
            if graph is None:
                return None
        try:
            graph[0]()
        except FreedCaptureBufferError:
            # Only the CPU emulator raises here: it holds what a capture read by identity, a
            # real graph by address. A kv freed and made again at the captured address with the
            # captured layout is the caller's tensor (a real replay reads it right); drop it.
            shape.graphs.pop(call_key, None)
            return None
        self.replays += 1
        if out is None:
            return shape.out.clone(), shape.lse.clone()
        out[0].copy_(shape.out)
        out[1].copy_(shape.lse)
        return out

    @staticmethod
    def _keys(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor) -> tuple[tuple, tuple] | None:
        """``(shape key, call key)`` of a call that may use a graph, else ``None``."""
        if q.requires_grad or kv.requires_grad or not q.is_contiguous() or q.data_ptr() % 16:
            return None
        index = q.get_device()
        if index < 0:
            stream = 0  # CPU tensors: the emulator (tests)
        elif index == current_gpu_index():
            stream = current_stream_handle(index)
        else:
            return None  # segments capture and replay on the current device
        # TF32 for float32 matmuls is fixed into the cuBLAS kernels a capture records.
        return ((index, stream, q.shape, q.dtype),
                (kv.data_ptr(), kv.shape, kv.stride(), kv.dtype,
                 indices.data_ptr(), indices.shape, indices.stride(), _tf32()))

    def stats(self) -> dict[str, int]:
        """Shapes and graphs kept now, captures and replays so far."""
        shapes = self._shapes.current()
        return {"shapes": len(shapes), "graphs": sum(len(s.graphs) for s in shapes.values()),
                "captures": self.captures, "replays": self.replays}

    def _seen_before(self, key: Hashable) -> bool:
        """True on a key's second call (it is captured now); records the first."""
        seen = self._seen.current()
        if key in seen:
            del seen[key]
            return True
        seen[key] = None
        if len(seen) > self.max_seen:
            del seen[next(iter(seen))]
        return False

    def _new_shape(self, shapes: dict, key: Hashable, q: torch.Tensor) -> _Shape:
        """A shape's statics, kept last. Past the bounds every other shape goes, with all the
        graphs there are (:meth:`_drop_graphs`), before this shape's first capture."""
        shape = _Shape(q)
        total = shape.nbytes + sum(s.nbytes for s in shapes.values())
        if shapes and (len(shapes) + 1 > self.max_shapes or total > self.max_static_bytes):
            self._drop_graphs(shapes)
            shapes.clear()
        shapes[key] = shape
        return shape

    def _drop_graphs(self, shapes: dict) -> None:
        """Drop every graph at once (the shapes' statics stay), never one graph while others
        of this object live: destroying a graph frees the cuBLAS workspaces of the stream it was
        captured on (torch from PR #175276 on, pytorch/pytorch#193402), which the other graphs
        captured there still use. This object's graphs capture on streams of their own
        (``isolated()`` per caller stream), so dropping them all, before the next capture
        allocates a fresh workspace, leaves no graph with a freed one."""
        for shape in shapes.values():
            shape.graphs.clear()

    def _capture(self, attend: Attend, shapes: dict, shape_key: tuple, shape: _Shape,
                 call_key: Hashable, kv: torch.Tensor, indices: torch.Tensor) -> Any:
        """Capture ``attend`` on the shape's statics into the (device, stream) pool and keep it;
        ``None`` (and capturing given up) when the capture raised."""
        pool_key = shape_key[:2]
        pool = self._pools.get(pool_key)
        cls = self._classes.get(pool_key)
        if cls is None:  # per caller stream: its own capture stream, so its own cuBLAS workspace
            cls = self._classes[pool_key] = self.segment_class.isolated()
        try:
            segment = self._record(cls, attend, shape, kv, indices, None if pool is None else pool.handle)
        except Exception as exc:  # an optimisation: the ops still run (and raise if the call is wrong)
            self._give_up(exc)
            return None
        if pool is None:
            pool = self._pools[pool_key] = _Pool(segment.pool)
        graph = (segment.replay, pool)
        if shapes.get(shape_key) is shape and self._shapes.is_current():
            shape.graphs[call_key] = graph  # within max_graphs: run() dropped them all first if not
        self.captures += 1
        return graph

    def _record(self, cls: type, attend: Attend, shape: _Shape, kv: torch.Tensor, indices: torch.Tensor,
                pool: Any) -> Any:
        """Warm up on ``cls``'s capture stream, then capture ``attend`` writing the static outputs."""
        # Normal tensors throughout, whatever mode the caller is in: a graph captured under
        # inference_mode replays for calls outside it too.
        with torch.inference_mode(False), torch.no_grad():
            with cls.warmup_scope():  # the capture stream's first run of these ops (cuBLAS handles)
                attend(shape.q, kv, indices)
            segment = cls(pool=pool)
            segment.capture_begin()
            try:
                o, lse = attend(shape.q, kv, indices)
                shape.out.copy_(o)  # into q's dtype: the same conversion as o.to(q.dtype)
                shape.lse.copy_(lse)
                del o, lse  # pool memory: free before the capture ends
            finally:
                segment.capture_end()
        return segment

    def _give_up(self, exc: Exception) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"  # a string: a traceback would hold frames
        self._shapes.current().clear()
        self._seen.current().clear()
        log.warning("attention backend '%s': capturing an eager call's graph failed (%s); its "
                    "eager calls run op by op from now on", self.owner, self.failed)
