"""graphattn: graph-capture-safe sparse MLA attention backends for NVIDIA and AMD GPUs."""

from .common.platform import configure_triton_interpreter

configure_triton_interpreter()  # before anything imports triton or defines a kernel

from .common import (  # noqa: E402
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
