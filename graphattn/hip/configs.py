"""Triton launch settings for AMD CDNA3/CDNA4 (gfx942 = MI300, 304 CUs; gfx950 = MI355, 256 CUs).

``kernel_config(path, arch, rows=, heads=, topk=)`` returns a dict (keys: see
``graphattn.kernels.plan``) with the AMD backend's own options:

* ``num_stages=2``: the AMD stream pipeliner double-buffers global loads through LDS; more
  stages cost LDS (64 KB on gfx942, 160 KB on gfx950) that the 512-wide KV tiles need.
* ``waves_per_eu``: occupancy hint to the register allocator; the [BLOCK_H, 512] f32
  accumulator is large, so 2 waves per EU (<= 256 VGPRs each) for 16-head tiles, 1 for wider.
* ``matrix_instr_nonkdim=16``: 16x16 MFMA tiles (BLOCK_H is a multiple of 16).
* ``kpack=2`` on gfx942 (wider LDS reads for MFMA operands); gfx950 deprecates kpack (1).

No AMD hardware was available to tune these: they follow the ROCm Triton tuning guide and
are checked by compiling every setting for gfx942 and gfx950 (tests/test_kernels_aot.py).
"""

from __future__ import annotations

from typing import Any

import torch

ARCHS = ("gfx942", "gfx950")
_COMPUTE_UNITS = {"gfx942": 304, "gfx950": 256}
# The FP8 format each arch converts natively (the 656-byte KV tokens' values): CDNA3 has the
# "fnuz" e4m3 (no negative zero, max 240), CDNA4 the OCP e4m3fn (max 448).
_FP8_DTYPES = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}
_PATHS = ("flashmla", "trtllm", "mega", "flashmla_combine")
# heads up to the first item use the tiles: (BLOCK_H, BLOCK_N, num_warps, waves_per_eu).
_TILES = (
    (16, (16, 64, 4, 2)),
    (1 << 30, (32, 32, 8, 1)),
)


def _tiles(heads: int, arch: str) -> dict[str, Any]:
    for max_heads, (bh, bn, warps, waves) in _TILES:
        if heads <= max_heads:
            return {
                "BLOCK_H": bh, "BLOCK_N": bn, "num_warps": warps, "num_stages": 2,
                "waves_per_eu": waves, "matrix_instr_nonkdim": 16,
                "kpack": 2 if arch == "gfx942" else 1,
            }
    raise AssertionError("unreachable: the last _TILES row covers every head count")


def _check_arch(arch: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"no CDNA kernel settings for {arch!r}; supported: {', '.join(ARCHS)}")


def fp8_dtype(arch: str) -> torch.dtype:
    """The FP8 format of 656-byte KV tokens on ``arch``: ``float8_e4m3fnuz`` on gfx942,
    ``float8_e4m3fn`` on gfx950."""
    _check_arch(arch)
    return _FP8_DTYPES[arch]


def kernel_config(path: str, arch: str, rows: int = 1, heads: int = 64, topk: int = 2048,
                  kv_fp8: bool = False) -> dict[str, Any]:
    """Launch settings for kernel ``path`` on ``arch`` at ``rows x heads x topk`` (``kv_fp8``,
    656-byte FP8 tokens, takes the same tiles: untuned without AMD hardware)."""
    _check_arch(arch)
    if path not in _PATHS:
        raise ValueError(f"Unknown kernel path: {path!r}. Valid options are: {', '.join(_PATHS)}")
    if path == "flashmla_combine":
        return {"num_warps": 4, "num_stages": 1, "waves_per_eu": 2}
    cfg = _tiles(heads, arch)
    if path != "mega":
        cfg.update(max_splits=16, min_split_blocks=4, target_programs=_COMPUTE_UNITS[arch])
    return cfg


def all_configs(path: str, arch: str, kv_fp8: bool = False) -> list[dict[str, Any]]:
    """Every distinct setting :func:`kernel_config` can return for ``path`` on ``arch`` (the
    same with ``kv_fp8``)."""
    _check_arch(arch)
    if path == "flashmla_combine":
        return [kernel_config(path, arch)]
    return [_tiles(max_heads, arch) for max_heads, _ in _TILES]
