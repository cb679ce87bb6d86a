"""Plan audit: every launch a forward would make fits in the GraphMetadata that
``make_metadata`` reserved, on every platform launch table, checked on the host (no GPU, no launch).

What it checks
--------------
A Triton backend reserves everything a forward may use before any CUDA-graph capture
(``TritonBackend.make_metadata``: the index table, trtllm's counter, and the split-KV workspace, a
fixed pool of partials sized by ``graphattn.kernels.split_plan``). A later forward plans its launch
from the platform's launch table (``graphattn/cuda/configs.py``, ``graphattn/hip/configs.py``,
``graphattn/common/interpreter_configs.py``) and the kernels' planners; nothing on the device
checks that the kernels stay inside those buffers, and the direct bound call skips the custom ops'
input checks (it has its own room check only). For every platform table (H200, H20 and H100 sm_90,
sm_90 without Gluon, A100, L40S, B200, AMD gfx942 and gfx950, the CPU interpreter), every Triton
backend (flashmla, trtllm, flashmla_mega, dispatch and each path dispatch may pick), kv in q's
dtype and 656-byte FP8 tokens, and a grid of head counts, top-k, reserved rows and row counts (0,
around every tile and split threshold, and oversized eager steps above the reserved rows after
capture), the audit takes the ``LaunchPlan`` the forward would use, from graphattn's own code:

* the direct bound call: ``backend.launch_plan(md, rows, aligned)`` and the views
  ``backend._fixed_args(md, rows, plan.workspace_splits, spec)`` (q and kv 16-byte aligned or not);
* the custom op (under a capture, ``torch.compile`` or a dispatch mode): the views
  ``_fixed_args(md, rows, None, spec)`` (all the pool holds at ``rows``) and the plan the op makes
  from them (``plan_flashmla`` / ``plan_trtllm`` / ``plan_mega`` with the backend's platform);

and checks that

1. the launch is consistent: grid = rows x splits x head blocks, a cluster of two CTAs only for
   two splits, ``DIRECT`` exactly when one split, no empty last split, the accumulator-order
   store only with 64-head tiles and heads a multiple of 16, the combine launch matching the
   store's layout (``PARTIAL_NATIVE`` / ``PARTIAL_16``), holding every split (``BLOCK_S``) and
   covering exactly the rows and head blocks;
2. every element each kernel indexes in the metadata's buffers lies inside the view it is
   passed, and so inside the storage behind it: the index table, trtllm's counter, the
   workspace partials and lse written by the split kernel (head-major, in the sm_90 kernels'
   accumulator order in f32 or in q's 16-bit dtype, or the cluster merge's hand-over) and read by
   the combine (head-major with one or several heads a program, or accumulator order with 1-8
   runs a program) or by trtllm's last-arriving program;
3. graphattn's own checks accept the views: ``TritonBackend._check_room`` (the bound call's) and
   ``graphattn.kernels.checks.check_workspace`` / ``check_counter`` (the custom ops'), and the
   workspace heads hold every head the launch writes.

It also reports, per platform, the largest fraction of the reserved pool partials and counter
columns any launch needs (1.000: the reservation is exactly tight somewhere, never short).

The model of the kernels' index arithmetic is :func:`model_launch` and the helpers above it,
each with the kernel function (file:function) it restates. It is evaluated at the extreme
program ids (the first program, and the last row, split and head block, each head block apart
where the block's size changes its layout) and the extreme unmasked lanes; with non-negative
strides (the metadata's views have them) an access's offsets grow with each of row, split, head
block and lane, so those corners bound every program's. tests/test_plan_audit.py checks the model
against the kernels where a CPU can: the accumulator-order store and its combine cover exactly
``[0, R * 512)`` of a head block's partial and agree on every element's head and column, the
model's offset expressions and program-id decodings equal the kernels' own (evaluated from
their source), and the Triton kernels run under the interpreter write exactly the workspace
elements the model predicts. The metadata is made on the ``meta`` device (shapes, strides and
storage sizes, no memory); the split plans are memoised for the run.

Run
---
From the repository root, with graphattn importable (``PYTHONPATH=.`` or an installed venv)::

    python scripts/plan_audit.py                  # the full grid: 16.5 M plan checks, ~20 min a core
    python scripts/plan_audit.py --quick          # a small grid, seconds
    python scripts/plan_audit.py --jobs 8         # platforms in parallel processes
    python scripts/plan_audit.py --h200-all-heads # the H200 table, heads 1..300
    python scripts/plan_audit.py --dense-rows     # the sm_90 tables, every row count 0..700
    python scripts/plan_audit.py --regression     # graphattn.testing.fuzz.REGRESSION_SHAPES
    python scripts/plan_audit.py --platforms H200,gfx942 --backends trtllm --kv fp8

It exits 1 if any launch needs more than was reserved (each listed with its configuration), else 0.
Run it after changing launch settings (``graphattn/cuda/configs.py`` and the other tables) or a
kernel's planner; ``tests/test_plan_audit.py`` runs a reduced grid on every CPU test run.

What it found
-------------
On commit b0eaff3 (2026-12-05; ``--jobs 2`` on a shared two-core machine), nothing:

* the full grid (10 platform tables x 4 backends x 2 kv dtypes x 34 head counts x 16 top-k x 2
  reserved row counts x 38 row counts, q aligned and not): 8,268,800 bound-call and 8,268,800 op
  plans on 87,040 metadata, no mismatch (698 s);
* ``--h200-all-heads``: 2,352,000 + 2,352,000 plans, none (220 s); ``--dense-rows``: 5,495,840 +
  5,495,840, none (413 s); ``--regression``: 496,800 + 496,800, none (26 s).

The reservation is exact, not generous: on every platform some launch uses every partial of the
pool (e.g. the H200's flashmla, 1 head x top-k 65 x 66 rows: 132 of 132) and every counter column.
Fault injection (a workspace view one split short, a counter with a column per 64 heads, workspace
heads one short, metadata sized for fewer heads) is reported as accesses outside the views and, for
the short reservations, past the storage (tests/test_plan_audit.py). The review this audit came
from also found that ``check_workspace`` accepted workspaces whose heads overlap (``expand``) or
are permuted, which the sm_90 accumulator-order store would overrun, and that the bound call
accepted hand-made metadata smaller than its launch: both are refused since b0eaff3
(``checks._dense_blocks``, ``TritonBackend._check_room``), and the audit runs both checks on every
view it audits.
"""

