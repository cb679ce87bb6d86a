"""Split-KV planning shared by the kernel launchers: how many splits, and the workspace bound.

A launch config (from ``platform.kernel_config(path, rows=, heads=, topk=)``) is a
dict: upper-case keys are kernel constexprs (``BLOCK_H``, ``BLOCK_N``), lower-case keys are
Triton launch options (``num_warps``, ``num_stages``, and on AMD ``waves_per_eu``,
``matrix_instr_nonkdim``, ``kpack``), and the host-only keys in :data:`HOST_KEYS` steer the
split choice (and ``kernel`` names the function: one of flashmla's Gluon kernels on
sm_90, absent for the Triton kernels) and never reach Triton.

Every function takes an optional ``platform`` (a backend passes its own, so a backend built
with another platform object plans with that platform's launch table and compute units);
``None`` means ``current_platform()``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..common.kv_layout import fp8_kernel_code
from ..common.metadata import D_V
from ..common.platform import KERNEL_PATHS, Platform, current_platform

PATHS = KERNEL_PATHS
# Host-side planning keys of a config: never passed to Triton.
HOST_KEYS = ("max_splits", "min_split_blocks", "target_programs", "split_cost_blocks", "kernel", "cluster_merge",
             "cluster_min_fill", "partial_native", "fp8_ring", "ring_max_tiles", "fp8_raw_tile",
             "idx_early_min_heads",
             "pdl_max_programs", "pdl_hold_smem", "native_runs", "combine_heads")
# The smallest BLOCK_H any config may use (tl.dot needs M >= 16); counters are sized for it.
MIN_BLOCK_H = 16
# KV-loop constexprs of the attention kernels that a config may leave out (see _attend_range).
LOOP_DEFAULTS = {"IDX_AHEAD": 0, "KV_MAJOR": 0}


class SplitPlan(NamedTuple):
    """The largest split-KV resources a path may use at given sizes (size metadata with it).

    num_splits: the most split partials one row may use, at any row count (0: no workspace).
    counter_cols: multi-CTA counters per row (0: no counter); one per head block.
    workspace_heads: heads per partial (0 when there is no workspace).
    max_partials: the most partials one launch writes, over every row count (``rows x splits``
        where it splits; 0: no workspace). The workspace is a pool of this many partials that
        serves every row count, so it does not grow with the batch: more rows, fewer splits.
    """

    num_splits: int
    counter_cols: int
    workspace_heads: int
    max_partials: int

    def metadata_kwargs(self) -> dict[str, int]:
        """``GraphMetadata`` keyword arguments that size the counter and the workspace pool."""
        return {"counter_cols": self.counter_cols, "num_splits": self.num_splits,
                "workspace_heads": self.workspace_heads, "workspace_partials": self.max_partials}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def empty_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised ``out [rows, H, 512]`` in q's dtype and ``lse [rows, H]`` f32 on q's device
    (fake tensors under a fake mode, so the ops and their fake implementations share it)."""
    rows, heads = q.shape[0], q.shape[1]
    return q.new_empty(rows, heads, D_V), q.new_empty(rows, heads, dtype=torch.float32)


