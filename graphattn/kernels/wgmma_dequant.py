"""The 656-byte FP8 token in flashmla's sm_90 Gluon kernels (graphattn.common.kv_layout: 512
``float8_e4m3fn`` values, 4 float32 scales, 64 bf16 rotary values): the producer's gather of a
tile's bytes, scales and rope into shared memory, and the consumers' dequantisation,
``dtype(float32(fp8) * scale)`` per 128-value block, in place in the tile (``wgmma_ws``,
``wgmma_tn``) or from registers (``wgmma_tn``'s raw tile and ring). The products then run in
q's dtype, as on a cache dequantised by ``graphattn.common.kv_layout.dequantize_kv``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from ..common.kv_layout import ROPE_OFFSET, SCALE_OFFSET, TILE
from .wgmma import _async_load, _cta_barrier, _reinterpret

# The 656-byte FP8 token (graphattn.common.kv_layout), as kernel constants.
FP8_SCALE_OFFSET = gl.constexpr(SCALE_OFFSET)  # bytes: the 4 float32 scales after the 512 FP8 values
FP8_ROPE_OFFSET = gl.constexpr(ROPE_OFFSET)  # bytes: then the 64 bf16 rotary values
FP8_BLOCK = gl.constexpr(TILE)  # values per scale
# A scale block of FP8 values as the consumers dequantise it, [32 or 64 tokens, 128 values]: each
# thread 16 consecutive bytes of a token and the 16 that lie 64 columns on (16-byte shared loads,
# two 16-byte stores of q's dtype each). Shared memory serves a 16-byte access 8 lanes at a time.
# With a BlockedLayout's 8 lanes a row (16 bytes each), those lanes' stores of values hit 4 of
# the 8 16-byte bank groups twice (the 128-byte swizzle puts chunk 2k of row r at 2k ^ (r % 8):
# even chunks only, for even r): 2 wavefronts for 1 (Nsight Compute). Here lanes 0-3 and 4-7 take
# rows r and r ^ 5: their bytes lie in chunks {0..3} ^ r and {4..7} ^ r, their values in even and
# odd chunks, so neither access conflicts.
# DEQ_64 is DEQ_32 with rows 32-63 in one more register.
_DEQ_REGS = [[0, 1], [0, 2], [0, 4], [0, 8], [0, 64]]
_DEQ_LANES = [[0, 16], [0, 32], [5, 0], [2, 0], [8, 0]]
_DEQ_WARPS = [[16, 0], [1, 0]]
DEQ_32 = gl.constexpr(gl.DistributedLinearLayout(_DEQ_REGS, _DEQ_LANES, _DEQ_WARPS, [], [32, 128]))
DEQ_64 = gl.constexpr(gl.DistributedLinearLayout(_DEQ_REGS + [[32, 0]], _DEQ_LANES, _DEQ_WARPS, [], [64, 128]))
# The producer's FP8 gathers: the tokens' 512 bytes ([BLOCK_N, 512] uint8, 16 bytes per copy) and
# their 4 float32 scales, block-major ([4, BLOCK_N], one 4-byte copy each); the rope as bf16's.
FP8_GATHER = gl.constexpr(gl.BlockedLayout(
    size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1], order=[1, 0]))
FP8_SCALES = gl.constexpr(gl.BlockedLayout(
    size_per_thread=[1, 1], threads_per_warp=[1, 32], warps_per_cta=[4, 1], order=[1, 0]))


@gluon.jit
def _gather_fp8(kv_ptr, stride_kv, pool, idx_n, idx_c, raw_dst, kr_bits, sc_slot,
                D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
                gather_8: gl.constexpr, gather_r: gl.constexpr, gather_c: gl.constexpr):
    """cp.async the tokens ``idx`` (``idx_n``, ``idx_c``: the same indices in two layouts) into
    one slot: FP8 bytes ``[BLOCK_N, 512]`` into ``raw_dst``, the rope ``[BLOCK_N, 64]`` bf16 into
    ``kr_bits``, the scales ``[4, BLOCK_N]`` f32 (block-major). A token outside ``[0, pool)`` reads nothing:
    zeros."""
    valid_n = (idx_n >= 0) & (idx_n < pool)
    rows_n = gl.where(valid_n, idx_n, 0).to(gl.int64) * stride_kv
    cols_n = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, gather_8))
    _async_load(raw_dst, kv_ptr + rows_n[:, None] + cols_n[None, :], mask=valid_n[:, None])
    rows_r = gl.convert_layout(rows_n, gl.SliceLayout(1, gather_r))
    rope = (kv_ptr + rows_r + FP8_ROPE_OFFSET).to(gl.pointer_type(gl.bfloat16))
    cols_r = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, gather_r))
    _async_load(kr_bits, rope[:, None] + cols_r[None, :],
                mask=gl.convert_layout(valid_n, gl.SliceLayout(1, gather_r))[:, None])
    valid_c = (idx_c >= 0) & (idx_c < pool)
    rows_c = gl.where(valid_c, idx_c, 0).to(gl.int64) * stride_kv
    scales = (kv_ptr + rows_c + FP8_SCALE_OFFSET).to(gl.pointer_type(gl.float32))
    blocks = gl.arange(0, 4, layout=gl.SliceLayout(1, gather_c))
    _async_load(sc_slot, scales[None, :] + blocks[:, None], mask=valid_c[None, :])


@gluon.jit
def _dequantise_block(kn, sc_rows, slot, b: gl.constexpr, x, conv: gl.constexpr, ROW0: gl.constexpr):
    """Block ``b``'s FP8 values ``x`` ``[ROWS, 128]`` of tokens ``ROW0 + i`` times their block
    scale (row ``slot * 4 + b`` of ``sc_rows``), stored in ``kn``'s dtype to ``kn``'s (those
    tokens' rows') columns of block ``b``."""
    ROWS: gl.constexpr = kn.shape[0]
    scale = sc_rows.index(slot * 4 + b).slice(ROW0, ROWS).load(gl.SliceLayout(1, conv))  # [ROWS]
    kn.slice(b * FP8_BLOCK, FP8_BLOCK, dim=1).store(_dequantised(x, scale, kn.dtype))


@gluon.jit
def _dequantised(x, scale, dtype: gl.constexpr):
    """FP8 bytes ``x`` (``[ROWS, 128]`` uint8, e4m3fn bits: one scale block of ``ROWS`` tokens)
    times their tokens' scales ``scale`` (``[ROWS]`` f32), rounded to ``dtype``: the cache
    dequantised as ``graphattn.common.kv_layout.dequantize_kv`` does it."""
    return (x.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale[:, None]).to(dtype)


@gluon.jit
def _dequantise_tile(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope,
                     BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    """All of tile ``t``'s rows: :func:`_dequantise_rows` (wgmma_tn's consumers, which own
    whole tiles)."""
    _dequantise_rows(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, 0, BLOCK_N, D_NOPE, D_ROPE)


@gluon.jit
def _dequantise_rows(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, ROW0: gl.constexpr,
                     ROWS: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    """Consumer side, once tile ``t`` has landed, for its tokens ``[ROW0, ROW0 + ROWS)`` (a
    token's bytes overlap only its own row): its FP8 bytes, in ``raw``'s columns
    ``[512, 1024)`` (the upper half of the very bytes of the nope tile), become
    ``kn[:, 128 b + c] = dtype(float32(fp8[:, 128 b + c]) * scale[:, b])`` in place; with fp16 q
    the bf16 rope is rounded to fp16 in place. Both views share one 128-byte swizzle, so a
    128-byte chunk of one is the same bytes in the other: block ``b``'s bytes are chunk
    ``4 + b``, its values land in chunks ``2b`` and ``2b + 1``. Blocks 0 and 1 write where no
    FP8 byte is; blocks 2 and 3 are loaded first and written after a barrier (every thread has
    read every FP8 byte by then). Ends with the fence and barrier the scores' wgmma needs."""
    slot = t % 2
    mbarrier.wait(kv_ready.index(slot), (t // 2) & 1)
    if ROWS == 64:
        conv: gl.constexpr = DEQ_64
    else:
        gl.static_assert(ROWS == 32, "DEQ_32's or DEQ_64's rows")
        conv: gl.constexpr = DEQ_32
    raw = k_raw.index(slot).slice(ROW0, ROWS, dim=0)
    kn = k_nope.index(slot).slice(ROW0, ROWS, dim=0)
    # The compiler puts a barrier between shared loads and stores of views it cannot tell apart
    # (these alias), so fewer alternations cost fewer barriers. Up to 32 tokens (wgmma_ws's
    # halves: 32 registers of bytes) every block is loaded before any store, one alternation
    # (measured 2-3% faster at 64-128 heads than loading in pairs: docs/benchmarks.md); a whole
    # 64-token tile (wgmma_tn) loads in pairs, blocks 0 and 1 stored between (all four at once
    # spill 424 B at 32 heads).
    x0 = raw.slice(D_NOPE, FP8_BLOCK, dim=1).load(conv)
    x1 = raw.slice(D_NOPE + FP8_BLOCK, FP8_BLOCK, dim=1).load(conv)
    if ROWS > 32:
        _dequantise_block(kn, k_scale_rows, slot, 0, x0, conv, ROW0)
        _dequantise_block(kn, k_scale_rows, slot, 1, x1, conv, ROW0)
    x2 = raw.slice(D_NOPE + 2 * FP8_BLOCK, FP8_BLOCK, dim=1).load(conv)
    x3 = raw.slice(D_NOPE + 3 * FP8_BLOCK, FP8_BLOCK, dim=1).load(conv)
    _cta_barrier()  # every FP8 byte read: blocks 2 and 3 overwrite them
    if ROWS <= 32:
        _dequantise_block(kn, k_scale_rows, slot, 0, x0, conv, ROW0)
        _dequantise_block(kn, k_scale_rows, slot, 1, x1, conv, ROW0)
    _dequantise_block(kn, k_scale_rows, slot, 2, x2, conv, ROW0)
    _dequantise_block(kn, k_scale_rows, slot, 3, x3, conv, ROW0)
    if k_rope.dtype != gl.bfloat16:  # each thread rewrites the values it read: no barrier needed
        rl: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1], order=[1, 0])
        rope = k_rope_bits.index(slot).slice(ROW0, ROWS, dim=0).load(rl)
        k_rope.index(slot).slice(ROW0, ROWS, dim=0).store(rope.to(k_rope.dtype))
    fence_async_shared()  # the dequantised tile (generic stores) before wgmma reads it (async proxy)
    _cta_barrier()  # ... every thread's stores, before this warpgroup's scores


@gluon.jit
def _dequantise_mine(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, d_ready):
    """The owner's part of tile ``t``: the first half of its tokens (the other consumer does the
    second in :func:`_other_tile`), then wait until that half is done too."""
    N: gl.constexpr = k_nope.shape[1]
    _dequantise_rows(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope, 0, N // 2, k_nope.shape[2],
                     k_rope.shape[2])
    mbarrier.wait(d_ready.index(t % 2), (t // 2) & 1)


@gluon.jit
def _fp8_views(k_nope, k_rope, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr,
               D_ROPE: gl.constexpr):
    """The shared memory a KV ring of 656-byte FP8 tokens adds to the plain one (``k_nope``
    ``[STAGES, BLOCK_N, 512]``, ``k_rope`` ``[STAGES, BLOCK_N, 64]``, NVMMA 128-byte swizzle):
    ``(k_raw, k_scale, k_rope_bits, k_scale_rows)``, the nope tiles' bytes as uint8 (the FP8
    bytes land in their upper half, dequantised into the tile in place), a 2 KB block-major ring
    of the tokens' scales (shared memory has room for nothing larger), the rope tiles as bf16
    (fp16 q rounds them in place) and the scale ring as ``[STAGES * 4, BLOCK_N]`` rows (slot * 4
    + block: one block's scales)."""
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    raw_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    rows_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    k_raw = _reinterpret(k_nope, gl.uint8, [STAGES, BLOCK_N, 2 * D_NOPE], raw_layout)
    k_scale = gl.allocate_shared_memory(gl.float32, [STAGES, 4, BLOCK_N], gl.SwizzledSharedLayout(
        vec=1, per_phase=1, max_phase=1, order=[1, 0]))
    k_scale_rows = _reinterpret(k_scale, gl.float32, [STAGES * 4, BLOCK_N], rows_layout)
    k_rope_bits = _reinterpret(k_rope, gl.bfloat16, [STAGES, BLOCK_N, D_ROPE], smem_layout)
    return k_raw, k_scale, k_rope_bits, k_scale_rows
