"""Compile every kernel ahead of time for sm_90, gfx942 and gfx950 (no GPU needed).

Run as ``TRITON_INTERPRET=0 python -m graphattn.kernels.aot [--targets sm90 gfx942 gfx950]``.
``TRITON_INTERPRET=0`` must be set explicitly on a machine without a GPU, because
``graphattn.kernels`` otherwise switches to the interpreter, whose kernels cannot be compiled.

Every distinct launch setting that ``graphattn.cuda.configs`` / ``graphattn.hip.configs`` can
choose is compiled (bf16, the general split path), and again reading 656-byte FP8 KV tokens
(``KV_FP8``, in the target's FP8 format: e4m3fn on sm_90 and gfx950, e4m3fnuz on gfx942; the
Gluon kernel and the combine do not read KV); the direct-store variants and fp16 are compiled
once per kernel. Prints one JSON line per compile and exits 1 if any failed. ``--ptxas`` adds what ``ptxas -v``
reports for each sm_90 kernel (registers, spill bytes, stack): spills are local-memory traffic
in every tile, which a compile that succeeds does not show.
Works with the ``ASTSource(fn, signature, constexprs)`` API of triton 3.3 to 3.9.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from .plan import LOOP_DEFAULTS, launch_parts

TARGETS = {"sm90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64)}
# kernel name -> (module, function, config path); a config runs the Triton function of its path
# unless its "kernel" key names another (the Gluon kernels, sm_90 only).
KERNELS = {
    "flashmla_split": ("graphattn.kernels.flashmla", "_flashmla_split_kernel", "flashmla"),
    "flashmla_wgmma_ws": ("graphattn.kernels.wgmma_ws", "_flashmla_ws_kernel", "flashmla"),
    "flashmla_wgmma_tn": ("graphattn.kernels.wgmma_tn", "_flashmla_tn_kernel", "flashmla"),
    "flashmla_wgmma_rr": ("graphattn.kernels.wgmma_rr", "_flashmla_rr_kernel", "flashmla"),
    "flashmla_combine": ("graphattn.kernels.flashmla", "_flashmla_combine_kernel", "flashmla_combine"),
    "flashmla_combine_native": ("graphattn.kernels.wgmma_combine", "_flashmla_combine_native_kernel",
                                "flashmla_combine"),
    "trtllm": ("graphattn.kernels.trtllm", "_trtllm_kernel", "trtllm"),
    "mega": ("graphattn.kernels.mega", "_mega_kernel", "mega"),
}
# the "kernel" value of the configs each non-Triton kernel runs
_KERNEL_KEY = {"flashmla_wgmma_ws": "wgmma_ws", "flashmla_wgmma_tn": "wgmma_tn", "flashmla_wgmma_rr": "wgmma_rr"}
_F32_PTRS = ("ws_out_ptr", "ws_lse_ptr", "lse_ptr")
_I32_PTRS = ("idx_ptr", "counter_ptr")


def _arg_type(name: str, dtype: str, constexprs: dict[str, Any]) -> str:
    if name in constexprs:
        return "constexpr"
    if name == "kv_ptr" and constexprs.get("KV_FP8"):
        return "*u8"  # 656-byte FP8 tokens, read as bytes
    if name.endswith("_ptr"):
        return "*fp32" if name in _F32_PTRS else "*i32" if name in _I32_PTRS else f"*{dtype}"
    return "fp32" if name == "qk_scale" else "i32"


def _configs(path: str, target: str, kv_fp8: bool = False) -> list[dict[str, Any]]:
    if target == "sm90":
        from ..cuda import configs as cuda_configs

        return cuda_configs.all_configs(path, kv_fp8)
    from ..hip import configs as hip_configs

    return hip_configs.all_configs(path, target, kv_fp8)


# Constexprs a launch passes or leaves at their defaults (a parameter missing here and from
# the config would be compiled as a runtime argument).
_FIXED = {"D_NOPE": 512, "D_ROPE": 64, "DOT_F32": False, "DIRECT": False, "BLOCK_S": 32, "KV_FP8": 0,
          "PDL": 0, "HOLD_SMEM": 0, "RUNS": 1, "HEADS": 1, "LAUNCH_DEPENDENTS": 0, "CLUSTER": 0, "PARTIAL_NATIVE": 0,
          "PARTIAL_16": 0, "RING": 0, "RAW_TILE": 0, "IDX_EARLY": 0, **LOOP_DEFAULTS}


def fp8_code(target: str) -> int:
    """The ``KV_FP8`` constexpr of ``target``'s FP8 format (the platform modules decide it)."""
    from ..common.kv_layout import fp8_kernel_code

    if target == "sm90":
        from ..cuda import configs as cuda_configs

        return fp8_kernel_code(cuda_configs.FP8_DTYPE)
    from ..hip import configs as hip_configs

    return fp8_kernel_code(hip_configs.fp8_dtype(target))


