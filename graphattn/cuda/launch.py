"""NVIDIA's launch table: :mod:`graphattn.cuda.configs` at the device's real compute capability."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from ..common.platform import LaunchTable
from . import configs, kernel_times


class NvidiaLaunchTable(LaunchTable):
    """Triton launch settings for an NVIDIA GPU of compute ``capability`` ``(major, minor)``.

    The capability is the device's own, whatever graph rules run on it: the Gluon wgmma
    kernel exists on sm_90 only, so an sm_80 GPU must never be handed sm_90's settings.
    """

    name = "nvidia"
    fp8_dtype = configs.FP8_DTYPE

    def __init__(self, capability: tuple[int, int]):
        super().__init__()
        self.capability = tuple(capability)
        if self.capability[0] == 9:  # measured on an H200; the settings are sm_90's too
            self.kernel_times = MappingProxyType(kernel_times.H200_US)
            self.kernel_times_fp8 = MappingProxyType(kernel_times.H200_US_FP8)

    def settings(self, path: str, **shape: Any) -> dict[str, Any]:
        return configs.kernel_config(path, capability=self.capability, **shape)

    def describe(self) -> dict[str, Any]:
        return {"launch_table": f"{self.name} sm_{self.capability[0]}{self.capability[1]}"}
