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


_current_platform = None  # platform.current_platform, imported on the first query


def is_capturing() -> bool:
    """True while a graph (real or emulated) is being captured on this thread/stream.

    Asked on every eager attention call, so the platform module is imported once, not per call
    (an import statement costs microseconds even when the module is loaded)."""
    global _current_platform
    if getattr(_state, "depth", 0) > 0:
        return True
    if _current_platform is None:
        from .platform import current_platform

        _current_platform = current_platform
    return _current_platform().is_stream_capturing()
