"""Dtype tolerances against the float64 reference, shared by the conformance suite, the fuzz
harness and ``graphattn bench``'s output check: ``(dtype, atol, rtol)`` for ``out`` plus a tighter
pair for ``lse``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """``(dtype, atol, rtol)`` for ``out`` against the float64 reference, and the ``lse`` pair.

    ``lse`` is float32 from exact products of the rounded inputs, so it is held much tighter.
    """

    dtype: torch.dtype
    atol: float
    rtol: float
    lse_atol: float
    lse_rtol: float


# Inputs are rounded to the dtype before the reference sees them, so the error left is the
# kernel's: probabilities rounded to the dtype for the PV product, and the output rounding
# (measured: about one ulp of the output, e.g. 1.6e-2 at |out| = 2..4 in bf16).
TOLERANCES = {
    torch.float32: Tolerance(torch.float32, 1e-4, 1e-4, 1e-4, 1e-5),
    torch.float16: Tolerance(torch.float16, 2e-3, 2e-3, 1e-3, 1e-4),
    torch.bfloat16: Tolerance(torch.bfloat16, 1e-2, 1.6e-2, 1e-3, 1e-4),
}

# FP8 KV (656-byte tokens) is compared with the reference of the *exactly* dequantised cache,
# which is what the kernels multiply: they take the FP8 values exactly in q's dtype (e4m3 has 4
# significant bits) and apply each token's float32 block scale to the float32 products, so the
# scores (and lse) carry no dequantisation rounding at all. The output does: it is
# ``sum_n w_n v_n / sum_n p_n`` with the weights ``w_n = p_n * scale_n`` rounded to q's dtype
# (unit roundoff u = 2^-9 bf16, 2^-11 fp16) before the PV product. With |dw_n| <= u w_n,
#     |d out_d| <= u * sum_n p_n |scale_n fp8_nd| / sum_n p_n <= u * max_n |v_nd|,
# the same bound as the plain path's rounded probabilities, but the plain path's largest weight
# (p = 1) is exact and here it is not (p * scale rarely is a bf16/fp16 value), so the bound is
# approached where attention concentrates on a few tokens. With FP8 caches of amplitude ~18
# (the kernel tests quantise 4 x N(0, 1)) the bound is 0.035 in bf16 and 0.009 in fp16; the
# interpreter, which rounds the weights as a GPU does, measured up to 1.2x the plain atol
# (0.0118 bf16, 0.0024 fp16). Hence twice the plain atol for out; rtol and the lse pair stay
# the plain ones (lse errors measured ~1e-3 of its tolerance). float32 q rounds nothing.
FP8_TOLERANCES = {
    dtype: Tolerance(dtype, tol.atol * (2 if dtype in (torch.float16, torch.bfloat16) else 1),
                     tol.rtol, tol.lse_atol, tol.lse_rtol)
    for dtype, tol in TOLERANCES.items()
}


def tolerance(dtype: torch.dtype, kv_dtype: str = "auto") -> Tolerance:
    """The tolerance for q dtype ``dtype`` with KV layout ``kv_dtype`` (``"auto"``: kv in q's
    dtype; ``"fp8"``: 656-byte FP8 tokens, against the reference of the dequantised cache).
    ``KeyError`` naming the known dtypes otherwise."""
    table = FP8_TOLERANCES if kv_dtype == "fp8" else TOLERANCES
    if dtype not in table:
        raise KeyError(f"no conformance tolerance for {dtype} (kv {kv_dtype}); known: {list(table)}")
    return table[dtype]
