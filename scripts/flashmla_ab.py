"""A/B of launch settings of flashmla's Gluon kernels on an sm_90 GPU: the kernel table's method
(graphattn.bench.kernels.measure), flashmla only, each variant a launch-table override of
flashmla's settings in its own process, alternated.

``PYTHONPATH=. python scripts/flashmla_ab.py --kernel wgmma_rr --alternate 2 base L2_PREFETCH=1
kernel=wgmma_rr,BLOCK_N=128 [--kv-fp8] [--shapes 128x64x2048 ...]`` runs each variant N times,
alternating, each in a fresh process of at most 150 s. A variant is ``base`` (no override) or
``KEY=VALUE`` pairs joined by commas (ints where they parse); ``PTX_L2_PREFETCH=128`` or ``256``
is no launch setting but a PTX rewrite giving the kernels' ``cp.async`` copies that L2 prefetch
size, ``PTX_EVICT=last`` or ``first`` one giving them that L2 eviction policy, and
``CARVEOUT=100`` gives every compiled kernel that preferred shared-memory carveout (percent).
``c_KEY=VALUE`` overrides key ``KEY`` of the combine's launch setting (``flashmla_combine``:
``c_PDL=1,c_launch_pdl=1`` makes it a programmatic dependent launch), and
``C_SMEM=bytes`` launches every combine with that much dynamic shared memory (at least its own),
which caps how many of its programs share an SM. ``tn_min_rows_H=ROWS`` is no launch setting
either: it sets ``TN_MIN_ROWS[H]`` of graphattn.cuda.configs, the rows from which ``H``-head
blocks (16 or 32) run ``wgmma_tn`` (with ``kernel=...`` naming the kernel the shapes then run).
``--kv-fp8``: 656-byte FP8 tokens. A process first checks launches at topk 2077 where the
kernel runs (:func:`checks_for`: by default 128 heads x 257 rows in one split and x 28 rows in
several; indices out of range included, outputs NaN-poisoned) against the float64 reference (of
the dequantised cache with FP8; ``--checks HEADSxROWSxTOPK ...`` replaces them, ``--checks none``
skips them for timing-only variants) and exits 1 if one is off or runs another kernel than the
variant's ``kernel`` (default ``--kernel``); then it prints one JSON line per shape, refusing
shapes where that kernel does not run (the overrides apply to whatever kernel flashmla picks).
The script prints each variant's mean per shape and exits 1 if a run failed its check or did
not finish.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys

# The checks' (rows, heads, topk): a launch with more programs than SMs and no splits, one with
# splits (and its combine); wgmma_tn's at its 16 and 32 heads, wgmma_ws's where bf16 kv runs it.
CHECKS = {"wgmma_tn": ((257, 16, 2077), (24, 16, 2077), (257, 32, 2077), (64, 32, 2077)),
          "wgmma_ws": ((1, 128, 2077), (2, 64, 2077))}
DEFAULT_CHECKS = ((257, 128, 2077), (28, 128, 2077))
SHAPES = ["128x64x2048", "128x512x2048", "128x64x8192", "64x64x2048", "64x512x2048", "64x128x2048",
          "128x8x2048", "32x8x2048"]


def checks_for(kernel: str, kv_fp8: bool = False) -> tuple[tuple[int, int, int], ...]:
    """The checks' (rows, heads, topk) for ``kernel``: :data:`CHECKS`' where it has some, else
    :data:`DEFAULT_CHECKS`; FP8 tokens run wgmma_ws at 128 heads too, so its FP8 checks begin with
    those (many programs without splits, and with)."""
    checks = CHECKS.get(kernel, DEFAULT_CHECKS)
    if kv_fp8 and kernel == "wgmma_ws":
        return DEFAULT_CHECKS + checks
    return checks


def parse_variant(text: str) -> dict[str, int | str]:
    """``base`` -> {}; ``A=1,kernel=wgmma_rr`` -> {"A": 1, "kernel": "wgmma_rr"} (ints where
    they parse)."""
    if text == "base":
        return {}
    pairs = (pair.split("=") for pair in text.split(","))
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in pairs}


def errors_of_tolerance(out, lse, ref_out, ref_lse, tol) -> tuple[float, float, bool]:
    """``(out error, lse error, same -inf)``: the worst errors of ``out``/``lse`` against the float64
    reference as fractions of the allowed ``atol + rtol * |ref|`` (<= 1 passes; lse where the
    reference is finite), and whether lse is -inf exactly where the reference's is."""
    err = ((out.double() - ref_out).abs() / (tol.atol + tol.rtol * ref_out.abs())).max().item()
    finite = ref_lse.isfinite()
    lse_err = ((lse.double() - ref_lse).abs()[finite]
               / (tol.lse_atol + tol.lse_rtol * ref_lse.abs()[finite])).max().item()
    return err, lse_err, bool(lse.isinf().equal(~finite))


