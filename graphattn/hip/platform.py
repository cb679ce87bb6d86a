"""The ``hip`` platform (AMD GPUs; forced with ``GRAPHATTN_PLATFORM=hip`` on any machine)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..common.platform import Platform

HIP_ARCH_ENV = "GRAPHATTN_HIP_ARCH"
DEFAULT_ARCH = "gfx942"


class HipPlatform(Platform):
    """AMD CDNA GPUs (MI300 = gfx942, MI355 = gfx950) with HIP graph rules.

    On NVIDIA hardware or the CPU (forced through ``GRAPHATTN_PLATFORM=hip``) it keeps HIP's
    graph and metadata rules and reports the arch from ``GRAPHATTN_HIP_ARCH`` (default gfx942);
    the CDNA launch settings are then checked by compiling for gfx942/gfx950, not run.
    """

    name = "hip"
    head_pad_multiple = 64

    @property
    def is_native(self) -> bool:
        """True on real AMD hardware with a ROCm build of torch."""
        return self.has_gpu and bool(getattr(torch.version, "hip", None))

    def gfx_arch(self) -> str:
        """The gfx architecture name, e.g. ``"gfx942"`` (feature suffixes stripped)."""
        if self.is_native:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return props.gcnArchName.split(":")[0]
        return os.environ.get(HIP_ARCH_ENV, DEFAULT_ARCH)

    def is_stream_capturing(self) -> bool:
        # HIP rule: ask torch (hipStreamIsCapturing underneath), never a CUDA-only API.
        return self.has_gpu and torch.cuda.is_current_stream_capturing()

    def graph_segment_class(self) -> type:
        from .graphs import HipGraphSegment

        return HipGraphSegment

    def kernel_config(self, path: str, **shape: Any) -> dict[str, Any]:
        if self.is_native:
            from .configs import kernel_config

            return kernel_config(path, arch=self.gfx_arch(), **shape)
        if self.has_gpu:
            # Forced onto NVIDIA: CDNA-only launch options cannot run here; they are checked
            # by ahead-of-time compilation for gfx942/gfx950 instead.
            from ..cuda.configs import kernel_config as cuda_kernel_config

            return cuda_kernel_config(path, **shape)
        from ..common.interpreter_configs import interpreter_config

        return interpreter_config(path, **shape)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["gfx_arch"] = self.gfx_arch()
        info["native"] = self.is_native
        return info