def jobs(targets: list[str]) -> list[tuple[str, str, dict[str, Any], dict[str, Any], str]]:
    """Distinct ``(kernel, target, constexprs, options, dtype)`` compiles."""
    out, seen = [], set()
    for target in targets:
        for kernel, (_, _, path) in KERNELS.items():
            key = _KERNEL_KEY.get(kernel)
            if not runs_on(kernel, target):
                continue
            names = _arg_names(kernel)
            # a setting with a constexpr this kernel lacks is another kernel's of the same path
            # (the native combine's RUNS)
            mine = lambda c: c.get("kernel") == key and _takes(names, c)  # noqa: E731
            configs = [c for c in _configs(path, target) if mine(c)]
            fp8_configs = [c for c in _configs(path, target, kv_fp8=True) if mine(c)]
            if not configs and not fp8_configs:
                continue
            fp8 = {"KV_FP8": fp8_code(target)} if "KV_FP8" in names else None
            # The settings the launch table gives plain kv, then (kernels that read them) those
            # it gives 656-byte FP8 tokens, each compiled with its KV_FP8 code.
            settings = [(i, cfg, {}) for i, cfg in enumerate(configs)]
            if fp8:
                settings += [(i, cfg, fp8) for i, cfg in enumerate(fp8_configs)]
            for i, cfg, kv in settings:
                meta, opts = launch_parts(cfg)
                # _FIXED fills in what the config leaves to the launcher; the config's own
                # constexprs (IDX_AHEAD, KV_MAJOR, ...) are what runs, so they win.
                meta = {**{k: v for k, v in _FIXED.items() if k in names}, **meta}
                variants = [("bf16", kv)]
                if i == 0:  # dtype and the direct store do not depend on the tile settings
                    variants.append(("fp16", kv))
                    if "DIRECT" in names and not kv:
                        variants.append(("bf16", {"DIRECT": True}))
                    if "CLUSTER" in names and cfg.get("cluster_merge"):
                        variants.append(("bf16", {**kv, "CLUSTER": 2}))  # two splits merged by a cluster
                    # the combine a PDL of these partials (2-8 rows): LAUNCH_DEPENDENTS with them
                    pdl = [{}, {"LAUNCH_DEPENDENTS": 1}] if _combine_pdl(target) else [{}]
                    if "PARTIAL_NATIVE" in names and cfg.get("partial_native"):  # partials in the accumulator's order
                        variants += [("bf16", {**kv, "PARTIAL_NATIVE": cfg["partial_native"], **d}) for d in pdl]
                    if "IDX_EARLY" in names and cfg.get("idx_early_min_heads") and not kv:  # many heads
                        variants += [(dtype, {"DIRECT": True, "IDX_EARLY": 1}) for dtype in ("bf16", "fp16")]
                        variants.append(("bf16", {"IDX_EARLY": 1}))  # in splits (head-major partials)
                        if cfg.get("partial_native"):
                            variants += [("bf16", {"PARTIAL_NATIVE": cfg["partial_native"], "IDX_EARLY": 1, **d})
                                         for d in pdl]
                # each setting's launches with splits may be followed by the combine as a PDL
                # (wgmma_tn's 16- and 32-head tiles both, where its heads a program fit one wave)
                if "LAUNCH_DEPENDENTS" in names and _combine_pdl(target):
                    variants.append(("bf16", {**kv, "LAUNCH_DEPENDENTS": 1}))
                # FP8 tokens through raw slots of their own (the ring for few tiles a split, the
                # raw tile for more) or gathered in place with the indices off the producer's
                # path: each also stored directly and before a combine as a PDL
                fp8_paths = {"RING": cfg.get("fp8_ring"), "RAW_TILE": cfg.get("fp8_raw_tile"),
                             "IDX_EARLY": 1 if cfg.get("idx_early_min_heads") else 0}
                for constexpr, value in fp8_paths.items():
                    if constexpr in names and kv and value:
                        fp8_path = {**kv, constexpr: value}
                        variants += [("bf16", fp8_path), ("fp16", fp8_path), ("bf16", {**fp8_path, "DIRECT": True})]
                        if _combine_pdl(target):
                            variants.append(("bf16", {**fp8_path, "LAUNCH_DEPENDENTS": 1}))
                if "PARTIAL_16" in names and _partial_native(target) == 2:  # the combine of 16-bit partials
                    variants.append(("bf16", {"PARTIAL_16": 1}))  # with each setting (plain, PDL)
                    if i == 0:
                        variants.append(("fp16", {"PARTIAL_16": 1}))
                for dtype, extra in variants:
                    job = (kernel, target, {**meta, **extra}, opts, dtype)
                    key = json.dumps(job, sort_keys=True)
                    if key not in seen:
                        seen.add(key)
                        out.append(job)
    return out


def _takes(names: list[str], cfg: dict[str, Any]) -> bool:
    """Whether a kernel of argument ``names`` takes every constexpr of launch setting ``cfg``."""
    return all(k in names for k in launch_parts(cfg)[0])


def runs_on(kernel: str, target: str) -> bool:
    """Whether ``target``'s launch settings can run ``kernel`` at all: flashmla's native combine
    reads only what a Gluon kernel stores with ``PARTIAL_NATIVE`` (the ``partial_native`` host
    key); every other kernel runs wherever its path has a setting."""
    return kernel != "flashmla_combine_native" or _partial_native(target) > 0


