"""graphattn: graph-capture-safe sparse MLA attention backends for NVIDIA and AMD GPUs."""

from .common import (
    CaptureCapacityError,
    CapturedBufferGrowthError,
    FreedCaptureBufferError,
    GraphMetadata,
    GraphSafetyError,
    GrowOnlyBuffer,
    current_platform,
    sparse_mla_reference,
)

__version__ = "0.1.0"

__all__ = [
    "CaptureCapacityError",
    "CapturedBufferGrowthError",
    "FreedCaptureBufferError",
    "GraphMetadata",
    "GraphSafetyError",
    "GrowOnlyBuffer",
    "current_platform",
    "sparse_mla_reference",
    "__version__",
]
