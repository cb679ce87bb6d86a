"""GPU check of flashmla's cluster merge (``wgmma_rr``, and ``wgmma_ws`` with FP8 tokens, with
``CLUSTER=2``: two splits of a (row, head block) run as a thread-block cluster and merge in the
kernel) against the float64 reference (of the dequantised cache for FP8 tokens).

``PYTHONPATH=. python scripts/cluster_check.py [mem]`` on an sm_90 GPU. Every case runs its launch
three times, each from a NaN-poisoned workspace and NaN-poisoned outputs, and must give the same
bits each time (a merge that read the peer's half before it was written would show NaN or differ)
within the tolerance of the float64 reference; the inputs have indices -1 and past the pool, and
cases add NaN in every unselected token, an all-invalid row, an empty second split, fp16 q and kv,
masked heads (70, 100), many waves of clusters (two splits forced at 200-257 rows) and 656-byte FP8
tokens (``fp8``: ``wgmma_ws``, whose producer merges). Prints one
JSON line per case, then ``ALL OK`` (exit 0) or ``FAILED n``. ``mem``: two small cluster cases,
for ``compute-sanitizer --tool memcheck``. ``race``: one launch of each merge (bf16 and FP8 tokens) for
``compute-sanitizer --tool racecheck`` (see :func:`racecheck_launch`).
"""
from __future__ import annotations

import json
import math
import sys

import torch

from flashmla_ab import errors_of_tolerance  # scripts/, this script's folder
from graphattn.common.kv_layout import quantize_kv
from graphattn.common.platform import current_platform
from graphattn.common.reference import sparse_mla_reference
from graphattn.common.tolerances import tolerance
from graphattn.kernels import sparse_mla_flashmla
from graphattn.kernels.flashmla import bind_flashmla, plan_flashmla
from graphattn.kernels.launch import clear_launch_plans
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

POOL = 300_000
CASES = [
    dict(rows=64, heads=64, topk=2048),
    dict(rows=24, heads=100, topk=2077, dtype=torch.float16),
    dict(rows=33, heads=128, topk=2077, special="nan emptyrow"),
    dict(rows=64, heads=64, topk=2048, special="emptysplit emptyrow nan"),
    dict(rows=56, heads=64, topk=8192),
    dict(rows=24, heads=70, topk=2048, dtype=torch.float16, special="nan"),
    dict(rows=257, heads=64, topk=2048, max_splits=2, target_programs=10**6),
    dict(rows=200, heads=128, topk=2077, special="emptyrow", max_splits=2, target_programs=10**6),
    dict(rows=64, heads=64, topk=2048, cluster_merge=0),  # the same shape through the combine
    # 656-byte FP8 tokens: wgmma_ws, whose producer merges
    dict(rows=64, heads=64, topk=2048, special="fp8"),
    dict(rows=28, heads=100, topk=2077, dtype=torch.float16, special="fp8 nan emptyrow"),
    dict(rows=32, heads=128, topk=2048, special="fp8 emptysplit"),
    dict(rows=200, heads=64, topk=2077, special="fp8", max_splits=2, target_programs=10**6),
    dict(rows=64, heads=64, topk=2048, special="fp8", cluster_merge=0),
]
MEM_CASES = [dict(rows=24, heads=100, topk=2077, special="emptyrow"),
             dict(rows=80, heads=64, topk=1024, max_splits=2, target_programs=10**6),
             dict(rows=28, heads=100, topk=2077, special="fp8 emptyrow")]


