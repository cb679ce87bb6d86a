"""Shared-memory offsets that Triton's allocator gives a Gluon kernel's buffers, by name.

A kernel that addresses its own buffers from inline PTX (``global_smem`` plus an offset: the
distributed-shared-memory writes of ``scripts/dsmem_probe.py``) needs them, and Triton does not
report them. This compiles the kernel for sm_90 with a stages hook that, before the LLVM stage,
runs the allocation passes on a copy of the TTGIR module and reads each ``ttg.local_alloc``'s
``allocation.offset``; the offsets depend on the buffers alone, not on an inline-asm string, so
a second compile with them baked into its PTX keeps them.

``offsets(fn, signature, constexprs, options, attrs=None) -> (compiled, [(name, offset, type)])``;
``PYTHONPATH=. python scripts/smem_offsets.py`` prints dsmem_probe's exchange kernel's.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "0")

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

_captured: dict[str, str] = {}


def _hook(backend=None, stages=None, options=None, language=None, capability=None):
    if stages is None:  # triton >= 3.9 also asks the hook for a cache key
        return "smem_offsets", "smem_offsets"
    make_llir = stages["llir"]

    def llir(src, metadata):
        from triton._C.libtriton import ir, nvidia, passes

        path = tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False)
        with path:
            path.write(str(src))
        copy = ir.parse_mlir_module(path.name, src.context)
        os.unlink(path.name)
        pm = ir.pass_manager(src.context)
        passes.ttgpuir.add_combine_tensor_select_and_if(pm)
        passes.ttgpuir.add_allocate_warp_groups(pm)
        passes.convert.add_scf_to_cf(pm)
        passes.gluon.add_inliner(pm)
        nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, capability, 80)
        pm.run(copy, "smem_offsets")
        _captured["module"] = str(copy)
        return make_llir(src, metadata)

    stages["llir"] = llir


def offsets(fn, signature, constexprs, options, attrs=None):
    """Compile ``fn`` (Gluon) for sm_90 in a fresh cache (so every stage runs) and return
    ``(compiled, [(buffer name, offset in bytes, memdesc type)])``."""
    saved_hook, saved_dir = knobs.runtime.add_stages_inspection_hook, knobs.cache.dir
    knobs.runtime.add_stages_inspection_hook = _hook
    knobs.cache.dir = tempfile.mkdtemp(prefix="smem_offsets_")
    try:
        src = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    finally:
        shutil.rmtree(knobs.cache.dir, ignore_errors=True)
        knobs.runtime.add_stages_inspection_hook, knobs.cache.dir = saved_hook, saved_dir
    found = []
    for line in _captured.pop("module").splitlines():
        if "local_alloc" in line and "allocation.offset" in line:
            name = re.match(r"\s*(%[\w.]+) =", line)
            off = int(re.search(r"allocation\.offset = (\d+)", line).group(1))
            ty = re.search(r"!ttg\.memdesc<([^,>]+)", line).group(1)
            found.append((name.group(1).lstrip("%") if name else "?", off, ty))
    return compiled, found


if __name__ == "__main__":
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import dsmem_probe as d

    c, found = offsets(d._exchange_kernel, d.EXCHANGE_SIG, {"ASM_SEND": d.send_asm(2, d.WORDS, *d.exchange_offsets()),
                                                             "C": 2, "WORDS": d.WORDS}, {"num_warps": 4})
    print(c.metadata.shared, found)
