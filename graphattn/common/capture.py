"""Process-wide knowledge of whether a graph capture is in progress.

Real CUDA/HIP captures are visible through the platform's stream query; captures on the CPU
graph emulator are not, so every graph segment enters :func:`capture_scope` while it captures.
Buffers ask :func:`is_capturing` before they allocate.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_state = threading.local()


def _depth() -> int:
    return getattr(_state, "depth", 0)


@contextmanager
def capture_scope() -> Iterator[None]:
    """Mark the current thread as capturing for the duration of the block."""
    _state.depth = _depth() + 1
    try:
        yield
    finally:
        _state.depth = _depth() - 1


def is_capturing() -> bool:
    """True while a graph (real or emulated) is being captured on this thread/stream."""
    if _depth() > 0:
        return True
    from .platform import current_platform

    return current_platform().is_stream_capturing()
