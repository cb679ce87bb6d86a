"""Triton launch settings for NVIDIA Hopper (sm_90, H100/H200: 132 SMs, 228 KB smem per SM).

``kernel_config(path, rows=, heads=, topk=)`` returns a dict (keys: see
``graphattn.kernels.plan``). Measured on an H200 with ``python -m graphattn.bench.kernels
--sweep``; docs/benchmarks.md has the numbers. The heuristics here pick from the small set of
settings in :func:`all_configs`, which the ahead-of-time test compiles for sm_90.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

SM90_SMS = 132
# Split-KV: small batches need many programs to fill the 132 SMs. flashmla's
# separate combine loads all splits of a head at once, so it can afford many splits; its
# workspace is capped at 2 MB per row (splits x heads x 2 KB). trtllm's last program merges
# the splits one after the other, so it keeps fewer, longer splits.
WORKSPACE_BYTES_PER_ROW = 2 << 20
# flashmla at rows <= 8 asks for two programs per SM (more, shorter splits): measured 32.8 ->
# 28.6 us at 64 heads x 8 rows; at 64 rows the same target was slower (135.6 -> 176.0 us), so
# larger batches keep one per SM. The target never grows with rows, so neither do the splits.
SMALL_BATCH_ROWS = 8


def _split_host(path: str, heads: int, rows: int) -> dict[str, Any]:
    if path == "flashmla":
        cap = max(1, min(32, WORKSPACE_BYTES_PER_ROW // (heads * 512 * 4)))
        target = 2 * SM90_SMS if rows <= SMALL_BATCH_ROWS else SM90_SMS
        return {"max_splits": cap, "min_split_blocks": 1, "target_programs": target}
    return {"max_splits": 8, "min_split_blocks": 2, "target_programs": SM90_SMS}


# heads above the first item use the second: (BLOCK_H, BLOCK_N, num_warps, num_stages, IDX_AHEAD).
# IDX_AHEAD 1 with 3 stages (index tile loaded one iteration ahead, KV gather pipelined one
# tile ahead): 64 heads x 64 rows 140.2 -> 121.1 us, 128 x 64 255.4 -> 216.7, 64 x 512
# 983.7 -> 849.0, flashmla 64 x 8 28.5 -> 26.9 (3 stages alone: 149.1 / 259.8 / 1023.2).
_TILES = (
    (16, (16, 64, 4, 2, 0)),
    (1 << 30, (32, 32, 4, 3, 1)),
)
_COMBINE = {"num_warps": 4, "num_stages": 1}
_PATHS = ("flashmla", "trtllm", "mega", "flashmla_combine")
_OVERRIDES: dict[str, dict[str, Any]] = {}


def _tiles(heads: int) -> dict[str, Any]:
    for max_heads, (bh, bn, warps, stages, ahead) in _TILES:
        if heads <= max_heads:
            return {"BLOCK_H": bh, "BLOCK_N": bn, "IDX_AHEAD": ahead, "num_warps": warps, "num_stages": stages}
    raise AssertionError("unreachable: the last _TILES row covers every head count")


def kernel_config(path: str, rows: int = 1, heads: int = 64, topk: int = 2048) -> dict[str, Any]:
    """Launch settings for kernel ``path`` at ``rows x heads x topk`` on sm_90."""
    if path not in _PATHS:
        raise ValueError(f"Unknown kernel path: {path!r}. Valid options are: {', '.join(_PATHS)}")
    if path == "flashmla_combine":
        cfg = dict(_COMBINE)
    elif path == "mega":
        cfg = _tiles(heads)
    else:
        cfg = {**_tiles(heads), **_split_host(path, heads, rows)}
    cfg.update(_OVERRIDES.get(path, {}))
    return cfg


def all_configs(path: str) -> list[dict[str, Any]]:
    """Every distinct setting :func:`kernel_config` can return for ``path`` (host keys dropped)."""
    if path == "flashmla_combine":
        return [dict(_COMBINE)]
    return [_tiles(max_heads) for max_heads, _ in _TILES]


@contextlib.contextmanager
def override(path: str, **cfg: Any) -> Iterator[None]:
    """Temporarily replace keys of ``path``'s config (the benchmark's ``--sweep`` uses it)."""
    old = _OVERRIDES.get(path)
    _OVERRIDES[path] = {**(old or {}), **cfg}
    try:
        yield
    finally:
        if old is None:
            _OVERRIDES.pop(path, None)
        else:
            _OVERRIDES[path] = old
