"""The ``hip`` platform's graph rules (AMD GPUs; forced with ``GRAPHATTN_PLATFORM=hip`` anywhere)."""

from __future__ import annotations

import os
from typing import Any

from ..common.platform import Platform

HIP_ARCH_ENV = "GRAPHATTN_HIP_ARCH"
DEFAULT_ARCH = "gfx942"


class HipPlatform(Platform):
    """HIP graph rules, for AMD CDNA GPUs (MI300 = gfx942, MI355 = gfx950).

    Forced on NVIDIA hardware or the CPU (``GRAPHATTN_PLATFORM=hip``) it keeps HIP's graph and
    metadata rules and reports the arch from ``GRAPHATTN_HIP_ARCH`` (default gfx942). Launch
    settings always follow the real hardware (:attr:`Platform.launch_table`): NVIDIA's table at
    the device's own compute capability on NVIDIA, the interpreter's on the CPU. The CDNA
    settings are checked there by compiling for gfx942/gfx950, not run.
    """

    name = "hip"
    head_pad_multiple = 64
    # is_stream_capturing: the base class asks torch (hipStreamIsCapturing underneath), which is
    # the HIP rule; it never uses a CUDA-only API.

    @property
    def is_native(self) -> bool:
        """True on real AMD hardware with a ROCm build of torch."""
        return self.has_gpu and self.facts.vendor == "amd"

    def gfx_arch(self) -> str:
        """The gfx architecture name, e.g. ``"gfx942"`` (feature suffixes stripped)."""
        if self.is_native:
            return self.facts.gfx_arch
        return os.environ.get(HIP_ARCH_ENV, DEFAULT_ARCH)

    def graph_segment_class(self) -> type:
        """``HipGraphSegment`` bound to this platform object (one class per object), so a
        backend or runner given this platform gets its rules without ``GRAPHATTN_PLATFORM``."""
        cls = self.__dict__.get("_segment_class")
        if cls is None:
            from .graphs import HipGraphSegment

            cls = self._segment_class = HipGraphSegment.for_platform(self)
        return cls

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["gfx_arch"] = self.gfx_arch()
        info["native"] = self.is_native
        return info
