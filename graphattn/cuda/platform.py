"""The ``cuda`` platform's graph rules (NVIDIA GPUs; the CPU emulator when forced without one)."""

from __future__ import annotations

from typing import Any

from ..common.platform import Platform, emulated_segment_class


class CudaPlatform(Platform):
    """CUDA graph rules: real CUDA graphs on a GPU, the CPU emulator without one.

    Launch settings come from the real hardware (:attr:`Platform.launch_table`), not from
    these rules.
    """

    name = "cuda"
    # FlashMLA's sparse decode kernel processes heads in groups of 64.
    head_pad_multiple = 64

    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor) of the NVIDIA device; ``None`` without one (CPU, or AMD hardware)."""
        return self.facts.capability if self.has_gpu else None

    def graph_segment_class(self) -> type:
        if not self.has_gpu:
            return emulated_segment_class()
        from .graphs import CudaGraphSegment

        return CudaGraphSegment

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        capability = self.compute_capability()
        info["compute_capability"] = "%d.%d" % capability if capability else "none"
        if self.has_gpu:
            info["name"] = self.facts.name
        return info
