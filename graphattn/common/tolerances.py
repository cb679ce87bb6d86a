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

# FP8 KV (656-byte tokens) is compared with the reference of the cache dequantised the way the
# kernels multiply it (fp8 x float32 scale, rounded to q's dtype, on a GPU and under the
# interpreter alike; the quantisation error itself is docs/backends.md's), so it is held to the
# plain tolerances. Against the *exact* dequantised values, the rounding of each value to bf16
# (relative 2^-9) showed on the H200 as out errors up to 0.07 where attention concentrates on a
# few tokens: that is what this comparison leaves out, not a looser bar.
FP8_TOLERANCES = TOLERANCES


def tolerance(dtype: torch.dtype, kv_dtype: str = "auto") -> Tolerance:
    """The tolerance for q dtype ``dtype`` with KV layout ``kv_dtype`` (``"auto"``: kv in q's
    dtype; ``"fp8"``: 656-byte FP8 tokens, against the reference of the dequantised cache).
    ``KeyError`` naming the known dtypes otherwise."""
    table = FP8_TOLERANCES if kv_dtype == "fp8" else TOLERANCES
    if dtype not in table:
        raise KeyError(f"no conformance tolerance for {dtype} (kv {kv_dtype}); known: {list(table)}")
    return table[dtype]
