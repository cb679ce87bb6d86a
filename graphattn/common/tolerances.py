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

def tolerance(dtype: torch.dtype) -> Tolerance:
    """The tolerance for ``dtype`` (``KeyError`` naming the known dtypes otherwise)."""
    if dtype not in TOLERANCES:
        raise KeyError(f"no conformance tolerance for {dtype}; known: {list(TOLERANCES)}")
    return TOLERANCES[dtype]
