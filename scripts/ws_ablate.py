"""What limits flashmla's warp-specialised kernel (wgmma_ws, sm_90): per-call time over a topk
sweep with timing-only variants (results wrong by design): ``full``, ``nogather`` (the producer
copies nothing: the products and softmax alone), ``nomma`` (no wgmma: the gathers alone). The
slope over topk is the time per 64-token tile, the intercept the fixed cost of a program. These
run wgmma_ws at every size (``WGMMA_RR_MIN_PROGRAMS`` raised out of reach; the launch table now
picks wgmma_rr at the default shapes). ``rr-VARIANT`` does the same to the round-schedule kernel
(wgmma_rr, as the launch table picks it; ``nogather`` there skips its KV copies, not q's). ``l2hot`` and
``rr-l2hot`` fold every KV index into 256 tokens (wrong results): the same copies and shared-memory
writes, from L2 instead of HBM, so against ``full`` and ``nogather`` they tell the memory's
latency (a ring too shallow to hide it) from the copies' own cost in the SM. ``fp8-VARIANT`` runs
656-byte FP8 tokens (wgmma_ws's ``KV_FP8=1``, and wgmma_tn's at <= 32 heads, which shares the
dequantisation): ``fp8-full``, ``fp8-nodeq`` (nothing dequantised: the tiles' bytes as they
landed), ``fp8-copyonly`` (each half-tile's bytes loaded and stored back spread to 16-bit lanes,
no arithmetic: the shared-memory round trip and its barriers alone).
Run from the repository root on an sm_90 GPU:
``PYTHONPATH=. python scripts/ws_ablate.py [rr-|fp8-]VARIANT [HEADSxROWSxTOPK ...]`` (the kernel
table's method, graphattn.bench.kernels.measure)."""
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from graphattn.cuda import configs as cuda_configs
from graphattn.kernels import wgmma_rr, wgmma_ws
from graphattn.kernels.wgmma import _load_indices
from graphattn.kernels.wgmma_ws import GATHER_R
from tn_ablate import _no_mma, _no_wait  # the same stand-ins for wgmma (this script's folder is on sys.path)

_ws_tile_indices = wgmma_ws._tile_indices  # the shipped one, which l2hot's wraps


@gluon.jit
def _no_gather(kv_ptr, stride_kv, pool, idx_n, idx_r, kn_slot, kr_slot, D_NOPE: gl.constexpr,
               D_ROPE: gl.constexpr, gather_n: gl.constexpr, gather_r: gl.constexpr):
    pass


@gluon.jit
def _no_load(dst, ptrs, mask=None):
    pass


HOT_TOKENS = gl.constexpr(256)  # l2hot: 256 x 1152 B stay in L2


@gluon.jit
def _hot(idx):
    return gl.where(idx >= 0, idx % HOT_TOKENS, idx)


@gluon.jit
def _tile_indices_hot(idx_row_ptr, n0, end, BLOCK_N: gl.constexpr, KV_FP8: gl.constexpr,
                      gather_n: gl.constexpr, gather_r: gl.constexpr):
    idx_a, idx_b = _ws_tile_indices(idx_row_ptr, n0, end, BLOCK_N, KV_FP8, gather_n, gather_r)
    return _hot(idx_a), _hot(idx_b)


@gluon.jit
def _tile_rows_hot(idx_row_ptr, n0, end, pool, stride_kv, TILE: gl.constexpr):
    idx = _hot(_load_indices(idx_row_ptr, n0, end, TILE, gl.SliceLayout(1, GATHER_R)))
    valid = (idx >= 0) & (idx < pool)
    return gl.where(valid, idx, 0).to(gl.int64) * stride_kv, valid


@gluon.jit
def _no_dequantise(kn, sc_rows, slot, b: gl.constexpr, x, conv: gl.constexpr, ROW0: gl.constexpr):
    pass


@gluon.jit
def _copy_only(kn, sc_rows, slot, b: gl.constexpr, x, conv: gl.constexpr, ROW0: gl.constexpr):
    # 4 bytes -> two 32-bit words of 16-bit lanes ([b1 0 b0 0], [b3 0 b2 0]): the stores of a
    # dequantised block without its conversions and scale (kn's dtype for the store only).
    v = gl.inline_asm_elementwise("prmt.b32 $0, $2, 0, 0x1404; prmt.b32 $1, $2, 0, 0x3424;", "=r,=r,r", [x],
                                  dtype=kn.dtype, is_pure=True, pack=4)
    kn.slice(b * 128, 128, dim=1).store(v)


# bf16 runs wgmma_ws at every size (the launch table would pick wgmma_rr at the default shapes)
_WS = (cuda_configs, "WGMMA_RR_MIN_PROGRAMS", 1 << 30)
# variant -> (module, name, stand-in) patches applied before the first compile
VARIANTS = {
    "full": (_WS,),
    "nogather": (_WS, (wgmma_ws, "_gather_tile", _no_gather)),
    "nomma": (_WS, (wgmma_ws, "warpgroup_mma", _no_mma), (wgmma_ws, "warpgroup_mma_wait", _no_wait)),
    "l2hot": (_WS, (wgmma_ws, "_tile_indices", _tile_indices_hot)),
    "rr-full": (),
    "rr-nogather": ((wgmma_rr, "_async_load", _no_load),),
    "rr-nomma": ((wgmma_rr, "warpgroup_mma", _no_mma), (wgmma_rr, "warpgroup_mma_wait", _no_wait)),
    "rr-l2hot": ((wgmma_rr, "_tile_rows", _tile_rows_hot),),
    "fp8-full": (),
    "fp8-nodeq": ((wgmma_ws, "_dequantise_block", _no_dequantise),),
    "fp8-copyonly": ((wgmma_ws, "_dequantise_block", _copy_only),),
}


if __name__ == "__main__":
    variant = sys.argv[1]
    if variant not in VARIANTS:
        sys.exit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    for module, name, stand_in in VARIANTS[variant]:
        setattr(module, name, stand_in)
    from graphattn.bench.kernels import measure

    shapes = [(128, 64, t) for t in (256, 512, 1024, 2048, 4096, 8192)] + [(64, 128, 2048), (64, 64, 2048)]
    if len(sys.argv) > 2:
        shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[2:]]
    for h, r, t in shapes:
        res = measure(h, r, t, paths=("flashmla",), kv_fp8=variant.startswith("fp8-"))[0]
        print(f"ABLATE {variant} {h}x{r}x{t}: {res['us']:.2f} us, {res['TFLOPs']:.0f} TFLOP/s, "
              f"roofline {res['roofline']:.2f}", flush=True)
