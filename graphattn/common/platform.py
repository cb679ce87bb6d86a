"""Platform detection: the one place (with ``cuda/`` and ``hip/``) that knows the hardware.

``current_platform()`` resolves once to a :class:`Platform` for ``cpu``, ``cuda`` or ``hip``.
Set ``GRAPHATTN_PLATFORM`` to force one: ``hip`` on NVIDIA hardware (or on the CPU) exercises
HIP's graph and metadata rules without AMD hardware. The cuda and hip classes are imported
lazily by dotted path so that ``common`` imports nothing above it.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import torch

PLATFORM_ENV = "GRAPHATTN_PLATFORM"
_PLATFORM_CLASSES = {
    "cpu": "graphattn.common.platform.CpuPlatform",
    "cuda": "graphattn.cuda.platform.CudaPlatform",
    "hip": "graphattn.hip.platform.HipPlatform",
}


class Platform:
    """What the rest of graphattn may ask about the hardware.

    Attributes:
        name: ``"cpu"``, ``"cuda"`` or ``"hip"``.
        head_pad_multiple: head count a padded (flashmla-style) kernel needs a multiple of.
    """

    name: str = "abstract"
    head_pad_multiple: int = 64

    @property
    def device(self) -> torch.device:
        """The torch device tensors live on (``cuda`` for both NVIDIA and AMD GPUs)."""
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    @property
    def has_gpu(self) -> bool:
        """True when a real GPU is present (kernels compile; graphs are real graphs)."""
        return self.device.type == "cuda"

    @property
    def uses_triton_interpreter(self) -> bool:
        """True when Triton kernels must run under ``TRITON_INTERPRET=1`` (no GPU)."""
        return not self.has_gpu

    def num_compute_units(self) -> int:
        """Streaming multiprocessors (NVIDIA) or compute units (AMD); CPU cores on the CPU."""
        if self.has_gpu:
            return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return os.cpu_count() or 1

    def is_stream_capturing(self) -> bool:
        """Whether the current stream is in a real graph capture (torch's own query)."""
        return self.has_gpu and torch.cuda.is_current_stream_capturing()

    def synchronize(self) -> None:
        """Wait for all queued device work."""
        if self.has_gpu:
            torch.cuda.synchronize()

    def empty_cache(self) -> None:
        """Return cached allocator blocks to the device (a flush between replays in tests)."""
        if self.has_gpu:
            torch.cuda.empty_cache()

    def graph_segment_class(self) -> type:
        """The class that captures and replays one graph segment on this platform."""
        raise NotImplementedError

    def kernel_config(self, path: str, **shape: Any) -> dict[str, Any]:
        """Triton launch settings for kernel ``path`` at the given problem shape."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Device facts for logs and ``graphattn list``."""
        return {
            "platform": self.name,
            "device": str(self.device),
            "compute_units": self.num_compute_units(),
            "head_pad_multiple": self.head_pad_multiple,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"


class CpuPlatform(Platform):
    """No GPU: kernels run under the Triton interpreter, graphs on the CPU emulator."""

    name = "cpu"

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def graph_segment_class(self) -> type:
        from .emulated import EmulatedGraphSegment

        return EmulatedGraphSegment

    def kernel_config(self, path: str, **shape: Any) -> dict[str, Any]:
        # The interpreter runs one program at a time in numpy: small tiles, few splits.
        from .interpreter_configs import interpreter_config

        return interpreter_config(path, **shape)


def _resolve(name: str) -> Platform:
    if name not in _PLATFORM_CLASSES:
        raise ValueError(
            f"{PLATFORM_ENV}={name!r} is not a platform; expected one of "
            f"{sorted(_PLATFORM_CLASSES)} (or leave it unset to detect the hardware)"
        )
    module, _, cls = _PLATFORM_CLASSES[name].rpartition(".")
    return getattr(importlib.import_module(module), cls)()


def detect_platform_name() -> str:
    """The platform the hardware implies, ignoring ``GRAPHATTN_PLATFORM``."""
    if not torch.cuda.is_available():
        return "cpu"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


@functools.lru_cache(maxsize=None)
def current_platform() -> Platform:
    """The platform for this process, resolved once (``GRAPHATTN_PLATFORM`` overrides)."""
    return _resolve(os.environ.get(PLATFORM_ENV, "").strip().lower() or detect_platform_name())


def configure_triton_interpreter() -> None:
    """Set ``TRITON_INTERPRET=1`` (unless the caller set it) when kernels cannot be compiled.

    Triton chooses interpreter or compiler when it is first imported and when a function is
    decorated, and torch may import triton early (``torch._dynamo``), so ``graphattn`` calls
    this first thing on import.
    """
    if current_platform().uses_triton_interpreter:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def reset_platform_cache() -> None:
    """Forget the resolved platform (tests that change ``GRAPHATTN_PLATFORM`` call this)."""
    current_platform.cache_clear()