def check(kernel: str, variant: str, rows: int, heads: int, topk: int, kv_fp8: bool = False,
          pool: int = 600_000) -> bool:
    """One launch (the split plan's workspace, outputs NaN-poisoned, indices -1 and past the
    pool included) against the float64 reference (of the dequantised cache with ``kv_fp8``);
    prints a JSON line."""
    import torch

    from graphattn.common.kv_layout import quantize_kv
    from graphattn.common.metadata import GraphMetadata
    from graphattn.common.reference import sparse_mla_reference
    from graphattn.common.tolerances import tolerance
    from graphattn.kernels import sparse_mla_flashmla, split_plan
    from graphattn.kernels.flashmla import plan_flashmla

    q = torch.randn(rows, heads, 576, device="cuda").bfloat16()
    kv = torch.randn(pool, 576, device="cuda").bfloat16()
    if kv_fp8:
        kv = quantize_kv(kv)
    idx = torch.randint(0, pool, (rows, topk), device="cuda", dtype=torch.int32)
    idx[:, ::7] = -1
    idx[:, 3::11] = pool + 5
    md = GraphMetadata(rows, heads, topk, torch.bfloat16, "cuda",
                       **split_plan("flashmla", heads, topk, kv_fp8=kv_fp8).metadata_kwargs())
    ws_out, ws_lse = md.workspace_for(rows)
    ws_out.fill_(float("nan"))
    ws_lse.fill_(float("nan"))
    plan = plan_flashmla(rows, heads, topk, ws_out.shape[1], kv_fp8=kv_fp8)
    out, lse = sparse_mla_flashmla(q, kv, idx, 1 / math.sqrt(576), ws_out, ws_lse)
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, 1 / math.sqrt(576))  # FP8: it dequantises
    err, lse_err, same_inf = errors_of_tolerance(out, lse, ref_out, ref_lse,
                                                 tolerance(torch.bfloat16, "fp8" if kv_fp8 else "auto"))
    ok = err <= 1 and lse_err <= 1 and same_inf and plan.kernel == kernel
    print(json.dumps({"variant": variant, "check": f"{heads}x{rows}x{topk}", "kernel": plan.kernel,
                      "splits": plan.splits, "cluster": plan.main.cluster, "out_err_of_tol": err,
                      "lse_err_of_tol": lse_err, "ok": ok}), flush=True)
    return ok


def _rewrite_ptx(tag: str, rewrite) -> None:
    """Pass every compile's PTX through ``rewrite`` (str -> str), in a Triton cache folder of its
    own (the hook is not part of Triton's cache key; ``tag`` names the folder and triton 3.9's
    key)."""
    import tempfile

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton_{tag}_")
    from triton import knobs

    def hook(backend=None, stages=None, options=None, language=None, capability=None):
        if stages is None:  # triton >= 3.9 also asks the hook for a cache key: (key, hash)
            return tag, tag
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: rewrite(make_ptx(src, metadata))

    knobs.runtime.add_stages_inspection_hook = hook


def _l2_prefetch_ptx(size: int) -> None:
    """Give every compile's ``cp.async`` copies ``.L2::{size}B`` (L2 fetches that many bytes
    around a miss; Gluon's async copy has no such option)."""
    _rewrite_ptx(f"l2_prefetch_{size}", lambda ptx: ptx.replace(
        "cp.async.cg.shared.global [", f"cp.async.cg.shared.global.L2::{size}B ["))


def evict_ptx(ptx: str, policy: str) -> str:
    """``ptx`` with every ``cp.async`` copy given an L2 eviction policy (``last`` or ``first``):
    a ``createpolicy`` right before each copy, its register appended to the copy (Gluon's async
    copy drops its ``eviction_policy`` under triton 3.6; one policy register live through the
    whole kernel made the producer spill)."""
    if "cp.async.cg.shared.global [" not in ptx:
        return ptx
    ptx = re.sub(r"(\t\.reg \.b64 \t%rd<\d+>;)", r"\1\n\t.reg .b64 \t%evpol;", ptx, count=1)
    return re.sub(r"cp\.async\.cg\.shared\.global (\[[^;]*);",
                  f"createpolicy.fractional.L2::evict_{policy}.b64 \t%evpol, 1.0;\n\t"
                  r"cp.async.cg.shared.global.L2::cache_hint \1, %evpol;", ptx)


