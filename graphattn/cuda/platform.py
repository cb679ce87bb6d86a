"""The ``cuda`` platform (NVIDIA GPUs)."""

from __future__ import annotations

from typing import Any

import torch

from ..common.platform import Platform


class CudaPlatform(Platform):
    """NVIDIA GPUs: real CUDA graphs, kernels tuned for Hopper (sm_90) and newer."""

    name = "cuda"
    # FlashMLA's sparse decode kernel processes heads in groups of 64.
    head_pad_multiple = 64

    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) of the current device; (9, 0) when there is no GPU (ahead-of-time)."""
        if not self.has_gpu:
            return (9, 0)
        return torch.cuda.get_device_capability()

    def graph_segment_class(self) -> type:
        if not self.has_gpu:
            from ..common.emulated import EmulatedGraphSegment

            return EmulatedGraphSegment
        from .graphs import CudaGraphSegment

        return CudaGraphSegment

    def kernel_config(self, path: str, **shape: Any) -> dict[str, Any]:
        if not self.has_gpu:
            from ..common.interpreter_configs import interpreter_config

            return interpreter_config(path, **shape)
        from .configs import kernel_config

        return kernel_config(path, capability=self.compute_capability(), **shape)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["compute_capability"] = "%d.%d" % self.compute_capability()
        if self.has_gpu:
            info["name"] = torch.cuda.get_device_name()
        return info

