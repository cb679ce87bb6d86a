"""Triton launch settings for NVIDIA Hopper (sm_90, H100/H200: 132 SMs, 228 KB smem per SM).

``kernel_config(path, rows=, heads=, topk=)`` returns a dict (keys: see
``graphattn.kernels.plan``). Measured on an H200 with ``python -m graphattn.bench.kernels
--sweep``; docs/benchmarks.md has the numbers. The heuristics here pick from the small set of
settings in :func:`all_configs`, which the ahead-of-time test compiles for sm_90.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch

SM90_SMS = 132
# The FP8 format of 656-byte KV tokens on NVIDIA (converted natively from sm_89 on).
FP8_DTYPE = torch.float8_e4m3fn
# Split-KV: small batches need many programs to fill the 132 SMs. flashmla's separate combine
# loads all splits of a head at once, so it can afford many splits (its workspace is a pool of
# partials shared by all row counts: see graphattn.kernels.plan.split_plan). trtllm's last
# program merges the splits one after the other, so it keeps fewer, longer splits.
FLASHMLA_MAX_SPLITS = 32
# With the 32-head tile (two programs per SM) flashmla keeps splits x heads x 2 KB <= 2 MB per
# row: 16 splits at 64 heads, 8 at 128. Allowing 32 made 8 rows x topk 32768 take 17 / 9
# splits, just over 2 x 132 programs, and a partial second wave: 229 -> 344 us at 64 heads,
# 443 -> 689 at 128.
PARTIAL_BYTES_PER_ROW = 2 << 20
# flashmla at rows <= 8 asks for two programs per SM (more, shorter splits): measured 32.8 ->
# 28.6 us at 64 heads x 8 rows; at 64 rows the same target was slower (135.6 -> 176.0 us), so
# larger batches keep one per SM. The target never grows with rows, so neither do the splits.
SMALL_BATCH_ROWS = 8
# At most this many rows x heads (1 row up to 128 heads, 2 rows of 64), flashmla's Triton tiles
# use the tokens-major tile (KV_MAJOR: 64 tokens x 16 heads per wgmma, one program per SM, one
# or two tiles per program). Measured (us, 64 heads x 1 row / 128 x 1 / 64 x 2): 17.9 / 27.5 /
# 18.4 with the 32-head tile, 10.5 / 13.8 / 14.1 with this one; at 64 x 4 it was slower (23.9
# vs 19.7) and at 64+ rows 1.5-2x slower: it holds only two KV tiles in flight (168 KB of smem).
KV_MAJOR_MAX_ROW_HEADS = 128
# With the wgmma kernel available it keeps only rows x heads <= 64 (1 row of 64 heads): 10.4 us
# against wgmma's 11.9 there, while at 128 x 1 (13.7 vs 12.9) and 64 x 2 (13.9 vs 13.3) wgmma is
# faster. Measured with q padded to 64 heads; flashmla now passes the real head count, so 16
# heads x 2-4 rows and 32 x 2 also take this tile (not yet measured against wgmma there).
KV_MAJOR_MAX_ROW_HEADS_WITH_WGMMA = 64
_KV_MAJOR_TILE = {"BLOCK_H": 16, "BLOCK_N": 64, "IDX_AHEAD": 0, "KV_MAJOR": 1, "num_warps": 4, "num_stages": 2}
# Everywhere else flashmla runs a hand-scheduled Gluon kernel: 64 heads per program, a 2-slot
# ring of 64-token KV tiles (q and the ring fill the shared memory: one program per SM). "kernel"
# is a host key: it names the function (graphattn.kernels.flashmla.GLUON_KERNELS).
# bf16/fp16 kv where wgmma_rr (below) would have few programs: the warp-specialised kernel
# (graphattn.kernels.wgmma_ws: a producer warpgroup gathers, two consumer warpgroups take turns
# at the scores; 12 warps, so maxnreg 168 at launch and setmaxnreg inside). Kernel tables
# before/after (us, docs/benchmarks.md): 128 x 512 rows 862.5 -> 623.3, 128 x 64 x topk 8192
# 407.1 -> 285.7, 64 x 64 67.1 -> 57.7, 16 x 512 415.1 -> 317.2, 128 x 8 26.3 -> 23.1, 1-2 rows
# within 0.2 (the predecessor, 8 warps that gathered and computed in turn, replaced at 4e1066f).
# That predecessor measured against 32-token tiles with 3 or 4 slots (188 / 225 KB): 64 x 64 rows
# 90.2 us vs 114.0 / 115.4, 128 x 512 866.5 vs 1128.9 / 1134.3.
# Their split partials are stored in the accumulator's own order (partial_native, a host key:
# graphattn.kernels.flashmla.PARTIAL_NATIVE_KERNELS; 32 heads or more, a multiple of 16: a
# partly-masked block stores only its own heads, 32 x 8 15.12 -> 14.36, 96 x 8 20.65 -> 18.43,
# FP8 32 x 8 18.44 -> 17.87 against head-major f32, docs/benchmarks.md), a warp's store one
# run of 256 bytes instead of 8 rows of 32, and merged by a Gluon combine that reads that order:
# A/B on the H200 (us, head-major -> native, docs/benchmarks.md) 128 x 8 21.61 -> 20.79, 64 x 8
# 19.64 -> 18.95, 128 x 4 17.93 -> 17.22, 128 x 1 11.62 -> 11.37; FP8 128 x 8 28.35 -> 27.81,
# 64 x 8 23.32 -> 22.74. (Its Triton combine, whose weights changed layout through shared
# memory, cost more than the store saved: 128 x 8 21.58 -> 26.72.) In q's dtype (partial_native
# 2: half the bytes, stored straight from the accumulator in whole sectors; the f32 partials
# took ~3.8 us to store at 128 x 8, 16.8 MB at ~4.4 TB/s) against f32 in the same order (us):
# 128 x 8 20.80 -> 18.17, 64 x 8 18.89 -> 16.32, 128 x 4 17.13 -> 14.83, 128 x 1 11.34 -> 9.93,
# 64 x 2 12.10 -> 10.70; FP8 128 x 8 27.65 -> 24.85, 64 x 8 22.78 -> 19.66. Each partial is
# rounded to q's dtype once more before the combine: the checks' worst error went from
# 0.05-0.07 to 0.06-0.09 of the tolerance.
_WGMMA_TILE = {"kernel": "wgmma_ws", "BLOCK_H": 64, "BLOCK_N": 64, "STAGES": 2, "num_warps": 4,
               "num_stages": 1, "maxnreg": 168, "partial_native": 2}
# 656-byte FP8 kv: the same warp-specialised kernel reading the tokens' bytes (KV_FP8=1, e4m3fn),
# each tile dequantised in shared memory by both consumers (half its tokens each). It replaced an 8-warp kernel that
# gathered, converted and computed in turn (kernels/wgmma_fp8.py up to 4011a35): 128 x 512 rows
# 1582 -> 877 us, 64 x 64 110 -> 72, 16 x 512 784 -> 434 (docs/benchmarks.md).
# Where it takes two splits (64 heads x ~45-66 rows, 128 heads x ~23-33) they run as a
# thread-block cluster and merge in the kernel, the producer doing the merge (cluster_merge:
# graphattn.kernels.wgmma_ws's CLUSTER=2) where the launch's CTAs fill at least 0.75 of the SMs
# (cluster_min_fill). The cluster merge against partials + the combine, one H200 call (us,
# docs/benchmarks.md), by CTAs: 92 (128 x 23) 64.6 vs 63.2, 96 (128 x 24) 65.3 vs 64.3 and
# (64 x 48) 66.0 vs 65.8, 104 (128 x 26) 65.7 vs 65.3 and (64 x 52) 66.2 vs 66.5 (66.1 vs 66.8
# in another call), 112 (128 x 28) 66.0 vs 66.5, 120 (64 x 60) 67.1 vs 68.8, 132 (64 x 66)
# 68.3 vs 70.2.
_WGMMA_FP8_TILE = {**_WGMMA_TILE, "KV_FP8": 1, "cluster_merge": 1, "cluster_min_fill": 0.75}
# bf16/fp16 kv outside the wgmma_tn and tokens-major shapes (above 32 heads, and 17-32 heads
# below TN_MIN_ROWS): FlashMLA's round schedule (graphattn.kernels.wgmma_rr: rounds of
# two 64-token tiles, one per consumer, both scores at once, each P V fed from registers; BLOCK_N
# is a round). A/B against wgmma_ws in one H200 call (us, kernel table method, docs/benchmarks.md):
# 128 x 512 rows 582.9 -> 548.5, 128 x 64 x topk 8192 272.9 -> 258.5, 128 x 64 73.4 -> 71.3,
# 64 x 512 333.5 -> 329.3, 128 x 8 22.5 -> 22.3, 64 x 3 15.2 -> 14.1, 64 x 4 17.1 -> 14.9,
# 128 x 2 16.2 -> 14.1, 128 x 1 x 8192 17.9 -> 17.2. Its splits are whole rounds, so where a
# launch would have fewer than WGMMA_RR_MIN_PROGRAMS programs wgmma_ws's one-tile splits are
# faster (twice the programs): 128 x 1 11.9 vs 12.7, 64 x 2 12.2 vs 13.1 (32 rr programs each).
# Where a launch takes two splits (64 heads x ~44-66 rows, 128 heads x ~22-33), they run as a
# thread-block cluster and merge in the kernel (cluster_merge: graphattn.kernels.wgmma_rr's
# CLUSTER=2), with no f32 partial of the other half and no combine launch.
# From idx_early_min_heads heads (two head blocks share each token) a launch's producer (no
# cluster merge) takes its indices off its path (idx_early_min_heads is a host key; the plan sets
# graphattn.kernels.wgmma_rr's IDX_EARLY=1: the split's indices asked of L2 first, each round's
# loaded a round ahead; Nsight Compute had the producer waiting on them about as long as on free
# halves). A/B on the H200
# (us, docs/benchmarks.md, session 8): 128 x 64 71.22 -> 68.97, 128 x 512 539.71 -> 535.95,
# 128 x 64 x topk 8192 256.12 -> 250.57; at 64 heads not faster (64 x 512 326.18 -> 327.59,
# 64 x 8 16.33 -> 16.37). In splits through the combine (session 9): 128 x 8 x topk 32768
# 136.11 -> 134.66, 128 x 8 18.20 -> 18.17, 128 x 4 14.74 -> 14.69; a cluster merge gets none.
_WGMMA_RR_TILE = {**_WGMMA_TILE, "kernel": "wgmma_rr", "BLOCK_N": 128, "cluster_merge": 1,
                  "idx_early_min_heads": 65}
WGMMA_RR_MIN_PROGRAMS = 48  # 48 (64 x 3) measured faster with rr, 32 slower; between, untested
# At most TN_MAX_HEADS heads flashmla runs the tokens-major Gluon kernel instead
# (graphattn.kernels.wgmma_tn: tokens on the wgmma's M side, 16 or 32 heads on N, so few heads
# do not pay for the 64 an M tile holds; the same producer, each consumer owning alternate tiles
# whole), for bf16/fp16 kv and FP8 tokens alike, from TN_MIN_ROWS rows on (per head block).
# Measured against what ran before (us, bf16 / FP8, diag-style A/B in one call, docs): 16 x 512
# 307.7 -> 290.3 / 441.8 -> 361.7, 32 x 512 315.7 -> 313.0 / 448.0 -> 411.2, 16 x 64 43.6 ->
# 40.2 / 66.4 -> 53.1, 32 x 64 46.8 -> 46.5 / 68.0 -> 61.8, 16 x 8 12.8 -> 12.1 / 16.1 -> 14.3,
# 16 x 4 10.1 -> 10.0 / 11.7 -> 11.3, 16 x 8 x topk 32768 78.0 -> 73.7 / 122.3 -> 95.6; slower
# at 32 x 8 (14.3 -> 16.0 / 18.1 -> 18.5), 32 x 1 (8.9 -> 12.1 / 10.5 -> 13.5) and 16 x 1
# (8.7 -> 8.8 / 10.0 -> 10.3): a tile's scores and its 512 x heads output are one chain per
# consumer, which few tiles per program do not hide.
TN_MAX_HEADS = 32
TN_MIN_ROWS = {16: 4, 32: 64}
_WGMMA_TN_TILES = {bh: {**_WGMMA_TILE, "kernel": "wgmma_tn", "BLOCK_H": bh} for bh in (16, 32)}
# Its splits fill whole waves of 132 programs (graphattn.kernels.plan.choose_splits), a split
# costing about two 64-token tiles of fixed work (q is 72 KB, the f32 partial 128 KB); that
# rule, not PARTIAL_BYTES_PER_ROW, keeps 8 rows x topk 32768 in one wave, so up to 32 splits
# (128 heads x 1 row: 12.9 us with 32 splits).
WGMMA_SPLIT_COST_BLOCKS = 2  # wgmma_tn (q 18-36 KB, partial 32-64 KB) keeps it: the sweep
# in docs/benchmarks.md found the resulting split counts best at 16 heads x 4 and 8 rows

# With FP8 tokens, where a split has at most TN_FP8_RING_MAX_TILES[block] KV tiles, the gather fills a
# ring of TN_FP8_RING raw-byte slots (41 KB each: three fit beside q and one bf16 tile at 16
# heads, two at 32) and both consumers work on every tile, half its dequantisation each
# (graphattn.kernels.wgmma_tn's RING; the host keys fp8_ring and ring_max_tiles, applied by the
# plan once the split length is known). A/B on the H200 (us, FP8, two slots -> ring, tiles a
# split in brackets, docs/benchmarks.md): 16 x 4 (1) 11.65 -> 10.34, 16 x 8 (2) 15.62 ->
# 14.39, 16 x 16 (4) 21.30 -> 20.58, 16 x 8 x topk 4096 (4) 21.27 -> 20.63; with more tiles the
# two consumers' turns, each on its own slot, overlap one's dequantisation with the other's
# products, which one shared tile cannot: 16 x 32 (8) 32.26 -> 32.79, 16 x 8 x 8192 (8) 32.87
# -> 33.42, 16 x 512 358.9 -> 412.6 (two ring slots: 414.7, so not the gather), 32 x 64 61.44
# -> 70.26.
# At 16 heads the raw tile (below) takes splits of more than two tiles: the ring against it
# (us, FP8, twice alternated, docs/benchmarks.md, twenty-fifth session): 16 x 1 (1 tile) 8.92
# against 9.75, 16 x 4 (1) 10.38 / 11.16, 16 x 8 (2) 12.66 / 12.96, 16 x 16 (4) 18.35 / 17.56.
TN_FP8_RING, TN_FP8_RING_MAX_TILES = {16: 3, 32: 2}, {16: 2, 32: 4}
# With more tiles a split, at 16 heads (TN_FP8_RAW_TILE), the gather fills a raw slot of its
# own (41 KB) and each consumer loads its tiles from it into registers, frees it, computes the
# scores from registers and stores its V into its own bf16 tile (graphattn.kernels.wgmma_tn's
# RAW_TILE; the host key fp8_raw_tile): the gathers run ahead of both consumers' chains instead
# of waiting for a consumer to free its slot, and the scores read no bf16 tile. It replaced two
# 32-token raw slots dequantised into the bf16 tiles (RAW_HALVES, which had replaced in-place
# slots: 16 x 512 361.3 -> 331.0, 16 x 64 53.6 -> 48.9, 16 x 8 x topk 32768 96.3 -> 86.2). A/B
# on the H200 (us, FP8, twice alternated, halves -> raw tile, docs/benchmarks.md, twentieth
# session): 16 x 512 318.0 -> 301.1, 16 x 64 45.6 -> 45.2, 16 x 8 x topk 32768 80.3 -> 79.3,
# 16 x 64 x topk 8192 151.9 -> 147.7.
TN_FP8_RAW_TILE = (16,)
# Below TN_MIN_ROWS, FP8 tokens at up to SMALL_BATCH_ROWS rows and TN_FP8_FEW_ROWS_MAX_TOPK
# top-k take wgmma_tn too: their splits are one or two tiles, so the ring runs. Against
# wgmma_ws (us, FP8, A/B on the H200): 16 x 1 9.81 -> 8.72, 16 x 2 11.05 -> 9.60, 16 x 3 11.96
# -> 10.60, 32 x 1 10.13 -> 10.05, 32 x 4 13.32 -> 13.25, 32 x 8 18.47 -> 17.17.
TN_FP8_FEW_ROWS_MAX_TOPK = 2048

# FP8 tokens gathered in place at 32 heads (neither ring nor raw tile: 32 x 64 rows and more)
# take their indices off the producer's path: the split's indices asked of L2 first, each tile's
# loaded two tiles ahead (wgmma_tn's IDX_EARLY, through the host key idx_early_min_heads; 17
# heads and up run the 32-head block). A/B on the H200 (us, twice alternated, docs/benchmarks.md,
# nineteenth session): FP8 32 x 512 397.8 -> 382.7, 32 x 64 57.7 -> 57.6; slower at 16 heads'
# raw halves (since replaced by the raw tile; 16 x 512 318.4 -> 322.0, 16 x 64 45.3 -> 46.3,
# 16 x 8 x topk 32768 80.4 -> 82.8) and with bf16 kv (16 x 64 45.0 -> 49.7, 32 x 64 49.6 ->
# 55.1, 16 x 512 298.0 -> 319.3; ptxas: 48 B of spills at 16 heads, none without).
TN_FP8_IDX_EARLY_MIN_HEADS = {32: 17}


def _tn_fp8(tile: dict[str, Any]) -> dict[str, Any]:
    block = tile["BLOCK_H"]
    raw = {"fp8_raw_tile": 1} if block in TN_FP8_RAW_TILE else {}
    early = {"idx_early_min_heads": TN_FP8_IDX_EARLY_MIN_HEADS[block]} if block in TN_FP8_IDX_EARLY_MIN_HEADS else {}
    return {**tile, "KV_FP8": 1, "fp8_ring": TN_FP8_RING[block], "ring_max_tiles": TN_FP8_RING_MAX_TILES[block],
            **raw, **early}


@functools.cache  # a process constant; find_spec searches the file system (~0.9 ms) every call
def gluon_available() -> bool:
    """True when this triton has Gluon's Hopper dialect (triton >= 3.5), which the wgmma kernel needs.

    Looked up on disk, not imported: importing Gluon fails in a process whose triton was first
    imported for the interpreter (no GPU), where the answer still decides which kernels the
    ahead-of-time compile covers."""
    try:
        spec = importlib.util.find_spec("triton.experimental.gluon")
    except ImportError:
        return False
    roots = (spec.submodule_search_locations or []) if spec is not None else []
    hopper = [os.path.join(root, "language", "nvidia", "hopper") for root in roots]
    return any(os.path.isdir(path) or os.path.isfile(path + ".py") for path in hopper)


def _wgmma(path: str, capability: tuple[int, int]) -> bool:
    """flashmla's Gluon kernel: wgmma exists on sm_90 only (not sm_80/89, not Blackwell)."""
    return path == "flashmla" and capability[0] == 9 and gluon_available()


