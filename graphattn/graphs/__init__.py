"""Graph machinery with no attention knowledge: segments, BreakableGraph, GraphRunner,
the capture sanitizer and the CPU graph emulator.

Layering: ``graphs`` imports ``common`` (errors, buffers, capture status, platform) and nothing
else of graphattn; the ``cuda`` and ``hip`` platform segments build on it. Attention metadata is
used duck-typed (``buffers()``, ``mark_captured()``).
"""

from .breakable import BreakableGraph, eager_on_graph
from .emulated import EmulatedGraphSegment, EmulatedPool
from .runner import GraphRunner, default_buckets
from .sanitizer import CaptureSanitizer, StorageTracker, sanitize_enabled
from .segments import GraphSegment, StreamGraphSegment

__all__ = [
    "BreakableGraph",
    "eager_on_graph",
    "EmulatedGraphSegment",
    "EmulatedPool",
    "GraphRunner",
    "default_buckets",
    "CaptureSanitizer",
    "StorageTracker",
    "sanitize_enabled",
    "GraphSegment",
    "StreamGraphSegment",
]