from __future__ import annotations

import graphattn.kernels  # noqa: F401  (first: Triton imported in the interpreter's mode where there is no GPU)

import argparse
import collections
import concurrent.futures
import contextlib
import functools
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence, TextIO

import torch

import graphattn.backends._triton as triton_backends
import graphattn.cuda.configs as cuda_configs
from graphattn.backends.dispatch import DispatchBackend
from graphattn.backends.flashmla import FlashMLABackend
from graphattn.backends.flashmla_mega import FlashMLAMegaBackend
from graphattn.backends.trtllm import TrtllmBackend
from graphattn.common.metadata import D_QK, D_V, GraphMetadata
from graphattn.common.platform import CpuPlatform, DeviceFacts, Platform
from graphattn.cuda.platform import CudaPlatform
from graphattn.hip.platform import HipPlatform
from graphattn.kernels import checks
from graphattn.kernels import flashmla as kflashmla
from graphattn.kernels import mega as kmega
from graphattn.kernels import plan as kplan
from graphattn.kernels import trtllm as ktrtllm
from graphattn.kernels.launch import LaunchPlan, clear_launch_plans

# ----------------------------------------------------------------------------------------------
# Platforms: each launch table, made as the tests make them (tests/test_fuzz.py).


def _nvidia(name: str, sms: int, capability: tuple[int, int]) -> Platform:
    return CudaPlatform(DeviceFacts("nvidia", name, sms, capability=capability), device="cuda:0")


def _amd(name: str, cus: int, arch: str) -> Platform:
    return HipPlatform(DeviceFacts("amd", name, cus, gfx_arch=arch), device="cuda:0")


# name -> (factory, Gluon available): "no-Gluon sm_90" is the H200 table on a Triton without the
# Gluon Hopper dialect (the Triton kernels only). --platforms selects by a name's first word, else
# by a substring of the names ("sm_90": all four sm_90 tables).
PLATFORMS: dict[str, tuple[Callable[[], Platform], bool]] = {
    "H200 sm_90 (132 SMs)": (lambda: _nvidia("H200", 132, (9, 0)), True),
    "H20 sm_90 (78 SMs)": (lambda: _nvidia("H20", 78, (9, 0)), True),
    "H100-PCIe sm_90 (114 SMs)": (lambda: _nvidia("H100", 114, (9, 0)), True),
    "no-Gluon sm_90 (132 SMs)": (lambda: _nvidia("H200", 132, (9, 0)), False),
    "A100 sm_80": (lambda: _nvidia("A100", 108, (8, 0)), True),
    "L40S sm_89": (lambda: _nvidia("L40S", 142, (8, 9)), True),
    "B200 sm_100": (lambda: _nvidia("B200", 148, (10, 0)), True),
    "gfx942 MI300X": (lambda: _amd("MI300X", 304, "gfx942"), True),
    "gfx950 MI355": (lambda: _amd("MI355", 256, "gfx950"), True),
    "interpreter (CPU)": (lambda: CpuPlatform(), True),
}
H200 = "H200 sm_90 (132 SMs)"

BACKENDS: dict[str, type] = {"flashmla": FlashMLABackend, "trtllm": TrtllmBackend,
                             "flashmla_mega": FlashMLAMegaBackend, "dispatch": DispatchBackend}
KV_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class Grid:
    """The shapes audited: every combination of these (rows for each reserved row count)."""

    heads: tuple[int, ...]
    topks: tuple[int, ...]
    rows: tuple[int, ...]
    max_rows: tuple[int, ...]


# Heads around each head-tile size (16, 32, 64) and the accumulator-order store's rules (a
# multiple of 16 above 16; partly-masked blocks of 16 and 48 heads: 80, 112, 272); top-k around
# the KV tiles (16-128), the split thresholds and the largest; rows around the split and
# workspace-pool thresholds (the pools hold 62-510 partials), with 1000-5000 above both reserved
# row counts (oversized eager steps) and above every pool (one split, no workspace).
FULL = Grid(
    heads=(1, 2, 3, 5, 8, 13, 15, 16, 17, 20, 24, 31, 32, 33, 47, 48, 63, 64, 65, 80, 96, 100, 112,
           127, 128, 129, 144, 160, 192, 255, 256, 257, 272, 300),
    topks=(1, 2, 16, 63, 64, 65, 127, 128, 129, 2047, 2048, 2049, 2077, 8192, 32768, 65536),
    rows=(0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 22, 23, 24, 28, 33, 44, 45, 63, 64, 65, 66, 127, 128, 131, 132,
          133, 255, 256, 257, 264, 265, 304, 305, 511, 512, 1000, 4096, 5000),
    max_rows=(8, 512),
)
QUICK = Grid(heads=(1, 17, 64, 65, 128), topks=(64, 2048, 65536), rows=(0, 1, 8, 64, 133, 5000), max_rows=(8, 512))
H200_ALL_HEADS = Grid(
    heads=tuple(range(1, 301)),
    topks=(1, 2, 63, 64, 65, 127, 128, 2047, 2048, 2049, 2077, 8192, 32768, 65536),
    rows=(0, 1, 2, 3, 7, 8, 9, 22, 24, 28, 33, 45, 63, 64, 65, 66, 127, 128, 131, 132, 133, 255, 256, 257,
          511, 512, 1000, 4096),
    max_rows=(512,),
)
DENSE_ROWS = Grid(heads=(1, 13, 16, 17, 32, 33, 48, 64, 65, 96, 128, 129, 256, 300),
                  topks=(64, 200, 1100, 2048, 2077, 8192, 65536), rows=tuple(range(701)), max_rows=(300,))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------------------------
