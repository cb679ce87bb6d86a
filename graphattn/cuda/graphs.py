"""The ``cuda`` platform's graph segment: one ``torch.cuda.CUDAGraph`` in a shared pool."""

from __future__ import annotations

import warnings

from ..graphs.segments import StreamGraphSegment


class CudaGraphSegment(StreamGraphSegment):
    """A CUDA graph segment, captured on a shared side stream into a shared pool.

    Args:
        pool: handle from ``torch.cuda.graph_pool_handle()`` (or another segment's ``.pool``);
            a new pool when ``None``.
        tracker: a :class:`~graphattn.graphs.sanitizer.StorageTracker` to record borrowed
            storages into (sanitizer on), or ``None``.

    ``capture_begin()`` makes the side stream wait for the caller's stream, enters it and
    starts capturing; ``capture_end()`` ends the capture and makes the caller's stream wait for
    the side stream. ``replay()`` launches the graph on the current stream.
    """

    stream_key = "cuda"

    def _end_graph(self) -> None:
        # A segment that holds only a break's neighbours can be empty; torch warns, but an
        # empty graph is valid and replays as a no-op.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
            self.graph.capture_end()
