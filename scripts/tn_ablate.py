"""What limits wgmma_tn on FP8 tokens: timing-only variants that leave a stage out (results
wrong by design). Usage, from the repository root on an sm_90 GPU:
``PYTHONPATH=. python scripts/tn_ablate.py VARIANT`` with VARIANT in full, nodeq (no
dequantisation: the in-place kernel's consumers only wait for the bytes; the raw tile's
(RAW_TILE) take each byte as a 16-bit value, no arithmetic), nomma (no wgmma), nodeq_nomma,
nogather (the producer copies nothing: the consumers read whatever the shared memory holds),
novst (the raw tile's consumers do not store V: ``V^T P^T`` reads whatever their bf16 tile
holds); variants combine (``nogather_novst``)."""
import sys
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from graphattn.kernels import wgmma_tn, wgmma_ws


@gluon.jit
def _wait_only(t, kv_ready, k_raw, k_nope, k_scale_rows, k_rope_bits, k_rope,
               BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    mbarrier.wait(kv_ready.index(t % 2), (t // 2) & 1)


@gluon.jit
def _bytes_as_values(x, scale, dtype: gl.constexpr):
    return x.to(gl.uint16).to(dtype, bitcast=True)


@gluon.jit
def _no_gather(kv_ptr, stride_kv, pool, idx_n, idx_c, raw_dst, kr_bits, sc_slot,
               D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
               gather_8: gl.constexpr, gather_r: gl.constexpr, gather_c: gl.constexpr):
    pass


@gluon.jit
def _no_mma(a, b, acc, use_acc=True, is_async=False):
    return acc


@gluon.jit
def _no_wait(num_outstanding=0, deps=None):
    if len(deps) == 1:
        return deps[0]
    else:
        return deps


@gluon.jit
def _operand_no_store(x, scale, kn, b: gl.constexpr, a_layout: gl.constexpr):
    return wgmma_tn._scores_a(wgmma_tn._dequantised(x, scale, kn.dtype), a_layout)


def apply(variant):
    if "nodeq" in variant:
        wgmma_tn._dequantise_tile = _wait_only
        wgmma_tn._dequantised = _bytes_as_values
    if "nogather" in variant:
        wgmma_ws._gather_fp8 = _no_gather
    if "novst" in variant:
        wgmma_tn._scores_operand = _operand_no_store
    if "nomma" in variant:
        wgmma_tn.warpgroup_mma = _no_mma
        wgmma_tn.warpgroup_mma_wait = _no_wait


if __name__ == "__main__":
    variant = sys.argv[1]
    apply(variant)
    sys.path.insert(0, "scripts"); sys.path.insert(0, "tests")
    from tn_smoke import time_us  # noqa: E402
    for heads, rows in [(16, 512), (16, 64)]:
        for fp8 in (True, False):
            if ("nodeq" in variant or "nogather" in variant) and not fp8:
                continue
            t, name = time_us(heads, rows, 2048, fp8)
            print(f"ABLATE {variant} {heads}x{rows} {'fp8' if fp8 else 'bf16'}: {t:.1f} us ({name})", flush=True)
