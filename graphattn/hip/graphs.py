"""The ``hip`` platform's graph segment: HIP graph rules, on AMD, NVIDIA or the CPU emulator.

HIP rules (what ROCm needs, applied everywhere the ``hip`` platform is forced):

* synchronize the device before every capture (pending work must not leak into the graph),
* warm up and capture on the **same** side stream (hipBLASLt handles are per stream, so a
  warm-up on another stream leaves the capture stream without its handle),
* ask torch whether the stream is capturing (``torch.cuda.is_current_stream_capturing``, i.e.
  ``hipStreamIsCapturing``); never a CUDA-only API,
* no CUDA-only graph features (no conditional nodes, debug dumps, or capture error modes).

On a GPU (AMD, or NVIDIA with ``GRAPHATTN_PLATFORM=hip``) the segment is a real graph; on the
CPU the rules are layered over :class:`~graphattn.graphs.emulated.EmulatedGraphSegment`, so
the same tests run without a GPU.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from ..common.capture import is_capturing
from ..common.errors import GraphSafetyError
from ..common.platform import Platform, current_platform
from ..graphs.emulated import EmulatedGraphSegment
from ..graphs.sanitizer import StorageTracker
from ..graphs.segments import StreamGraphSegment


class _HipStreamSegment(StreamGraphSegment):
    """The device graph under the HIP rules: its own shared side stream for warm-up and capture."""

    stream_key = "hip"


class HipGraphSegment:
    """One graph segment with HIP's rules.

    Args:
        pool: pool handle to share (a graph pool handle on a GPU, an ``EmulatedPool`` on the
            CPU); a new one when ``None``.
        tracker: a :class:`StorageTracker` to record borrowed storages into, or ``None``
            (the emulator always records).

    The platform whose rules apply is the class's ``platform`` (set by :meth:`for_platform`,
    which ``HipPlatform.graph_segment_class()`` uses), else ``current_platform()``.
    """

    emulated = False  # decided per instance: see ``self.emulated``
    platform: Platform | None = None
    _stream_class: type = _HipStreamSegment  # the device graph's class (its side stream)

    @classmethod
    def for_platform(cls, platform: Platform) -> type:
        """A subclass (same name) whose segments follow ``platform``, not ``current_platform()``."""
        return type(cls.__name__, (cls,), {"platform": platform, "__module__": cls.__module__})

    @classmethod
    def isolated(cls, capture_error_mode: str = "thread_local") -> type:
        """A subclass whose device graphs capture on side streams of their own
        (:meth:`StreamGraphSegment.isolated`); the emulator's are unchanged."""
        inner = cls._stream_class.isolated(capture_error_mode)
        return type(cls.__name__, (cls,), {"_stream_class": inner, "__module__": cls.__module__})

    def __init__(self, pool: Any = None, tracker: StorageTracker | None = None):
        self._platform = type(self).platform or current_platform()
        if self._platform.has_gpu:
            self._inner: Any = self._stream_class(pool=pool, tracker=tracker)
        else:
            self._inner = EmulatedGraphSegment(pool=pool, tracker=tracker)
        self.emulated = not self._platform.has_gpu

    @property
    def pool(self) -> Any:
        """The pool handle this segment captures into (share it with the next segments)."""
        return self._inner.pool

    @classmethod
    def warmup_scope(cls) -> Any:
        """Warm-up context: the very stream captures use (the hipBLASLt rule)."""
        if (cls.platform or current_platform()).has_gpu:
            return cls._stream_class.warmup_scope()
        return ExitStack()

    def _capturing(self) -> bool:
        # torch's capture-status query on a GPU; capture_scope() on the emulator.
        if self._platform.has_gpu:
            return self._platform.is_stream_capturing()
        return is_capturing()

    def capture_begin(self) -> None:
        """Synchronize, refuse nested capture, begin on the side stream, confirm it started."""
        if self._capturing():
            raise GraphSafetyError(
                "HIP graph capture started while the stream is already capturing; end the "
                "current segment first (HIP has no nested capture)"
            )
        self._platform.synchronize()
        self._inner.capture_begin()
        if not self._capturing():
            self._inner.capture_end()
            raise GraphSafetyError(
                "HIP graph capture did not start: torch reports the capture stream is not "
                "capturing (was the warm-up or capture moved to another stream?)"
            )

    def capture_end(self) -> None:
        """End the capture on the stream it began on."""
        self._inner.capture_end()

    def check(self) -> None:
        """Validate borrowed storages (emulator only; the sanitizer covers real graphs)."""
        if self.emulated:
            self._inner.check()

    def replay(self) -> None:
        """Replay; refused while a capture is in progress (HIP cannot launch into a capture)."""
        if self._capturing():
            raise GraphSafetyError("HIP graph replay requested while the stream is capturing")
        self._inner.replay()
