"""AMD's launch table: :mod:`graphattn.hip.configs` for the device's gfx architecture."""

from __future__ import annotations

from typing import Any

import torch

from ..common.platform import LaunchTable
from . import configs


class AmdLaunchTable(LaunchTable):
    """Triton launch settings for an AMD CDNA GPU of architecture ``arch`` (e.g. ``"gfx942"``)."""

    name = "amd"

    def __init__(self, arch: str):
        super().__init__()
        self.arch = arch

    def settings(self, path: str, **shape: Any) -> dict[str, Any]:
        return configs.kernel_config(path, arch=self.arch, **shape)

    @property
    def fp8_dtype(self) -> torch.dtype:
        """e4m3fnuz on gfx942, e4m3fn on gfx950 (:func:`graphattn.hip.configs.fp8_dtype`)."""
        return configs.fp8_dtype(self.arch)

    def describe(self) -> dict[str, Any]:
        return {"launch_table": f"{self.name} {self.arch}"}
