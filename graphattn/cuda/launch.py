"""NVIDIA's launch table: :mod:`graphattn.cuda.configs` at the device's real compute capability."""

from __future__ import annotations

import ctypes
import functools
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

    def allow_launch_shared_memory(self, kernel: Any, nbytes: int) -> None:
        """Let Triton's compiled ``kernel`` (loaded here on the current device) launch with
        ``nbytes`` of dynamic shared memory: ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``
        (Triton sets it only where the kernel's own need passes 48 KB)."""
        kernel._init_handles()  # the function handle on the current device (a no-op once loaded)
        err = _libcuda().cuFuncSetAttribute(ctypes.c_void_p(kernel.function), _MAX_DYNAMIC_SHARED,
                                            ctypes.c_int(nbytes))
        if err:
            raise RuntimeError(f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes}) failed for "
                               f"{getattr(kernel, 'name', kernel)!r}: CUresult {err}; the launch setting's "
                               "HOLD_SMEM must fit the device's shared memory per block")

    def describe(self) -> dict[str, Any]:
        return {"launch_table": f"{self.name} sm_{self.capability[0]}{self.capability[1]}"}


_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (cuda.h)


@functools.lru_cache(maxsize=1)
def _libcuda() -> ctypes.CDLL:
    """The CUDA driver library (loaded by torch and Triton already, on a machine with a GPU)."""
    return ctypes.CDLL("libcuda.so.1")