def _partial_native(target: str) -> int:
    """The largest ``partial_native`` of ``target``'s flashmla settings (0: none)."""
    settings = [cfg for kv_fp8 in (False, True) for cfg in _configs("flashmla", target, kv_fp8)]
    return max((cfg.get("partial_native", 0) for cfg in settings), default=0)


def _combine_pdl(target: str) -> bool:
    """Whether ``target``'s flashmla combine is a programmatic dependent launch (then the split
    kernels run with ``LAUNCH_DEPENDENTS``)."""
    return any(cfg.get("PDL") for cfg in _configs("flashmla_combine", target))


def _kernel_fn(kernel: str):
    import importlib

    from ..common.platform import triton_interpreter_env

    module, fn, _ = KERNELS[kernel]
    # Where kernels are interpreted (a CPU process listing the jobs), Gluon imports only with
    # the interpreter's knob on, like every other kernel module here; compiles run elsewhere.
    with triton_interpreter_env():
        return getattr(importlib.import_module(module), fn)


def _arg_names(kernel: str) -> list[str]:
    return list(_kernel_fn(kernel).arg_names)


_PTXAS_USAGE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
                          r".*?Used (\d+) registers", re.S)


def parse_ptxas_usage(text: str) -> dict[str, int] | None:
    """``{"stack", "spill_stores", "spill_loads", "registers"}`` (bytes per thread, registers per
    thread) from ``ptxas -v`` output for one kernel, or ``None`` if it has no such report."""
    found = _PTXAS_USAGE.search(text)
    if found is None:
        return None
    return dict(zip(("stack", "spill_stores", "spill_loads", "registers"), map(int, found.groups())))


def ptxas_usage(ptx: str, arch: str = "sm_90a") -> dict[str, int] | None:
    """What ``ptxas -v`` reports for ``ptx`` (:func:`parse_ptxas_usage`), from the first ptxas
    bundled with triton that accepts its PTX version; ``None`` if none does."""
    import triton

    candidates = sorted(glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                               "bin", "ptxas*")), reverse=True)  # ptxas-blackwell first
    with tempfile.TemporaryDirectory(prefix="graphattn-ptxas-") as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        for ptxas in candidates:
            run = subprocess.run([ptxas, "-v", "--gpu-name", arch, path, "-o", path + ".cubin"],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                return parse_ptxas_usage(run.stdout + run.stderr)
    return None


def compile_job(job: tuple[str, str, dict[str, Any], dict[str, Any], str]) -> Any:
    """Compile one job (a :func:`jobs` entry) and return Triton's compiled kernel (its ``asm``
    holds the PTX or AMDGCN); raises what the compiler raises, or TypeError where the kernel is
    not a JITFunction (``TRITON_INTERPRET`` must be 0)."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernel, target, meta, opts, dtype = job
    fn = _kernel_fn(kernel)
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise TypeError(f"{type(fn).__name__} is not a JITFunction: set TRITON_INTERPRET=0")
    signature = {name: _arg_type(name, dtype, meta) for name in fn.arg_names}
    source = triton.compiler.ASTSource
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    # Pointers and strides as the JIT specialises them on a GPU (16-byte aligned, strides
    # multiples of 16): the Gluon kernel's 16-byte cp.async copies need it to compile.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in meta and (name.endswith("_ptr") or name.startswith("stride_"))}
    src = source(fn=fn, signature=signature, constexprs=meta, attrs=attrs)
    return triton.compile(src, target=GPUTarget(*TARGETS[target]), options=opts)


def compile_one(job: tuple[str, str, dict[str, Any], dict[str, Any], str],
                usage: bool = False) -> dict[str, Any]:
    """Compile one job; returns a JSON-able record (``ok`` False with the error on failure).
    ``usage``: add ``ptxas`` (:func:`ptxas_usage`) for sm_90 kernels."""
    kernel, target, meta, opts, dtype = job
    record = {"kernel": kernel, "target": target, "dtype": dtype, "constexprs": meta, "options": opts}
    t0 = time.perf_counter()
    try:
        compiled = compile_job(job)
    except Exception as exc:  # report every failure, not only the first
        return {**record, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    asm = "ptx" if target == "sm90" else "amdgcn"
    record = {**record, "ok": asm in compiled.asm, "seconds": round(time.perf_counter() - t0, 2),
              "shared_bytes": compiled.metadata.shared}
    if usage and target == "sm90" and record["ok"]:
        record["ptxas"] = ptxas_usage(compiled.asm["ptx"])
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile processes")
    parser.add_argument("--ptxas", action="store_true",
                        help="add registers and spill bytes (ptxas -v) of each sm_90 kernel")
    args = parser.parse_args(argv)
    todo = jobs(args.targets)
    failed = 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for record in pool.map(functools.partial(compile_one, usage=args.ptxas), todo):
            failed += not record["ok"]
            print(json.dumps(record, sort_keys=True), flush=True)
    print(json.dumps({"compiled": len(todo) - failed, "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