def launch_parts(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a config into ``(constexprs, triton_launch_options)``; host keys are dropped."""
    meta = {k: v for k, v in cfg.items() if k.isupper()}
    opts = {k: v for k, v in cfg.items() if not k.isupper() and k not in HOST_KEYS}
    return meta, opts


def path_config(path: str, rows: int, heads: int, topk: int, platform: Platform | None = None,
                kv_fp8: bool = False) -> dict[str, Any]:
    """The platform's launch config for ``path`` (checked for the keys the launchers need);
    ``kv_fp8``: for 656-byte FP8 kv tokens (asked only then, so a launch table written before
    FP8 KV keeps working for plain kv).

    The Triton attention kernels get :data:`LOOP_DEFAULTS` for the KV-loop constexprs the
    config leaves out (the Gluon kernel has no such constexprs).
    """
    shape: dict[str, Any] = {"rows": rows, "heads": heads, "topk": topk}
    if kv_fp8:
        shape["kv_fp8"] = True
    cfg = (platform or current_platform()).kernel_config(path, **shape)
    if path.endswith("combine"):
        assert "num_warps" in cfg, f"kernel_config({path!r}) lacks num_warps: {cfg}"
        return cfg
    missing = [k for k in ("BLOCK_H", "BLOCK_N", "num_warps") if k not in cfg]
    assert not missing, f"kernel_config({path!r}) lacks {missing}: {cfg}"
    assert cfg["BLOCK_H"] >= MIN_BLOCK_H, f"BLOCK_H below {MIN_BLOCK_H} in {cfg}"
    return cfg if "kernel" in cfg else {**LOOP_DEFAULTS, **cfg}  # a Gluon kernel: no loop constexprs


def kv_fp8_constexpr(platform: Any, kv_fp8: bool) -> int:
    """The attention kernels' ``KV_FP8`` constexpr: 0 for kv in q's dtype, else the code of the
    platform's FP8 format (``graphattn.common.kv_layout.FP8_KERNEL_CODES``) for 656-byte tokens."""
    return fp8_kernel_code(platform.fp8_dtype) if kv_fp8 else 0


def _target_programs(cfg: dict[str, Any], platform: Platform | None) -> int:
    return cfg.get("target_programs") or (platform or current_platform()).num_compute_units()


def choose_splits(rows: int, heads: int, topk: int, cfg: dict[str, Any], platform: Platform | None = None) -> int:
    """Split count for a launch: enough programs to fill the device, bounded by the config.

    Each split covers at least ``min_split_blocks`` KV blocks of ``BLOCK_N`` so that writing a
    partial (``BLOCK_H x 512`` f32) stays small next to the KV it read. At most
    ``cdiv(target_programs, programs)`` splits, so the count never increases with rows.

    With ``split_cost_blocks`` in the config (kernels that run one program per SM, where a
    partial last wave costs a whole wave) the count within that bound is the one with the least
    ``waves x (blocks per split + split_cost_blocks)``: the extra term is a split's fixed work
    (its q load, its partial) in KV blocks; ties go to fewer splits. 64 programs on 132 SMs then
    take 2 splits (one wave of 128), not 3 (192 programs, two waves).
    """
    blocks = cdiv(max(topk, 1), cfg["BLOCK_N"])
    cap = max(1, min(cfg.get("max_splits", 1), blocks // max(1, cfg.get("min_split_blocks", 1))))
    programs = max(1, rows * cdiv(heads, cfg["BLOCK_H"]))  # rows = 0 launches nothing
    target = _target_programs(cfg, platform)
    most = max(1, min(cap, cdiv(target, programs)))
    if "split_cost_blocks" not in cfg:
        return most
    return min(range(1, most + 1),
               key=lambda s: cdiv(programs * s, target) * (cdiv(blocks, s) + cfg["split_cost_blocks"]))


def split_plan(path: str, num_heads: int, topk: int, platform: Platform | None = None,
               kv_fp8: bool = False) -> SplitPlan:
    """The maximum workspace and counter ``path`` may use for ``num_heads`` and ``topk``.

    Args:
        path: ``"flashmla"``, ``"trtllm"`` or ``"mega"``.
        num_heads: heads of q (every path reads q unpadded).
        topk: indices per row.
        platform: whose launch table and compute units (default ``current_platform()``).
        kv_fp8: kv is 656-byte FP8 tokens (whose launch settings may split differently).

    Returns:
        :class:`SplitPlan`; pass ``GraphMetadata(..., **plan.metadata_kwargs())``. At call time
        a path uses at most the splits the workspace holds.
    """
    if path not in PATHS:
        raise ValueError(f"Unknown kernel path: {path!r}. Valid options are: {', '.join(PATHS)}")
    if num_heads < 1 or topk < 1:
        raise ValueError(f"split_plan: num_heads and topk must be >= 1, got {num_heads}, {topk}")
    if path == "mega":
        return SplitPlan(0, 0, 0, 0)
    most_splits, partials, rows = 1, 0, 1
    while True:
        cfg = path_config(path, rows, num_heads, topk, platform, kv_fp8)
        splits = choose_splits(rows, num_heads, topk, cfg, platform)
        # Not always at 1 row: the tile (and so the split granularity) may change with rows.
        most_splits = max(most_splits, splits)
        if splits > 1:
            partials = max(partials, rows * splits)
        # Past ``target_programs`` rows every head block of every row is already a program:
        # one split from here on (the target never grows with rows), so no workspace is used.
        if rows >= _target_programs(cfg, platform):
            break
        rows += 1
    counter_cols = cdiv(num_heads, MIN_BLOCK_H) if path == "trtllm" else 0
    return SplitPlan(most_splits, counter_cols, num_heads, partials)


def usable_splits(rows: int, heads: int, topk: int, cfg: dict[str, Any], ws_splits: int,
                  platform: Platform | None = None) -> int:
    """Splits a launch uses: :func:`choose_splits`, at most the ``ws_splits`` the workspace
    holds per row, at least 1 (one split writes ``out`` directly and needs no workspace)."""
    return max(1, min(choose_splits(rows, heads, topk, cfg, platform), ws_splits))


def split_layout(rows: int, heads: int, topk: int, cfg: dict[str, Any], ws_splits: int,
                 platform: Platform | None = None) -> tuple[int, int]:
    """``(splits, split_len)`` of a launch: :func:`usable_splits`, with ``split_len`` a multiple
    of ``BLOCK_N``. Rounding it up can leave trailing splits empty; they are dropped, so every
    launched split has work (trtllm's last arrival waits for exactly ``splits`` programs)."""
    splits = usable_splits(rows, heads, topk, cfg, ws_splits, platform)
    split_len = cdiv(cdiv(topk, splits), cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    return cdiv(topk, split_len), split_len
