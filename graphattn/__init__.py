"""graphattn: graph-capture-safe sparse MLA attention backends for NVIDIA and AMD GPUs.

Importing the package is cheap and changes nothing: torch is imported on first use of a name
below (the pytest plugin loads ``graphattn`` in every pytest run of an environment where it is
installed), and no environment variable is set (the Triton interpreter is switched on only while
graphattn's kernels are defined; see ``graphattn.common.platform.triton_interpreter_env``).
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _version() -> str:
    try:
        return version("graphattn")
    except PackageNotFoundError:  # a source tree on sys.path that pip never installed
        return "0+unknown"


__version__ = _version()

# Public names, resolved from graphattn.common on first use.
_FROM_COMMON = (
    "CaptureCapacityError",
    "CapturedBufferGrowthError",
    "FreedCaptureBufferError",
    "GraphMetadata",
    "GraphSafetyError",
    "GrowOnlyBuffer",
    "current_platform",
    "sparse_mla_reference",
)

__all__ = [*_FROM_COMMON, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _FROM_COMMON:
        return getattr(import_module(".common", __name__), name)
    raise AttributeError(f"module 'graphattn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
