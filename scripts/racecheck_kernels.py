"""One small launch of each of flashmla's sm_90 Gluon kernels, with bf16 kv and with 656-byte FP8
tokens, in one split (the output stored directly) and in several (partials and the combine), for
``compute-sanitizer --tool racecheck``; ``scripts/racecheck_triage.py`` then sorts what it
reports (the cluster merges have their own launches: ``scripts/cluster_check.py race``).

``PYTHONPATH=. compute-sanitizer --tool racecheck --print-limit 1000 python
scripts/racecheck_kernels.py > racecheck.log 2>&1; python scripts/racecheck_triage.py
racecheck.log`` on an sm_90 GPU (``scripts/gpu_racecheck.sh`` runs both). Prints one
``launched`` line per case and exits 1 if a case plans another kernel than its own.
"""
from __future__ import annotations

import math
import sys

import torch

from graphattn.kernels.flashmla import plan_flashmla

POOL = 4096
WS_SPLITS = 64
# (kernel, FP8 tokens, rows, heads, topk): each kernel in one split and in several on an H200;
# wgmma_tn with FP8 tokens through its ring of raw slots (1-2 tiles a split at 16 heads), through its raw
# tile (more tiles, 16 heads: small launches, as its loads make ~11,000 hazards a tile) and in
# place (32 heads);
# wgmma_rr's producer loads the indices early (IDX_EARLY, > 64 heads) in 128 x 8 (8 splits) and 100 x 70 (one).
CASES = [
    ("wgmma_rr", False, 150, 64, 256), ("wgmma_rr", False, 8, 128, 2048), ("wgmma_rr", False, 70, 100, 300),
    ("wgmma_ws", False, 40, 64, 64), ("wgmma_ws", False, 3, 64, 512),
    ("wgmma_tn", False, 200, 16, 256), ("wgmma_tn", False, 8, 16, 512),
    ("wgmma_ws", True, 150, 64, 256), ("wgmma_ws", True, 8, 64, 512),
    ("wgmma_tn", True, 200, 16, 128), ("wgmma_tn", True, 8, 16, 512),
    ("wgmma_tn", True, 70, 16, 400), ("wgmma_tn", True, 20, 16, 2048),
    ("wgmma_tn", True, 200, 32, 640), ("wgmma_tn", True, 64, 32, 2048),
    # wgmma_tn's head-major combine with several heads a program (HEADS 2, 16 and 8)
    ("wgmma_tn", False, 16, 16, 2048), ("wgmma_tn", False, 64, 20, 2077), ("wgmma_tn", True, 64, 16, 2048),
]


def plan_of(case, platform=None):
    """The flashmla plan of ``case`` (16-byte aligned inputs) on ``platform`` (default current)."""
    _, fp8, rows, heads, topk = case
    return plan_flashmla(rows, heads, topk, WS_SPLITS, kv_fp8=fp8, platform=platform)


def launch(case) -> bool:
    """Launch ``case`` once on the GPU; False if its plan runs another kernel."""
    from graphattn.common.kv_layout import quantize_kv
    from graphattn.kernels import sparse_mla_flashmla

    kernel, fp8, rows, heads, topk = case
    plan = plan_of(case)
    if plan.kernel != kernel:
        print(f"{case}: plans {plan.kernel}, not {kernel}", flush=True)
        return False
    torch.manual_seed(rows + heads + topk)
    q = torch.randn(rows, heads, 576, device="cuda").bfloat16()
    kv = torch.randn(POOL, 576, device="cuda").bfloat16()
    kv = quantize_kv(kv) if fp8 else kv
    idx = torch.randint(-1, POOL + 50, (rows, topk), device="cuda", dtype=torch.int32)
    ws_out = torch.empty(rows, WS_SPLITS, heads, 512, device="cuda")
    ws_lse = torch.empty(rows, WS_SPLITS, heads, device="cuda")
    out, _ = sparse_mla_flashmla(q, kv, idx, 1 / math.sqrt(576), ws_out, ws_lse)
    torch.cuda.synchronize()
    heads_a_program = plan.combine.kwargs.get("HEADS", 1) if plan.combine else None
    print(f"launched {kernel} fp8={fp8} {heads}x{rows}x{topk}: {plan.splits} splits, combine heads a "
          f"program {heads_a_program}, finite {bool(out.isfinite().all())}", flush=True)
    return True


if __name__ == "__main__":
    sys.exit(0 if all([launch(case) for case in CASES]) else 1)
