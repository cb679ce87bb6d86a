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

# FP8 KV (656-byte tokens) takes the same table. It is compared with the reference of the cache
# dequantised into q's dtype (``kv_layout.dequantize_kv``: each value ``dtype(fp8 * scale)``,
# rounded once), and that cache is what every path multiplies, exactly as a plain cache in q's
# dtype: the same products, the same rounding of the probabilities P to q's dtype (the largest
# weight, p = 1, exact), the same output rounding. So the error left is the plain path's and
# the plain bound holds; FP8 adds no error of its own to this comparison. (Until the layout's
# numerics changed, the kernels applied each token's float32 block scale to the float32
# products, rounding every weight ``p * scale`` to q's dtype, the largest included, and the FP8
# out atol was twice the plain one.) Measured: the same GPU numerics emulated on the CPU (64-token
# tiles, P rounded to q's dtype) on the FP8 kernel tests' inputs (4 x N(0, 1) quantised, |v| up
# to 18) give out errors 0.5-0.8x the plain tolerance in bf16 and 0.2-0.4x in fp16, lse errors
# under 1e-3 of theirs (the H200 passed the FP8 tests at these tolerances with the same
# numerics at 2e41867). Sharper attention over such values (q std 3, 300 tokens) reaches 1.1x in
# bf16, as a plain bf16 cache of the same values does: the plain method's P rounding.


def tolerance(dtype: torch.dtype, kv_dtype: str = "auto") -> Tolerance:
    """The tolerance for q dtype ``dtype`` with KV layout ``kv_dtype`` (``"auto"``: kv in q's
    dtype; ``"fp8"``: 656-byte FP8 tokens, against the reference of the cache dequantised into
    q's dtype: the same tolerance, see above). ``KeyError`` naming the known dtypes otherwise."""
    if dtype not in TOLERANCES:
        raise KeyError(f"no conformance tolerance for {dtype} (kv {kv_dtype}); known: {list(TOLERANCES)}")
    return TOLERANCES[dtype]
