"""What limits flashmla's warp-specialised kernel (wgmma_ws, sm_90): per-call time over a topk
sweep with timing-only variants (results wrong by design): ``full``, ``nogather`` (the producer
copies nothing: the products and softmax alone), ``nomma`` (no wgmma: the gathers alone). The
slope over topk is the time per 64-token tile, the intercept the fixed cost of a program.
``rr-VARIANT`` does the same to the round-schedule kernel (wgmma_rr, bf16 at 64+ heads where the
launch has enough programs; ``nogather`` there skips its KV copies, not q's).
Run from the repository root on an sm_90 GPU:
``PYTHONPATH=. python scripts/ws_ablate.py [rr-]VARIANT [HEADSxROWSxTOPK ...]`` (the kernel
table's method, graphattn.bench.kernels.measure)."""
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from graphattn.kernels import wgmma_rr, wgmma_ws
from tn_ablate import _no_mma, _no_wait  # the same stand-ins for wgmma (this script's folder is on sys.path)


@gluon.jit
def _no_gather(kv_ptr, stride_kv, pool, idx_n, idx_r, kn_slot, kr_slot, D_NOPE: gl.constexpr,
               D_ROPE: gl.constexpr, gather_n: gl.constexpr, gather_r: gl.constexpr):
    pass


@gluon.jit
def _no_load(dst, ptrs, mask=None):
    pass


# variant -> (module, name, stand-in) patches applied before the first compile
VARIANTS = {
    "full": (),
    "nogather": ((wgmma_ws, "_gather_tile", _no_gather),),
    "nomma": ((wgmma_ws, "warpgroup_mma", _no_mma), (wgmma_ws, "warpgroup_mma_wait", _no_wait)),
    "rr-full": (),
    "rr-nogather": ((wgmma_rr, "_async_load", _no_load),),
    "rr-nomma": ((wgmma_rr, "warpgroup_mma", _no_mma), (wgmma_rr, "warpgroup_mma_wait", _no_wait)),
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
        res = measure(h, r, t, paths=("flashmla",))[0]
        print(f"ABLATE {variant} {h}x{r}x{t}: {res['us']:.2f} us, {res['TFLOPs']:.0f} TFLOP/s, "
              f"roofline {res['roofline']:.2f}", flush=True)
