"""Errors of flashmla on 656-byte FP8 tokens (on sm_90 its warp-specialised Gluon kernel) against
the float64 reference of the cache dequantised into q's dtype, relative to the tolerance of
``tolerance(dtype, "fp8")`` (the plain one; 1.0 = at the tolerance), for bf16 and fp16 q; the
Triton FP8 tiles (trtllm) on the same inputs beside it, as the method's own error. GPU only.

Inputs: q = 3·N(0, 1) (sharper attention than the test suites'), KV quantised from 4·N(0, 1),
indices from −1 to past the pool, row 1 (where rows > 1) all −1.
    usage: PYTHONPATH=. python3 scripts/fp8_gluon_errors.py
Exit code 1 if an output is not finite, an empty row is not (0, −inf), or an lse error is over
its tolerance; out errors over 1.0 are marked ``OVER`` (see docs/benchmarks.md, "FP8 KV cache").
"""

from __future__ import annotations

import math
import sys

import torch

from graphattn.common.kv_layout import quantize_kv
from graphattn.common.metadata import GraphMetadata
from graphattn.common.reference import sparse_mla_reference
from graphattn.common.tolerances import tolerance
from graphattn.kernels import sparse_mla_flashmla, sparse_mla_trtllm, split_plan
from graphattn.kernels.flashmla import kernel_name

SHAPES = [(64, 3, 300, 1000), (16, 1, 2048, 5000), (128, 8, 2048, 20000), (20, 2, 130, 500), (64, 64, 2048, 200000)]


def ratio(err: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> float:
    r = (err.abs() / (atol + rtol * ref.abs().nan_to_num(0.0, 0.0, 0.0))).nan_to_num(0.0)
    return float(r.max())


def main() -> int:
    ok = True
    scale = 576 ** -0.5
    for dtype in (torch.bfloat16, torch.float16):
        tol = tolerance(dtype, "fp8")
        torch.manual_seed(0)
        for h, r, topk, pool in SHAPES:
            q = (torch.randn(r, h, 576) * 3.0).to(dtype).cuda()
            kv = quantize_kv((torch.randn(pool, 576) * 4).cuda())
            idx = torch.randint(-1, pool + 50, (r, topk), dtype=torch.int32).cuda()
            if r > 1:
                idx[1] = -1
            md = GraphMetadata(r, h, topk, dtype, "cuda", **split_plan("flashmla", h, topk, kv_fp8=True).metadata_kwargs())
            out, lse = sparse_mla_flashmla(q, kv, idx, scale, *md.workspace_for(r))
            mdt = GraphMetadata(r, h, topk, dtype, "cuda", **split_plan("trtllm", h, topk, kv_fp8=True).metadata_kwargs())
            tout, _ = sparse_mla_trtllm(q, kv, idx, scale, mdt.counter_for(r), *mdt.workspace_for(r))
            ref_out, ref_lse = sparse_mla_reference(q, kv, idx, scale)
            finite = ref_lse.isfinite()
            eo = ratio(out.double() - ref_out, ref_out, tol.atol, tol.rtol)
            el = ratio(torch.where(finite, lse.double() - ref_lse, 0.0), ref_lse, tol.lse_atol, tol.lse_rtol)
            et = ratio(tout.double() - ref_out, ref_out, tol.atol, tol.rtol)
            empty = bool((out[~finite] == 0).all() and (lse[~finite] == -math.inf).all())
            good = bool(out.isfinite().all()) and empty and el <= 1.0
            ok &= good
            print(f"{str(dtype)[6:]:8s} {h:3d}x{r:<3d} topk {topk:5d}: {kernel_name(q, kv, topk)} out {eo:.3f}"
                  f"{' OVER' if eo > 1 else ''} lse {el:.4f}; trtllm (Triton FP8) out {et:.3f}; "
                  f"empty rows ok {empty}{'' if good else '  FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