def _tn_tile(path: str, rows: int, heads: int, topk: int, capability: tuple[int, int],
             kv_fp8: bool) -> dict[str, Any] | None:
    """The tokens-major Gluon kernel's setting for ``rows x heads x topk`` (sm_90, at most
    TN_MAX_HEADS heads, from TN_MIN_ROWS rows, or fewer for FP8 tokens at a small top-k), else
    None."""
    if not _wgmma(path, capability) or heads > TN_MAX_HEADS:
        return None
    block = 16 if heads <= 16 else 32
    few_fp8 = kv_fp8 and rows <= SMALL_BATCH_ROWS and topk <= TN_FP8_FEW_ROWS_MAX_TOPK
    if rows < TN_MIN_ROWS[block] and not few_fp8:
        return None
    tile = _WGMMA_TN_TILES[block]
    return _tn_fp8(tile) if kv_fp8 else dict(tile)


def _wgmma_bf16_tile(rows: int, heads: int, topk: int) -> dict[str, Any]:
    """wgmma_rr's setting, or wgmma_ws's where rr's launch would have fewer than
    WGMMA_RR_MIN_PROGRAMS programs (counted at the most splits choose_splits may give it)."""
    head_rows = rows * -(-heads // _WGMMA_RR_TILE["BLOCK_H"])
    rounds = -(-max(topk, 1) // _WGMMA_RR_TILE["BLOCK_N"])
    programs = head_rows * min(FLASHMLA_MAX_SPLITS, rounds, max(1, -(-SM90_SMS // max(1, head_rows))))
    return dict(_WGMMA_RR_TILE if programs >= WGMMA_RR_MIN_PROGRAMS else _WGMMA_TILE)


def _kv_major(path: str, rows: int, heads: int, capability: tuple[int, int]) -> bool:
    # Not "flashmla_triton": the launcher asks for it for unaligned inputs, which the
    # tokens-major tile cannot take (graphattn.kernels.flashmla._split_kernel says why).
    return path == "flashmla" and rows * heads <= (
        KV_MAJOR_MAX_ROW_HEADS_WITH_WGMMA if _wgmma(path, capability) else KV_MAJOR_MAX_ROW_HEADS)


def _split_host(path: str, heads: int, rows: int, tiles: dict[str, Any]) -> dict[str, Any]:
    if path.startswith("flashmla"):
        if tiles.get("KV_MAJOR"):  # 168 KB of smem per program: one per SM
            return {"max_splits": FLASHMLA_MAX_SPLITS, "min_split_blocks": 1, "target_programs": SM90_SMS}
        if "kernel" in tiles:  # a Gluon kernel, one program per SM: whole waves
            return {"max_splits": FLASHMLA_MAX_SPLITS, "min_split_blocks": 1, "target_programs": SM90_SMS,
                    "split_cost_blocks": WGMMA_SPLIT_COST_BLOCKS}
        cap = max(1, min(FLASHMLA_MAX_SPLITS, PARTIAL_BYTES_PER_ROW // (heads * 512 * 4)))
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
# FP8 KV (656-byte tokens). Chosen under the earlier FP8 numerics (FP8 values exact in q's
# dtype, a float32 score accumulator per 128-column block): at 4 warps the 32 x 32 tile spilled
# 150-200 B per thread and the 16 x 64 tile 200-580 B (ptxas -v, sm_90, docs/benchmarks.md); at
# 8 warps neither did (16 x 64: 176 registers). With the tile dequantised into q's dtype
# (fp8-deq) the 32 x 32 tile at 4 warps spills 32-216 B (triton 3.6) and none at 8; not re-timed
# (flashmla runs the Gluon kernel on sm_90, 2-6x ahead). Measured on the H200 (quick kernel table, FP8): 8 warps made
# the 16-head tile faster (16 x 1: flashmla 14.5 -> 12.2 us, trtllm 46.7 -> 36.4, mega 284.9 ->
# 212.7) and the 32-head tile slower (64 x 64: flashmla 261.1 -> 397.5, 128 x 512: 3677 ->
# 5956), so only the 16-head tile changes: BLOCK_H -> num_warps for FP8. The tokens-major tile
# spills ~570 B with FP8, so FP8 never takes it: trtllm and mega run these heads-major tiles, and
# so does flashmla where the Gluon kernel's FP8 variant does not run (not sm_90, or unaligned).
FP8_NUM_WARPS = {16: 8, 32: 4}
_COMBINE = {"num_warps": 4, "num_stages": 1}
# Where flashmla's combine has at most one program per SM (sm_90+) it is a programmatic dependent
# launch: the split programs signal first thing (griddepcontrol.launch_dependents), so the
# combine's programs are placed while the split kernel runs and wait in the kernel
# (griddepcontrol.wait) instead of after a full launch. Each reserves COMBINE_HOLD_SMEM bytes of
# shared memory, more than half an SM's (228 KB on the H200), so no two share an SM: placed early
# they would otherwise crowd onto the SMs the split programs leave idle (128 programs onto 68 SMs
# at 128 heads x 1 row; onto 4 at 8 rows, where 128 split programs fill the rest). The plan
# (graphattn.kernels.flashmla) counts the combine's programs against ``pdl_max_programs``.
# Measured (µs, kernel table method): the PDL at 1-2 rows without the reservation: 16 x 1 9.51 ->
# 9.05, 64 x 1 10.50 -> 10.00, 128 x 1 12.75 -> 12.25, 64 x 2 13.05 -> 12.60 (and without the
# early signal slower everywhere: 16 x 1 9.68); at 4-8 rows without it slower (16 x 8 15.33 ->
# 16.46, 64 x 8 20.85 -> 21.95, 32 x 4 13.6 -> 14.1). With it (thirteenth session, against the
# rule before, rows <= 2 and rows x heads <= 128): 128 x 1 10.19 -> 10.06, 96 x 1 10.35 -> 10.25,
# 64 x 2 11.01 -> 10.89, 16 x 1 and 64 x 1 level; 16 x 8 13.41 -> 13.26 and 16 x 4 11.62 -> 11.15
# (a PDL without it: 14.58, 12.17); one program per SM over wgmma_rr's 512-1024 combine programs
# at 4-8 rows was 8-24% slower, hence the program count. The rule as it stands against the one
# before it (fourteenth session, A/B): 16 x 8 13.66 -> 13.28, 16 x 4 11.60 -> 11.16, 128 x 1
# 9.22 -> 9.13, 64 x 2 10.03 -> 9.93, FP8 16 x 8 14.36 -> 13.58, FP8 16 x 4 10.93 -> 10.45, FP8
# 128 x 1 10.58 -> 10.47; 16-32 x 1 level, 64 x 1 9.79 -> 9.85 (runs 9.77-9.81 against
# 9.84-9.85: 0.06 slower, kept for one rule). Measured on sm_90 only: other GPUs launch the
# combine plainly (kernel_config), and the plan caps the programs at the GPU's SMs.
# The native combine (wgmma_rr's and wgmma_ws's 16-bit partials) has 64 programs per row and
# head block, one per run of 8 columns: 512-1024 at 8 rows. Up to NATIVE_COMBINE_RUNS runs a
# program (four warps each) bring it to at most one program per SM, and so to the PDL above.
# A/B on the H200 (us, kernel table method, fourteenth session): 64 x 8 14.88 -> 14.38 (4 runs;
# the same programs without the PDL 14.85), 128 x 8 17.41 -> 17.27 (8 runs); 128 x 4 at 8 runs
# (64 programs, half the SMs) 13.93 -> 14.61, hence the fewest runs that fit; with them (another
# machine) 128 x 2 12.08 -> 11.39, 64 x 4 12.75 -> 11.99, 128 x 4 13.27 -> 12.79, 32 x 8 14.33 ->
# 13.49, 64 x 8 15.66 -> 14.78, 128 x 8 18.17 -> 17.65, FP8 64 x 8 18.47 -> 17.56, FP8 128 x 8
# 23.68 -> 23.74.
# wgmma_tn's head-major combine (graphattn.kernels.flashmla.HEADS_COMBINE_KERNELS) has one
# program per (row, head): over 132 from 9 rows at 16 heads (5 at 32 with FP8 tokens), 2048 at
# 32 x 64. Up to COMBINE_HEADS heads a program (``HEADS``, four warps a head up to 16 warps)
# bring it to one program per SM, and so to the PDL.
# A/B on the H200 (us, kernel table method, sixteenth session, 6dfcc96: one head a program /
# up to 4 / up to 16): 16 x 16 18.53 / 18.16 / 18.15 (2 heads), 16 x 32 29.02 / 28.62 / 28.57
# (4), 16 x 64 47.18 / 47.16 / 46.87 (8; none fits at 4), 32 x 64 53.23 / 53.20 / 52.58 (16),
# FP8 16 x 16 19.87 / 19.41 / 19.39, 16 x 32 32.30 / 31.83 / 31.79, 16 x 64 53.86 / 53.86 /
# 53.60: up to 16 heads 0.38-0.51 us faster than one head a program at 2-4 heads, and at the
# 64-row shapes (8 or 16 heads; none fits at 4) 0.26-0.65 us faster.
COMBINE_HOLD_SMEM = 120_000
NATIVE_COMBINE_RUNS = 8
COMBINE_HEADS = 16
_COMBINE_PDL_HOST = {"pdl_max_programs": SM90_SMS, "pdl_hold_smem": COMBINE_HOLD_SMEM,
                     "native_runs": NATIVE_COMBINE_RUNS, "combine_heads": COMBINE_HEADS}
# "flashmla_triton": flashmla's heads-major Triton tiles only, for inputs that are not 16-byte
# aligned (neither the wgmma kernel nor the tokens-major tile can take them).
_PATHS = ("flashmla", "flashmla_triton", "trtllm", "mega", "flashmla_combine")


def _tiles(heads: int, kv_fp8: bool = False) -> dict[str, Any]:
    for max_heads, (bh, bn, warps, stages, ahead) in _TILES:
        if heads <= max_heads:
            return {"BLOCK_H": bh, "BLOCK_N": bn, "IDX_AHEAD": ahead, "KV_MAJOR": 0,
                    "num_warps": FP8_NUM_WARPS.get(bh, warps) if kv_fp8 else warps, "num_stages": stages}
    raise AssertionError("unreachable: the last _TILES row covers every head count")


def kernel_config(path: str, rows: int = 1, heads: int = 64, topk: int = 2048,
                  capability: tuple[int, int] = (9, 0), kv_fp8: bool = False) -> dict[str, Any]:
    """Launch settings for kernel ``path`` at ``rows x heads x topk`` on a GPU of compute
    ``capability`` (the Triton tiles are tuned on sm_90 and used on every NVIDIA GPU);
    ``kv_fp8``: kv is 656-byte FP8 tokens (the heads-major tiles at :data:`FP8_NUM_WARPS`)."""
    if path not in _PATHS:
        raise ValueError(f"Unknown kernel path: {path!r}. Valid options are: {', '.join(_PATHS)}")
    if path == "flashmla_combine":
        # griddepcontrol (programmatic dependent launch) exists from sm_90 on; the rule and its
        # reservation were measured on sm_90 (228 KB of shared memory per SM: sm_120's 99 KB a
        # block could not take it), so other GPUs launch the combine after the split kernel
        cfg = {**_COMBINE, **_COMBINE_PDL_HOST} if capability[0] == 9 else dict(_COMBINE)
    elif path == "mega":
        cfg = _tiles(heads, kv_fp8)
    else:
        tn = _tn_tile(path, rows, heads, topk, capability, kv_fp8)
        if tn is not None:  # few heads: tokens on M, heads on N
            tiles = tn
        elif kv_fp8 and _wgmma(path, capability):  # the Gluon kernel's FP8 variant, at every size
            tiles = dict(_WGMMA_FP8_TILE)
        elif kv_fp8:  # never the tokens-major tile (it spills; see FP8_NUM_WARPS)
            tiles = _tiles(heads, kv_fp8)
        elif _kv_major(path, rows, heads, capability):
            tiles = dict(_KV_MAJOR_TILE)
        elif _wgmma(path, capability):
            tiles = _wgmma_bf16_tile(rows, heads, topk)
        else:
            tiles = _tiles(heads)
        cfg = {**tiles, **_split_host(path, heads, rows, tiles)}
    return cfg


def all_configs(path: str, kv_fp8: bool = False) -> list[dict[str, Any]]:
    """Every distinct setting :func:`kernel_config` can return for ``path`` (host keys dropped,
    except ``kernel``, which names the function a setting runs: absent for the Triton ones);
    ``kv_fp8``: those it returns for 656-byte FP8 tokens."""
    if path == "flashmla_combine":  # and the programmatic dependent launch the plan makes of it
        pdl = {**_COMBINE, "PDL": 1, "HOLD_SMEM": COMBINE_HOLD_SMEM, "launch_pdl": True}
        # the native combine's wider programs (RUNS: its constexpr only), each at the most splits
        # the plan gives it (graphattn.kernels.flashmla._native_runs)
        runs = [{**pdl, "RUNS": r, "BLOCK_S": min(32, 128 // r), "num_warps": 4 * r}
                for r in (2, 4, 8) if r <= NATIVE_COMBINE_RUNS]
        # the head-major combine's several heads a program (HEADS: its constexpr only), each at
        # the most splits the plan gives it (graphattn.kernels.flashmla.combine_heads_most: a
        # thread holds at most 64 partial values)
        heads = [{**pdl, "HEADS": h, "BLOCK_S": min(32, 64 * 32 * min(16, 4 * h) // (h * 512)),
                  "num_warps": min(16, 4 * h)} for h in (2, 4, 8, 16) if h <= COMBINE_HEADS]
        return [dict(_COMBINE), pdl] + runs + heads
    gluon = path == "flashmla" and gluon_available()
    tn = [_tn_fp8(t) if kv_fp8 else dict(t) for t in _WGMMA_TN_TILES.values()] if gluon else []
    if kv_fp8:
        fp8 = [_tiles(max_heads, kv_fp8) for max_heads, _ in _TILES]
        return fp8 + ([dict(_WGMMA_FP8_TILE)] + tn if gluon else [])
    tiles = [_tiles(max_heads) for max_heads, _ in _TILES]
    if not path.startswith("flashmla"):
        return tiles
    return tiles + [dict(_KV_MAJOR_TILE)] + ([dict(_WGMMA_RR_TILE), dict(_WGMMA_TILE)] + tn if gluon else [])