def case(rows: int, heads: int, topk: int, dtype: torch.dtype = torch.bfloat16, special: str = "",
         **override) -> bool:
    """One case (``override``: flashmla launch settings); True if it passed and merged in a cluster
    (or, with ``cluster_merge=0``, did not)."""
    torch.manual_seed(rows * 1000 + heads + topk)
    scale = 1 / math.sqrt(576)
    with current_platform().launch_table.override("flashmla", **override):
        clear_launch_plans()
        q = torch.randn(rows, heads, 576, device="cuda").to(dtype)
        kv = torch.randn(POOL, 576, device="cuda").to(dtype)
        idx = torch.randint(0, POOL, (rows, topk), device="cuda", dtype=torch.int32)
        idx[:, ::7] = -1
        idx[:, 3::11] = POOL + 5
        if "emptyrow" in special:
            idx[0] = -1
        if "emptysplit" in special:  # the second split sees nothing valid in any row
            idx[:, topk // 2 + 64:] = -1
        fp8 = "fp8" in special
        if fp8:
            kv = quantize_kv(kv)
        if "nan" in special:  # NaN in every token no row selects (FP8: 0xFF bytes, NaN scales and rope)
            selected = torch.zeros(POOL, dtype=torch.bool, device="cuda")
            selected[idx[(idx >= 0) & (idx < POOL)].long()] = True
            kv[~selected] = 0xFF if fp8 else float("nan")
        splits = 2 if override.get("max_splits") else 8
        ws_out = torch.empty(rows, splits, heads, 512, device="cuda")
        ws_lse = torch.empty(rows, splits, heads, device="cuda")
        plan = plan_flashmla(rows, heads, topk, splits, kv_fp8=fp8)
        sparse_mla_flashmla(q, kv, idx, scale, ws_out, ws_lse)  # compile
        out = torch.empty(rows, heads, 512, device="cuda", dtype=dtype)
        lse = torch.empty(rows, heads, device="cuda")
        call = bind_flashmla(plan, idx, scale, ws_out, ws_lse)
        runs = []
        for _ in range(3):
            for t in (ws_out, ws_lse, out, lse):
                t.fill_(float("nan"))
            call(q, kv, dst=(out, lse))
            torch.cuda.synchronize()
            runs.append((out.clone(), lse.clone()))
        same = all(torch.equal(o, runs[0][0]) and torch.equal(s, runs[0][1]) for o, s in runs)
        ref_out, ref_lse = sparse_mla_reference(q, kv, idx, scale)  # FP8: of the dequantised cache
        err, lse_err, same_inf = errors_of_tolerance(out, lse, ref_out, ref_lse,
                                                     tolerance(dtype, "fp8" if fp8 else "auto"))
        ok = same and err <= 1 and lse_err <= 1 and same_inf and not out.isnan().any().item()
        cluster = plan.main.kwargs.get("CLUSTER", 0)
        print(json.dumps({"case": f"{heads}x{rows}x{topk}", "dtype": str(dtype), "special": special,
                          "override": override, "kernel": plan.kernel, "splits": plan.splits, "cluster": cluster,
                          "combine": plan.combine is not None, "repeatable": same,
                          "out_err_of_tol": round(err, 4), "lse_err_of_tol": round(lse_err, 4), "ok": ok}),
              flush=True)
        clear_launch_plans()
    return ok and (cluster == 2) == (override.get("cluster_merge", 1) != 0)


@gluon.jit
def _no_cluster_arrive(RELEASE: gl.constexpr):
    pass


@gluon.jit
def _no_cluster_wait():
    pass


def without_cluster_barrier() -> None:
    """From now on in this process: the Gluon kernels compile their cluster barrier as nothing,
    and ``Launch`` launches ``CLUSTER=2`` without clusters (each CTA alone). For racecheck only:
    a merge then reads its peer's half unordered, so outputs are meaningless."""
    from graphattn.kernels import launch, wgmma_rr, wgmma_ws

    for module in (wgmma_rr, wgmma_ws):
        module._cluster_arrive = _no_cluster_arrive
        if hasattr(module, "_cluster_wait"):
            module._cluster_wait = _no_cluster_wait
    launch.Launch.cluster = property(lambda self: 1)


def racecheck_launch(rows: int = 56, heads: int = 64, topk: int = 512, fp8: bool = False) -> None:
    """One launch of the cluster merge's code (``fp8``: ``wgmma_ws``'s, on 656-byte tokens; else
    ``wgmma_rr``'s) for ``compute-sanitizer --tool racecheck``, which did not finish on a cluster
    launch even of two CTAs (150 s), while the same code launched without clusters hung at its
    ``barrier.cluster`` even without the tool: :func:`without_cluster_barrier` (with it, both
    finish, on an H200 and under racecheck), then two splits forced. Racecheck checks shared
    memory, all of it CTA-local here (the staging in q's shared memory, the row weights; the
    hand-off between the two CTAs goes through global memory, ordered by the barrier left out).
    Prints ``launched`` with the plan."""
    without_cluster_barrier()
    with current_platform().launch_table.override("flashmla", max_splits=2, target_programs=10**6):
        clear_launch_plans()
        q = torch.randn(rows, heads, 576, device="cuda").bfloat16()
        kv = torch.randn(POOL, 576, device="cuda").bfloat16()
        if fp8:
            kv = quantize_kv(kv)
        idx = torch.randint(0, POOL, (rows, topk), device="cuda", dtype=torch.int32)
        ws_out = torch.zeros(rows, 2, heads, 512, device="cuda")
        ws_lse = torch.zeros(rows, 2, heads, device="cuda")
        plan = plan_flashmla(rows, heads, topk, 2, kv_fp8=fp8)
        if plan.main.kwargs.get("CLUSTER") != 2:
            raise SystemExit(f"{plan.kernel} at {heads}x{rows}x{topk} does not plan the cluster merge")
        bind_flashmla(plan, idx, 1 / math.sqrt(576), ws_out, ws_lse)(q, kv)
        torch.cuda.synchronize()
        print(f"launched {plan.kernel} CLUSTER={plan.main.kwargs.get('CLUSTER')} without clusters", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["race"]:
        racecheck_launch()
        racecheck_launch(fp8=True)
        sys.exit(0)
    cases = MEM_CASES if sys.argv[1:] == ["mem"] else CASES
    bad = sum(not case(**c) for c in cases)
    print(f"FAILED {bad}" if bad else "ALL OK")
    sys.exit(1 if bad else 0)
