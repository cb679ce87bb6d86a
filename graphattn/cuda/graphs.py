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
    the side stream. ``replay()`` launches the graph on the current stream (skipped when the
    capture recorded nothing).
    """

    stream_key = "cuda"
    empty = False  # set when the capture recorded no work

    def _end_graph(self) -> None:
        # A segment that holds only a break's neighbours can be empty (torch checks the node
        # count and warns). An empty graph replays as a no-op, so replay() skips its launch:
        # a breakable graph whose breaks sit back to back pays no graph launch between them.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.graph.capture_end()
        for w in caught:
            if "CUDA Graph is empty" in str(w.message):
                self.empty = True
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def replay(self) -> None:
        """Launch the captured graph on the current stream (nothing to launch when empty)."""
        if not self.empty:
            self.graph.replay()