def _evict_ptx(policy: str) -> None:
    """Give every compile's ``cp.async`` copies the L2 eviction policy ``policy`` (:func:`evict_ptx`)."""
    _rewrite_ptx(f"evict_{policy}", lambda ptx: evict_ptx(ptx, policy))


# cuFuncSetAttribute's attributes (cuda.h's CUfunction_attribute)
_MAX_DYNAMIC_SHARED_SIZE_BYTES, _PREFERRED_SHARED_MEMORY_CARVEOUT = 8, 9


def _set_function_attribute(function: int, attribute: int, value: int) -> None:
    """``cuFuncSetAttribute(function, attribute, value)`` through the driver library."""
    import ctypes

    err = ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(ctypes.c_void_p(function), attribute, ctypes.c_int(value))
    if err:
        raise RuntimeError(f"cuFuncSetAttribute(attribute {attribute}, {value}) failed: CUresult {err}")


def _carveout(percent: int) -> None:
    """Give every kernel this process compiles the preferred shared-memory carveout ``percent``
    (``cuFuncSetAttribute(..., CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT)``, 100: the
    most shared memory), set once per compiled function as its first launch returns it."""
    from graphattn.kernels import launch

    done: set[int] = set()
    plain = launch.Launch.__call__

    def call(self, *args):
        kernel = plain(self, *args)
        function = getattr(kernel, "function", None)
        if function is not None and function not in done:
            _set_function_attribute(function, _PREFERRED_SHARED_MEMORY_CARVEOUT, percent)
            done.add(function)
        return kernel

    launch.Launch.__call__ = call


def _combine_smem(size: int) -> None:
    """Launch every combine (a kernel whose name holds ``combine``) with ``size`` bytes of dynamic
    shared memory, or its own need where that is more: fewer of its programs fit on an SM, so
    those a programmatic dependent launch starts early do not crowd onto the few SMs the split
    kernel leaves idle (``packed_metadata``'s third field is the launch's dynamic shared memory;
    above 48 KB the function must allow it: ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``)."""
    from graphattn.kernels import launch

    done: set[int] = set()
    plain = launch.Launch.__call__

    def call(self, *args):
        if "combine" in self.name:
            kernel = self.fn.warmup(*args, grid=self.grid, **self.kwargs)
            if hasattr(kernel, "_init_handles"):
                kernel._init_handles()
            packed = kernel.packed_metadata
            if id(kernel) not in done:
                want = max(size, packed[2])
                _set_function_attribute(kernel.function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, want)
                kernel.packed_metadata = (*packed[:2], want, *packed[3:])
                done.add(id(kernel))
        return plain(self, *args)

    launch.Launch.__call__ = call


def apply_script_settings(settings: dict) -> dict:
    """Apply, in this process, the variant's keys that are no launch setting (``PTX_L2_PREFETCH``,
    ``tn_min_rows_H``, ``CARVEOUT``: :func:`_carveout`, ``C_SMEM``: :func:`_combine_smem`);
    returns the launch-table overrides left (the ``c_`` keys included)."""
    settings = dict(settings)
    if "C_SMEM" in settings:
        _combine_smem(settings.pop("C_SMEM"))
    if "CARVEOUT" in settings:
        _carveout(settings.pop("CARVEOUT"))
    if "PTX_L2_PREFETCH" in settings:  # a PTX rewrite (see _l2_prefetch_ptx)
        _l2_prefetch_ptx(settings.pop("PTX_L2_PREFETCH"))
    if "PTX_EVICT" in settings:  # a PTX rewrite (see evict_ptx)
        _evict_ptx(settings.pop("PTX_EVICT"))
    for key in [k for k in settings if k.startswith("tn_min_rows_")]:  # where wgmma_tn takes over
        from graphattn.cuda import configs

        configs.TN_MIN_ROWS[int(key.rsplit("_", 1)[1])] = settings.pop(key)
    return settings


