"""Platform-neutral core: errors, graph-safe buffers and metadata, capture status, platform,
reference and tolerances.

``BreakableGraph``, ``eager_on_graph``, ``GraphRunner`` and ``default_buckets`` moved to
:mod:`graphattn.graphs`; they stay importable from here for one release, resolved lazily so that
importing ``graphattn.common`` never imports the layer above it.
"""

from typing import Any

from .buffers import GrowOnlyBuffer, OverflowPolicy
from .capture import capture_scope, is_capturing
from .errors import (
    CaptureCapacityError,
    CapturedBufferGrowthError,
    CapturedShapeChangedError,
    FreedCaptureBufferError,
    GraphSafetyError,
    HostReadbackError,
    UntrackableTensorError,
)
from .metadata import D_QK, D_V, GraphMetadata
from .platform import Platform, current_platform, import_triton, reset_platform_cache
from .reference import sparse_mla_reference
from .tolerances import TOLERANCES, Tolerance, tolerance

import_triton()  # before torch can (torch._dynamo does), in the mode the kernels need

_MOVED_TO_GRAPHS = ("BreakableGraph", "eager_on_graph", "GraphRunner", "default_buckets")

__all__ = [
    *_MOVED_TO_GRAPHS,
    "GrowOnlyBuffer",
    "OverflowPolicy",
    "capture_scope",
    "is_capturing",
    "CaptureCapacityError",
    "CapturedBufferGrowthError",
    "FreedCaptureBufferError",
    "GraphSafetyError",
    "HostReadbackError",
    "UntrackableTensorError",
    "CapturedShapeChangedError",
    "D_QK",
    "D_V",
    "GraphMetadata",
    "Platform",
    "current_platform",
    "reset_platform_cache",
    "sparse_mla_reference",
    "TOLERANCES",
    "Tolerance",
    "tolerance",
]


def __getattr__(name: str) -> Any:
    # Deprecated re-exports of graphattn.graphs (an upward import, so only on first use).
    if name in _MOVED_TO_GRAPHS:
        from .. import graphs

        return getattr(graphs, name)
    raise AttributeError(f"module 'graphattn.common' has no attribute {name!r}")