# The kernels' index arithmetic.
#
# Offsets are in elements of the buffer's dtype. An access is (what, view, lo, hi): elements
# [lo, hi) of the storage behind ``view`` (relative to the storage's start, as storage_offset()
# is), the smallest and one past the largest element the kernels touch through that pointer.

# The sm_90 accumulator-order partial (PARTIAL_NATIVE), graphattn/kernels/wgmma_ws.py:_store_partial
# (wgmma_rr stores through the same function, via wgmma_ws.py:_finish). A head block of R heads (R =
# min(64, H - 64 hb), a multiple of 16) is one run of R * 512 elements from the block's first head,
# head-major element (hb * 64 + m, column) being consumer WG's (m, n), column = WG * 256 + n.
NATIVE_BLOCK_H = 64
HALF = D_V // 2  # each of the two consumer warpgroups holds 256 output columns


def native_store_offset(m: int, n: int, R: int, WG: int) -> int:
    """wgmma_ws.py:_store_partial, NATIVE: the element (from the block's first element) where
    consumer ``WG`` stores its accumulator's row ``m`` (< R), column ``n`` (< 256):
    ``WG * R * HALF + off_m + off_n``; a run of 8 columns is [R, 8], the rows ``m % 16 < 8``
    of every warp, then the rows >= 8."""
    off_m = (m // 16) * 64 + ((m % 16) // 8) * (R * 4) + (m % 8) * 8
    off_n = (n // 8) * (R * 8) + n % 8
    return WG * R * HALF + off_m + off_n


def native_head(k: int, R: int) -> int:
    """wgmma_combine.py:_native_head: the head (within its block of R) of row ``k`` of a run."""
    half = R // 2
    upper = k >= half
    kk = k - half if upper else k
    return (kk // 8) * 16 + int(upper) * 8 + kk % 8


def native_combine_offset(g: int, k: int, c: int, R: int) -> int:
    """wgmma_combine.py:_flashmla_combine_native_kernel: the element (from the block's first element of
    a split) its program of first run ``g`` loads for row ``k`` (< R) and column ``c`` (< 8 RUNS):
    ``g * 8 * R + k * 8 + c_run``, ``c_run = (c // 8) * (8 * R) + c % 8``; it holds head
    ``native_head(k, R)``, column ``8 g + c``."""
    c_run = (c // 8) * (8 * R) + c % 8
    return g * 8 * R + k * 8 + c_run


def native_block_base(row: int, split: int, hb: int, ws_strides: Sequence[int], wide: int) -> int:
    """wgmma_ws.py:_store_partial and _flashmla_combine_native_kernel: where head block ``hb``'s run
    of (row, split) starts, in elements of the destination (``wide`` = 2: q's 16-bit dtype through
    a pointer cast of the f32 workspace, ``PARTIAL_NATIVE=2`` / ``PARTIAL_16``, else 1):
    ``wide * (row * stride_wr + split * stride_ws + hb * 64 * stride_wh)``."""
    return wide * (row * ws_strides[0] + split * ws_strides[1] + hb * NATIVE_BLOCK_H * ws_strides[2])


@functools.cache
def native_store_extent(R: int) -> int:
    """One past the largest element :func:`native_store_offset` reaches for a block of R heads."""
    return max(native_store_offset(m, n, R, WG) for WG in (0, 1) for m in range(R) for n in range(HALF)) + 1


@functools.cache
def native_program_extent(R: int, runs: int) -> int:
    """One past the largest element the native combine's last program of a block (first run
    ``64 - runs``) loads, from the block's first element of a split."""
    g = D_V // 8 - runs
    return max(native_combine_offset(g, k, c, R) for k in range(R) for c in range(8 * runs)) + 1


@functools.cache
def native_head_extent(R: int) -> int:
    """One past the largest head (within its block) the native combine's rows ``k < R`` read."""
    return max(native_head(k, R) for k in range(R)) + 1


def main_program(plan: LaunchPlan, pid: int) -> tuple[int, int, int]:
    """``(row, split, head block)`` of program ``pid`` of the split (first) launch, decoded as the
    kernels do: graphattn/kernels/_core.py:_split_program (flashmla.py:_flashmla_split_kernel,
    trtllm.py:_trtllm_kernel) and wgmma.py:_program_split (the Gluon kernels) put the head block
    fastest, then the split; with ``CLUSTER`` (wgmma.py:_program_split) the split is fastest, so a
    cluster's CTAs are one (row, head block)'s splits; mega.py:_mega_kernel has no split."""
    meta = plan.main.kwargs
    hbk = cdiv(plan.heads, meta["BLOCK_H"])
    cluster = meta.get("CLUSTER") or 0
    if cluster:
        return pid // (cluster * hbk), pid % cluster, (pid // cluster) % hbk
    return pid // (hbk * plan.splits), (pid // hbk) % plan.splits, pid % hbk


def combine_program(plan: LaunchPlan, pid: int) -> tuple[int, int]:
    """``(row, first head)`` of program ``pid`` of flashmla.py:_flashmla_combine_kernel (``HEADS``
    heads a program, default 1): ``row = pid // cdiv(H, HEADS)``, first head ``(pid % cdiv(H,
    HEADS)) * HEADS``."""
    n_hg = cdiv(plan.heads, plan.combine.kwargs.get("HEADS", 1))
    return pid // n_hg, (pid % n_hg) * plan.combine.kwargs.get("HEADS", 1)


def native_combine_program(plan: LaunchPlan, pid: int) -> tuple[int, int, int]:
    """``(row, head block, first run)`` of program ``pid`` of
    wgmma_combine.py:_flashmla_combine_native_kernel: ``PROGRAMS = 64 / RUNS`` programs a head block,
    ``g = (pid % PROGRAMS) * RUNS``, ``hb = (pid // PROGRAMS) % n_hb``, ``row = pid // (PROGRAMS *
    n_hb)`` with ``n_hb = (H + 63) // 64``."""
    runs = plan.combine.kwargs.get("RUNS", 1)
    programs = D_V // 8 // runs
    n_hb = (plan.heads + 63) // 64
    return pid // (programs * n_hb), (pid // programs) % n_hb, (pid % programs) * runs


def model_launch(plan: LaunchPlan, idx: torch.Tensor, counter: torch.Tensor | None,
                 ws_out: torch.Tensor | None, ws_lse: torch.Tensor | None) -> tuple[list[str], list[tuple], dict]:
    """The launch ``plan`` makes over these views: ``(problems, accesses, need)``.

    ``problems``: inconsistencies of the launch itself (point 1 of the module docstring);
    ``accesses``: ``(what, view, lo, hi)``, what the kernels index through each metadata view
    (check them with :func:`check_accesses`); ``need``: what the launch uses of the reservation
    (``partials`` = rows x splits, ``heads``, ``counter_cols``; absent where it uses none).
    """
    p: list[str] = []
    acc: list[tuple] = []
    rows, H, topk, S = plan.rows, plan.heads, plan.topk, plan.splits
    need: dict[str, int] = {}
    meta = plan.main.kwargs
    G = plan.main.grid[0]
    if rows == 0:
        if G != 0 or (plan.combine is not None and plan.combine.grid[0] != 0):
            p.append(f"rows=0 but grids {plan.main.grid}, {plan.combine and plan.combine.grid}")
        return p, acc, need
    BH = meta["BLOCK_H"]
    hbk = cdiv(H, BH)
    cluster = meta.get("CLUSTER") or 0
    mega = plan.spec.name == "mega"
    direct = True if mega else bool(meta["DIRECT"])
    native = meta.get("PARTIAL_NATIVE", 0)

    # -- 1. the launch's shape (the kernels decode program ids as main_program does)
    if plan.head_blocks != hbk:
        p.append(f"plan.head_blocks {plan.head_blocks} != cdiv(H, BLOCK_H) {hbk}")
    if G != rows * S * hbk:
        p.append(f"main grid {G} != rows x splits x head blocks {rows} x {S} x {hbk}")
    elif main_program(plan, G - 1) != (rows - 1, S - 1, hbk - 1):
        p.append(f"main grid's last program decodes to {main_program(plan, G - 1)}, not {(rows - 1, S - 1, hbk - 1)}")
    if cluster and native:
        p.append("CLUSTER and PARTIAL_NATIVE together (the cluster merge hands over head-major halves)")
    if cluster and (cluster != 2 or S != 2):
        p.append(f"CLUSTER={cluster} with {S} splits (wgmma_ws.py:_flashmla_ws_kernel: clusters merge two splits)")
    if direct != (S == 1):
        p.append(f"DIRECT={direct} with {S} splits")
    if plan.kernel in ("wgmma_ws", "wgmma_rr") and BH != NATIVE_BLOCK_H:
        p.append(f"{plan.kernel} with BLOCK_H {BH}")
    if plan.kernel == "wgmma_tn" and BH not in (16, 32):
        p.append(f"wgmma_tn with BLOCK_H {BH}")
    if S > 1 and plan.split_len * (S - 1) >= topk:
        p.append(f"empty last split: split_len {plan.split_len} x {S} splits for topk {topk}")
    if not mega and plan.split_len * S < topk:
        p.append(f"splits {S} x split_len {plan.split_len} leave indices of topk {topk} unread")

    # -- 2. the index table: every split kernel reads idx_ptr + row * stride_ir + col, col in
    # [split * split_len, min(start + split_len, topk)) (_core.py:_split_program/_tile_indices,
    # wgmma.py:_load_indices, mega.py:_mega_kernel: [0, topk)); the column is added unscaled.
    if idx.stride(-1) != 1:
        p.append(f"index table column stride {idx.stride(-1)} (the kernels add the column unscaled)")
    last_end = topk if mega else min((S - 1) * plan.split_len + plan.split_len, topk)
    acc.append(("indices", idx, idx.storage_offset(), idx.storage_offset() + (rows - 1) * idx.stride(0) + last_end))
    if mega or direct:
        return p, acc, need  # out/lse are the call's own tensors, not the metadata's

    # -- the split partials
    if ws_out is None or ws_lse is None:
        p.append(f"{S} splits but no workspace passed")
        return p, acc, need
    need.update(partials=rows * S, heads=H)
    s0, s1, s2, s3 = ws_out.stride()
    l0, l1, l2 = ws_lse.stride()
    if s3 != 1 or l2 != 1:
        p.append(f"workspace last-dim strides {s3}/{l2} (the kernels add the column and head unscaled)")
    wo, wl = ws_out.storage_offset(), ws_lse.storage_offset()
    r, s = rows - 1, S - 1  # the last row and split (main_program(plan, G - 1))
    if native:
        # wgmma_ws.py:_store_partial NATIVE: block hb's run starts at wide * (row * stride_wr +
        # split * stride_ws + hb * 64 * stride_wh) of the (16-bit with NATIVE=2) destination
        # pointer; in f32 elements of ws_out the run is half as long with NATIVE=2.
        if H % 16 or H <= 16:
            p.append(f"PARTIAL_NATIVE with H={H} (flashmla.py:_plan: a multiple of 16 above 16)")
        if BH != NATIVE_BLOCK_H:
            p.append(f"PARTIAL_NATIVE with BLOCK_H {BH} (the order of a [64, 256] accumulator)")
        wide = 2 if native == 2 else 1
        strides = (s0, s1, s2)
        hi = max(cdiv(wide * wo + native_block_base(r, s, hb, strides, wide)
                      + native_store_extent(min(64, H - 64 * hb)), wide) for hb in range(hbk))
        acc.append((f"ws_out partials (accumulator order, PARTIAL_NATIVE={native})", ws_out, wo, hi))
    else:
        # _core.py:_store_partial, wgmma_tn.py:_store_out_t, wgmma_ws.py:_store_partial (NATIVE=0):
        # ws_out + row * stride_wr + split * stride_ws + h * stride_wh + d, h < H, d < 512; with
        # CLUSTER=2, wgmma_ws.py:_producer_merge stores and _merge_pair reads the same elements of
        # splits 0 and 1 (one half of the columns each way).
        what = "ws_out partials (head-major" + (", cluster merge)" if cluster else ")")
        acc.append((what, ws_out, wo, wo + r * s0 + s * s1 + (H - 1) * s2 + D_V))
    # the split lse's, head-major for every kernel: ws_lse + row * stride_lr + split * stride_ls + h
    acc.append(("ws_lse partials", ws_lse, wl, wl + r * l0 + s * l1 + H))

    if plan.spec.name == "trtllm":
        # trtllm.py:_trtllm_kernel: counter_ptr + row * stride_cr + hb; the last program to arrive
        # reads every split's partial (_core.py:_combine_splits, s < num_splits: the elements above)
        need["counter_cols"] = hbk
        if counter is None:
            p.append("trtllm launch with splits but no counter")
        else:
            if counter.stride(-1) != 1:
                p.append(f"counter column stride {counter.stride(-1)} (the kernel adds the head block unscaled)")
            co = counter.storage_offset()
            acc.append(("counter", counter, co, co + r * counter.stride(0) + hbk))
        if plan.combine is not None:
            p.append("trtllm plans a combine launch")
        return p, acc, need

    # -- flashmla's combine launch (none when a cluster of two merged the splits in the kernel)
    c = plan.combine
    if (not cluster) != (c is not None):
        p.append(f"combine launch {c is not None} with {S} splits, CLUSTER={cluster}")
    if c is None:
        return p, acc, need
    ck = c.kwargs
    Gc = c.grid[0]
    block_s = ck["BLOCK_S"]
    if block_s < S:
        p.append(f"combine BLOCK_S {block_s} < {S} splits (the combine masks s < num_splits within BLOCK_S)")
    if c.name == kflashmla.NATIVE_COMBINE[1]:
        runs = ck.get("RUNS", 1)
        if not native:
            p.append("the accumulator-order combine over head-major partials")
        if bool(ck.get("PARTIAL_16")) != (native == 2):
            p.append(f"combine PARTIAL_16={ck.get('PARTIAL_16')} but the store's PARTIAL_NATIVE={native}")
        if block_s > 32 or (D_V // 8) % runs or ck.get("num_warps") != 4 * runs or runs > 8:
            p.append(f"native combine BLOCK_S {block_s}, RUNS {runs}, num_warps {ck.get('num_warps')}")
        n_hb = (H + 63) // 64
        programs = D_V // 8 // runs
        if Gc != rows * n_hb * programs:
            p.append(f"native combine grid {Gc} != rows x cdiv(H, 64) x 64 / RUNS")
        elif native_combine_program(plan, Gc - 1) != (r, n_hb - 1, D_V // 8 - runs):
            p.append(f"native combine's last program decodes to {native_combine_program(plan, Gc - 1)}")
        # wgmma_combine.py:_flashmla_combine_native_kernel: run = ws_out (16-bit view with PARTIAL_16)
        # + wide * (row * stride_wr + hb * 64 * stride_wh) + g * 8 * R, loading run + wide * s *
        # stride_ws + k * 8 + c_run (k < R, s < num_splits); the lse's at ws_lse + row * stride_lr +
        # s * stride_ls + hb * 64 + native_head(k, R). The last program of each head block of the
        # last row, at the last split:
        wide = 2 if ck.get("PARTIAL_16") else 1
        strides = (s0, s1, s2)
        hi = max(cdiv(wide * wo + native_block_base(r, s, hb, strides, wide)
                      + native_program_extent(min(64, H - 64 * hb), runs), wide) for hb in range(n_hb))
        acc.append(("ws_out reads of the accumulator-order combine", ws_out, wo, hi))
        h_end = (n_hb - 1) * 64 + native_head_extent(min(64, H - 64 * (n_hb - 1)))
        acc.append(("ws_lse reads of the accumulator-order combine", ws_lse, wl, wl + r * l0 + s * l1 + h_end))
    else:
        # flashmla.py:_flashmla_combine_kernel: ws_out + row * stride_wr + s * stride_ws + h *
        # stride_wh + d and ws_lse + row * stride_lr + s * stride_ls + h, s < num_splits, h < H.
        if native:
            p.append("the head-major combine over accumulator-order partials")
        group = ck.get("HEADS", 1)
        if Gc != rows * cdiv(H, group):
            p.append(f"combine grid {Gc} != rows x cdiv(H, HEADS={group})")
        elif combine_program(plan, Gc - 1)[0] != r:
            p.append(f"combine's last program decodes to row {combine_program(plan, Gc - 1)[0]}")
        if ck.get("num_warps", 4) > 32:
            p.append(f"combine num_warps {ck.get('num_warps')}")
        h_last = min(combine_program(plan, Gc - 1)[1] + group, H) - 1
        acc.append(("ws_out reads of the combine", ws_out, wo, wo + r * s0 + s * s1 + h_last * s2 + D_V))
        acc.append(("ws_lse reads of the combine", ws_lse, wl, wl + r * l0 + s * l1 + h_last + 1))
    return p, acc, need


def _storage_elems(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def _view_end(t: torch.Tensor) -> int:
    """One past the largest storage element ``t``'s own elements reach."""
    if t.numel() == 0:
        return t.storage_offset()
    return t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1


def check_accesses(accesses: list[tuple]) -> list[str]:
    """Each access inside its view (else inside the storage: another launch's part of the pool,
    or beyond the storage: out of bounds)."""
    problems = []
    for what, view, lo, hi in accesses:
        end, storage = _view_end(view), _storage_elems(view)
        if hi > storage:
            problems.append(f"{what}: element {hi - 1} of a storage of {storage} (OUT OF BOUNDS by {hi - storage})")
        elif hi > end or lo < view.storage_offset():
            problems.append(f"{what}: elements [{lo}, {hi}) outside the view's [{view.storage_offset()}, {end}) "
                            "(inside the storage)")
    return problems


def check_launch(plan: LaunchPlan, idx, counter, ws_out, ws_lse) -> tuple[list[str], dict]:
    """:func:`model_launch` and :func:`check_accesses`: ``(problems, need)``."""
    problems, accesses, need = model_launch(plan, idx, counter, ws_out, ws_lse)
    return problems + check_accesses(accesses), need


# ----------------------------------------------------------------------------------------------
# The plans, from graphattn's own code.


def op_plan(backend, path: str, rows: int, aligned: bool, ws_splits: int) -> LaunchPlan:
    """The plan ``torch.ops.graphattn.sparse_mla_<path>`` makes for these arguments
    (flashmla.py:sparse_mla_flashmla, trtllm.py:_check, mega.py:sparse_mla_mega), with the
    backend's platform (on a GPU, ``current_platform()`` is that platform)."""
    pf, H, topk, fp8 = backend.platform, backend.num_heads, backend.topk, backend.kv_fp8
    if path == "flashmla":
        return kflashmla.plan_flashmla(rows, H, topk, ws_splits, aligned, fp8, pf)
    if path == "trtllm":
        return ktrtllm.plan_trtllm(rows, H, topk, ws_splits, fp8, pf)
    return kmega.plan_mega(rows, H, topk, fp8, pf)


@contextlib.contextmanager
def host_only() -> Iterator[None]:
    """Within the block ``make_metadata`` makes its metadata on the ``meta`` device (shapes and
    storage sizes only) and memoises ``split_plan`` (deterministic per arguments)."""
    split_plan, metadata = triton_backends.split_plan, triton_backends.GraphMetadata
    memo = functools.lru_cache(maxsize=None)(kplan.split_plan)
    triton_backends.split_plan = lambda *a, **k: memo(*a, **k)
    triton_backends.GraphMetadata = lambda max_rows, heads, topk, dtype, device, **kw: GraphMetadata(
        max_rows, heads, topk, dtype, "meta", **kw)
    try:
        yield
    finally:
        triton_backends.split_plan, triton_backends.GraphMetadata = split_plan, metadata


@contextlib.contextmanager
def platform_named(name: str) -> Iterator[Platform]:
    """A fresh platform of :data:`PLATFORMS` (Gluon hidden for "no-Gluon sm_90"), with the
    memoised launch plans forgotten before and after."""
    make, gluon = PLATFORMS[name]
    real = cuda_configs.gluon_available
    if not gluon:
        cuda_configs.gluon_available = lambda: False
    clear_launch_plans()
    try:
        yield make()
    finally:
        cuda_configs.gluon_available = real
        clear_launch_plans()


@dataclass
class Report:
    """What an audit checked and found."""

    direct: int = 0  # plans checked as the bound call launches them
    op: int = 0  # plans checked as the custom op launches them
    metadata: int = 0  # metadata audited (backend x reserved rows)
    problems: dict[tuple, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    # (platform, "partials" / "counter_cols") -> (need / reserved, key, need, reserved)
    worst: dict[tuple[str, str], tuple] = field(default_factory=dict)
    # what the plans exercised: kernel names, "splits", "native 1/2", "cluster", "combine runs N",
    # "combine heads N", "counter", "oversized", "no workspace room" ...
    features: collections.Counter = field(default_factory=collections.Counter)

    def merge(self, other: "Report") -> None:
        self.direct += other.direct
        self.op += other.op
        self.metadata += other.metadata
        for k, v in other.problems.items():
            self.problems[k].extend(v)
        for k, v in other.worst.items():
            if v[0] > self.worst.get(k, (-1,))[0]:
                self.worst[k] = v
        self.features.update(other.features)

    @property
    def ok(self) -> bool:
        return not self.problems and self.direct > 0

    def _need(self, platform: str, what: str, need: int, reserved: int, key: tuple) -> None:
        ratio = need / reserved if reserved else float("inf")
        if ratio > self.worst.get((platform, what), (-1,))[0]:
            self.worst[(platform, what)] = (ratio, key, need, reserved)


def _features(plan: LaunchPlan, f: collections.Counter) -> None:
    f[f"{plan.spec.name}:{plan.kernel}"] += 1
    if plan.splits > 1:
        f["splits"] += 1
        if plan.spec.name == "trtllm":
            f["counter"] += 1
    m = plan.main.kwargs
    if m.get("PARTIAL_NATIVE"):
        f[f"native {m['PARTIAL_NATIVE']}"] += 1
        if plan.heads % NATIVE_BLOCK_H:
            f["native short block"] += 1  # the last head block holds 16, 32 or 48 heads
    if m.get("CLUSTER"):
        f["cluster"] += 1
    if plan.combine is not None:
        ck = plan.combine.kwargs
        f["combine"] += 1
        f[f"combine runs {ck['RUNS']}" if "RUNS" in ck else f"combine heads {ck.get('HEADS', 1)}"] += 1
        if ck.get("PDL"):
            f["combine pdl"] += 1


def audit_metadata(backend, md: GraphMetadata, rows_list: Sequence[int], report: Report, where: tuple) -> None:
    """Audit every launch ``backend`` makes on ``md`` for each row count of ``rows_list`` (q and kv
    16-byte aligned and, where the backend's choice depends on it, not), as the bound call and
    as the custom op; problems go to ``report.problems[where + (rows, aligned)]``."""
    platform = where[0]
    backend.check_metadata(md)
    report.metadata += 1
    pool = md.workspace_out.capacity if md.workspace_out is not None else 0
    ws_heads = md.workspace_out.row_shape[0] if md.workspace_out is not None else 0
    counter_cols = md.counter.row_shape[0] if md.counter is not None else 0
    aligns = (True, False) if backend._alignment else (True,)
    dispatch = isinstance(backend, DispatchBackend)
    for rows in rows_list:
        md.refresh_(torch.empty(rows, backend.topk, dtype=torch.int32, device=md.device))
        if md.oversized:
            report.features["oversized"] += 1
        q = torch.empty(rows, backend.num_heads, D_QK, dtype=backend.dtype, device=md.device)
        for aligned in aligns:
            key = where + (rows, aligned)
            plans = [("planned", backend.launch_plan(md, rows, aligned))]
            if dispatch:  # and every other path dispatch may pick at these rows
                ws = md.workspace_splits(rows) if backend.uses_workspace else 0
                plans += [(f"path {path}", plan) for path, build in DispatchBackend._builders.items()
                          if (plan := build(backend, rows, aligned, ws)) != plans[0][1]]
            for label, plan in plans:
                _features(plan, report.features)
                _audit_direct(backend, md, rows, plan, label, report, key, platform, pool, ws_heads, counter_cols)
                _audit_op(backend, md, rows, aligned, q, plan.spec, label, report, key)


def _audit_direct(backend, md, rows, plan, label, report, key, platform, pool, ws_heads, counter_cols) -> None:
    """The launch as the bound call makes it (TritonBackend._new_bound_call)."""
    spec = plan.spec
    report.direct += 1
    problems = []
    try:  # the bound call's views; workspace_for refuses more splits than the pool holds at rows
        args = backend._fixed_args(md, rows, plan.workspace_splits, spec)
    except (ValueError, RuntimeError) as exc:
        report.problems[key].append(f"{label}: _fixed_args refused: {exc}")
        return
    try:
        backend._check_room(plan, args)
    except ValueError as exc:
        problems.append(f"the bound call's room check refused: {exc}")
    counter = args[2] if spec.uses_counter else None
    ws = args[-2:] if spec.uses_workspace else (None, None)
    found, need = check_launch(plan, args[0], counter, *ws)
    problems += found
    if "partials" in need:
        report._need(platform, "partials", need["partials"], pool, key)
        if need["heads"] > ws_heads:
            problems.append(f"writes {need['heads']} heads a partial, the pool's partials hold {ws_heads}")
    if "counter_cols" in need:
        report._need(platform, "counter_cols", need["counter_cols"], counter_cols, key)
    if spec.uses_workspace and rows and md.workspace_splits(rows) == 0:
        report.features["no workspace room"] += 1
    if problems:
        report.problems[key].extend(f"{label} (bound call): {p}" for p in problems)


def _audit_op(backend, md, rows, aligned, q, spec, label, report, key) -> None:
    """The launch as the custom op makes it (TritonBackend.forward under a capture, torch.compile
    or a dispatch mode: spec.op(q, kv, *_fixed_args(md, rows, None, spec)))."""
    report.op += 1
    try:
        args = backend._fixed_args(md, rows, None, spec)
    except (ValueError, RuntimeError) as exc:
        report.problems[key].append(f"{label} (op): _fixed_args refused: {exc}")
        return
    counter = args[2] if spec.uses_counter else None
    ws_out, ws_lse = args[-2:] if spec.uses_workspace else (None, None)
    ws_splits = ws_out.shape[1] if ws_out is not None else 0
    plan = op_plan(backend, spec.name, rows, aligned, ws_splits)
    problems = []
    try:  # the op's own input checks of the metadata's views (kernels/checks.py)
        if ws_out is not None:
            checks.check_workspace(spec.name, q, ws_out, ws_lse)
        if counter is not None:
            checks.check_counter(spec.name, q, counter, plan.head_blocks)
    except (TypeError, ValueError) as exc:
        problems.append(f"the op's checks refused the views: {exc}")
    if plan.splits > max(ws_splits, 1):
        problems.append(f"{plan.splits} splits, the views hold {ws_splits}")
    found, _ = check_launch(plan, args[0], counter, ws_out, ws_lse)
    problems += found
    if problems:
        report.problems[key].extend(f"{label} (op): {p}" for p in problems)


def audit_platform(name: str, grids: Grid | Sequence[Grid], backends: Sequence[str] = tuple(BACKENDS),
                   kv_dtypes: Sequence[str] = KV_DTYPES, out: TextIO | None = None) -> Report:
    """Audit ``grids`` (one or several) on platform ``name`` (a key of :data:`PLATFORMS`)."""
    report = Report()
    t0 = time.time()
    grids = [grids] if isinstance(grids, Grid) else list(grids)
    with host_only(), platform_named(name) as platform:
        for kv in kv_dtypes:
            for grid in grids:
                for H in grid.heads:
                    for topk in grid.topks:
                        for bname in backends:
                            backend = BACKENDS[bname](H, topk, torch.bfloat16, platform=platform, kv_dtype=kv)
                            for max_rows in grid.max_rows:
                                where = (name, bname, kv, H, topk, max_rows)
                                md = backend.make_metadata(max_rows)
                                if md.q_pad is not None:
                                    report.problems[where].append("a q-pad buffer (no Triton backend pads q)")
                                md.mark_captured()  # as after a capture: more rows are oversized eager steps
                                audit_metadata(backend, md, grid.rows, report, where)
            if out is not None:
                print(f"  {name} kv={kv}: {report.direct} bound-call / {report.op} op plans so far, "
                      f"{sum(len(v) for v in report.problems.values())} problems, {time.time() - t0:.0f}s",
                      file=out, flush=True)
    return report


def _audit_platform_quiet(args: tuple) -> Report:
    return audit_platform(*args)


def audit(platforms: Sequence[str], grids: Grid | Sequence[Grid], backends: Sequence[str] = tuple(BACKENDS),
          kv_dtypes: Sequence[str] = KV_DTYPES, out: TextIO | None = None, jobs: int = 1) -> Report:
    """Audit ``grids`` on each platform of ``platforms`` (``jobs`` processes side by side)."""
    report = Report()
    if jobs <= 1 or len(platforms) <= 1:
        for name in platforms:
            report.merge(audit_platform(name, grids, backends, kv_dtypes, out))
        return report
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch state
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        t0 = time.time()
        futures = {pool.submit(_audit_platform_quiet, (n, grids, tuple(backends), tuple(kv_dtypes))): n
                   for n in platforms}
        for future in concurrent.futures.as_completed(futures):
            part = future.result()
            report.merge(part)
            if out is not None:
                print(f"  {futures[future]}: {part.direct} bound-call / {part.op} op plans, "
                      f"{sum(len(v) for v in part.problems.values())} problems, {time.time() - t0:.0f}s",
                      file=out, flush=True)
    return report


def regression_grids() -> list[Grid]:
    """graphattn.testing.fuzz.REGRESSION_SHAPES as grids: each shape's heads and top-k, with its own
    rows (and one either side) added to the full grid's row counts."""
    from graphattn.testing.fuzz import REGRESSION_SHAPES

    return [Grid((shape["heads"],), (shape["topk"],),
                 tuple(sorted(set(FULL.rows) | {shape["rows"] - 1, shape["rows"], shape["rows"] + 1} - {-1})),
                 FULL.max_rows) for shape in REGRESSION_SHAPES]


def print_report(report: Report, out: TextIO | None = None, limit: int = 200) -> None:
    out = out or sys.stdout
    print(f"\nchecked {report.direct} bound-call plans and {report.op} op plans on {report.metadata} metadata",
          file=out)
    for (platform, what), (ratio, key, need, reserved) in sorted(report.worst.items()):
        print(f"  largest need/reserved of {what:12s} {ratio:.3f} ({need}/{reserved}) at {key}", file=out)
    if report.problems:
        print(f"\n{len(report.problems)} configurations with problems "
              "(platform, backend, kv, heads, topk, max_rows, rows, aligned):", file=out)
        for key, problems in list(report.problems.items())[:limit]:
            print(f"  {key}", file=out)
            for p in sorted(set(problems)):
                print(f"      {p}", file=out)
    elif report.direct:
        print("\nNO MISMATCH: every launch needs at most what the metadata reserved", file=out)
    else:
        print("\nnothing was checked", file=out)


def select_platforms(spec: str) -> list[str]:
    """The platforms of ``--platforms``: each comma-separated token selects the platform whose
    name's first word it is, else every platform whose name contains it (case-insensitive)."""
    if spec.strip().lower() == "all":
        return list(PLATFORMS)
    names: list[str] = []
    for token in (t.strip().lower() for t in spec.split(",") if t.strip()):
        exact = [n for n in PLATFORMS if n.split()[0].lower() == token]
        names += [n for n in exact or [n for n in PLATFORMS if token in n.lower()] if n not in names]
    return names


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="a small grid (seconds)")
    which.add_argument("--h200-all-heads", action="store_true", help="the H200 table, heads 1..300")
    which.add_argument("--dense-rows", action="store_true", help="the sm_90 tables, every row count 0..700")
    which.add_argument("--regression", action="store_true", help="graphattn.testing.fuzz.REGRESSION_SHAPES")
    ap.add_argument("--platforms", default="all",
                    help="comma-separated first words (H20 is not H200) or substrings of the platform "
                         "names (default all): " + "; ".join(PLATFORMS))
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default all)")
    ap.add_argument("--kv", default=",".join(KV_DTYPES), help="kv dtypes: auto, fp8 (default both)")
    ap.add_argument("--jobs", type=int, default=1, help="platforms audited in parallel processes")
    args = ap.parse_args(argv)
    names = select_platforms(args.platforms)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    kv = [k.strip() for k in args.kv.split(",") if k.strip()]
    bad = [b for b in backends if b not in BACKENDS] + [k for k in kv if k not in KV_DTYPES]
    if not names or bad:
        ap.error(f"no platform matches {args.platforms!r}" if not names else f"unknown: {bad}")
    grid = FULL
    if args.quick:
        grid = QUICK
    elif args.h200_all_heads:
        names, grid = [H200], H200_ALL_HEADS
    elif args.dense_rows:
        names, grid = [n for n in names if "sm_90" in n], DENSE_ROWS
    t0 = time.time()
    report = audit(names, regression_grids() if args.regression else grid, backends, kv, sys.stdout, args.jobs)
    print_report(report, sys.stdout)
    print(f"({time.time() - t0:.0f} s)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