def run_variant(kernel: str, variant: str, shapes: list[str], kv_fp8: bool = False,
                checks: list[str] | None = None) -> int:
    settings = apply_script_settings(parse_variant(variant))
    from graphattn.bench import kernels as kb
    from graphattn.common.platform import current_platform
    from graphattn.kernels.flashmla import plan_flashmla
    from graphattn.kernels.launch import clear_launch_plans

    kernel = settings.get("kernel", kernel)  # a variant may pick the kernel itself
    settings, combine = split_combine_keys(settings)
    table = current_platform().launch_table
    with table.override("flashmla", **settings), table.override("flashmla_combine", **combine):
        clear_launch_plans()
        if checks == ["none"]:
            chosen = []  # a timing-only variant
        else:
            chosen = [_rows_first(c) for c in checks] if checks else checks_for(kernel, kv_fp8)
        for rows, heads, topk in chosen:
            if not check(kernel, variant, rows, heads, topk, kv_fp8):
                return 1
        for shape in shapes:
            heads, rows, topk = (int(x) for x in shape.split("x"))
            picked = plan_flashmla(rows, heads, topk, 32, kv_fp8=kv_fp8).kernel
            if picked != kernel:
                print(f"{shape} runs {picked}, not {kernel}: the variants do not apply there", flush=True)
                return 1
            us = kb.measure(heads, rows, topk, paths=("flashmla",), kv_fp8=kv_fp8)[0]["us"]
            print(json.dumps({"variant": variant, "shape": shape, "us": us}), flush=True)
        clear_launch_plans()
    return 0


def split_combine_keys(settings: dict) -> tuple[dict, dict]:
    """``(flashmla's overrides, the combine's)``: the ``c_KEY`` keys become the combine's ``KEY``
    (``launch_pdl`` a bool, as Triton takes it)."""
    combine = {k[2:]: bool(v) if k == "c_launch_pdl" else v for k, v in settings.items() if k.startswith("c_")}
    return {k: v for k, v in settings.items() if not k.startswith("c_")}, combine


def _rows_first(shape: str) -> tuple[int, int, int]:
    """``HEADSxROWSxTOPK`` -> ``(rows, heads, topk)``."""
    heads, rows, topk = (int(x) for x in shape.split("x"))
    return rows, heads, topk


def alternate(kernel: str, times: int, variants: list[str], shapes: list[str], kv_fp8: bool = False,
              checks: list[str] | None = None) -> int:
    results: dict[tuple[str, str], list[float]] = {}
    failed = 0
    for _ in range(times):
        for variant in variants:
            cmd = [sys.executable, __file__, "--kernel", kernel, "--one", variant, "--shapes", *shapes]
            cmd += ["--kv-fp8"] if kv_fp8 else []
            cmd += ["--checks", *checks] if checks else []
            try:
                run = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, timeout=150)
            except subprocess.TimeoutExpired as exc:
                print(f"{variant}: no result in {exc.timeout} s (a hang?)", flush=True)
                failed += 1
                continue
            sys.stdout.write(run.stdout + run.stderr[-2000:])
            failed += run.returncode != 0
            for line in run.stdout.splitlines():
                if line.startswith("{") and "us" in (rec := json.loads(line)):
                    results.setdefault((rec["shape"], variant), []).append(rec["us"])
    for shape in shapes:
        for variant in variants:
            if times_us := results.get((shape, variant)):
                print(f"{shape:>14} {variant:>22} {sum(times_us) / len(times_us):9.2f} us  "
                      f"({', '.join(f'{t:.2f}' for t in times_us)})")
    return 1 if failed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="wgmma_rr", help="the kernel the shapes must run")
    ap.add_argument("--alternate", type=int, default=2, help="runs of each variant")
    ap.add_argument("--one", help="run this one variant in this process")
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="HEADSxROWSxTOPK")
    ap.add_argument("--kv-fp8", action="store_true", help="656-byte FP8 KV tokens")
    ap.add_argument("--checks", nargs="+", help="HEADSxROWSxTOPK of the checks (default: checks_for); "
                    "'none' for timing-only variants, whose outputs are not the kernel's")
    ap.add_argument("variants", nargs="*", default=["base"])
    args = ap.parse_args()
    if args.one:
        sys.exit(run_variant(args.kernel, args.one, args.shapes, args.kv_fp8, args.checks))
    sys.exit(alternate(args.kernel, args.alternate, args.variants, args.shapes, args.kv_fp8, args.checks))
