"""Platform-neutral core: errors, graph-safe buffers and metadata, platform, reference."""

from .buffers import GrowOnlyBuffer, OverflowPolicy
from .capture import capture_scope, is_capturing
from .errors import (
    CaptureCapacityError,
    CapturedBufferGrowthError,
    FreedCaptureBufferError,
    GraphSafetyError,
)
from .graphs import BreakableGraph, eager_on_graph
from .metadata import D_QK, D_V, GraphMetadata
from .platform import Platform, current_platform, reset_platform_cache
from .reference import sparse_mla_reference
from .runner import GraphRunner, default_buckets

__all__ = [
    "BreakableGraph",
    "eager_on_graph",
    "GraphRunner",
    "default_buckets",
    "GrowOnlyBuffer",
    "OverflowPolicy",
    "capture_scope",
    "is_capturing",
    "CaptureCapacityError",
    "CapturedBufferGrowthError",
    "FreedCaptureBufferError",
    "GraphSafetyError",
    "D_QK",
    "D_V",
    "GraphMetadata",
    "Platform",
    "current_platform",
    "reset_platform_cache",
    "sparse_mla_reference",
]
