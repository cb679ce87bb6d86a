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

# FP8 KV (656-byte tokens), against the reference of the *dequantised* cache (what the kernels
# were given; the quantisation error itself is docs/backends.md's). The kernels round each
# dequantised value (fp8 x float32 scale) to q's dtype before the products, which plain kv never
# needs: relative 2^-9 per value in bf16, 2^-11 in fp16. Measured with a float64 model of that
# rounding at the `real` conformance shapes (16 and 128 heads, top-k 2048, q std 3): out off by
# up to 0.017 (|out| <= 3.9), lse by up to 0.0084 in bf16. The tolerances are twice that (fp16:
# a quarter of bf16's); the float32 torch backend dequantises exactly and sits far inside.
FP8_TOLERANCES = {
    torch.float32: TOLERANCES[torch.float32],
    torch.float16: Tolerance(torch.float16, 8e-3, 4e-3, 5e-3, 1e-4),
    torch.bfloat16: Tolerance(torch.bfloat16, 3.5e-2, 1.6e-2, 2e-2, 1e-4),
}


def tolerance(dtype: torch.dtype, kv_dtype: str = "auto") -> Tolerance:
    """The tolerance for q dtype ``dtype`` with KV layout ``kv_dtype`` (``"auto"``: kv in q's
    dtype; ``"fp8"``: 656-byte FP8 tokens, against the reference of the dequantised cache).
    ``KeyError`` naming the known dtypes otherwise."""
    table = FP8_TOLERANCES if kv_dtype == "fp8" else TOLERANCES
    if dtype not in table:
        raise KeyError(f"no conformance tolerance for {dtype} (kv {kv_dtype}); known: {list(table)}")
    return table[dtype]
