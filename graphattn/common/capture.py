"""Process-wide knowledge of whether a graph capture is in progress.

Real CUDA/HIP captures are visible through the platform's stream query; captures on the CPU
graph emulator are not, so every graph segment enters :func:`capture_scope` while it captures.
Buffers ask :func:`is_capturing` before they allocate.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from .platform import gpu_stream_capturing

class _State(threading.local):
    depth = 0  # a class default: reading it never raises (a missing attribute costs ~0.5 µs)


_state = _State()


def _depth() -> int:
    return _state.depth


@contextmanager
def capture_scope() -> Iterator[None]:
    """Mark the current thread as capturing for the duration of the block."""
    _state.depth = _depth() + 1
    try:
        yield
    finally:
        _state.depth = _depth() - 1


def is_capturing() -> bool:
    """True while a graph (real or emulated) is being captured on this thread/stream.

    Asked on every eager attention call and every ``plan()``: a thread-local read, then (once
    torch has initialised the GPU) one C query of the current stream; no platform lookup or
    environment read."""
    return _state.depth > 0 or gpu_stream_capturing()
