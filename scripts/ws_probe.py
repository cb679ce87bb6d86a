"""Where the time of flashmla's warp-specialised kernel (wgmma_ws, sm_90) goes inside one launch:
timestamps (``%globaltimer``, and ``%clock64`` from the program's own start) at the producer's
and both consumers' milestones, per program. One launch of the split kernel alone (no
combine): a one-split launch keeps the stamps in the unused workspace, a launch with splits in
the output (which only the combine writes). Diagnostic only: the instrumented copy of the
kernel is built from the current ``graphattn/kernels/wgmma_ws.py`` at run time.

Run from the repository root on an sm_90 GPU:
``PYTHONPATH=. python scripts/ws_probe.py 128x1x2048 128x64x2048`` (heads x rows x topk; at
least 64 heads). bf16 kv runs wgmma_ws here even where the launch table would pick wgmma_rr
(``WGMMA_RR_MIN_PROGRAMS`` raised out of reach), so these shapes time the kernel they timed
before wgmma_rr existed; ``scripts/rr_probe.py`` probes wgmma_rr."""
import importlib.util
import math
import os
import sys
import tempfile

KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "graphattn", "kernels", "wgmma_ws.py")
PROBE = '''

@gluon.jit
def _probe(ws_out_ptr, out_ptr, DIRECT: gl.constexpr, k: gl.constexpr):
    if DIRECT:  # the workspace is unused
        p = ws_out_ptr.to(gl.pointer_type(gl.int64)) + gl.program_id(0) * 64
    else:  # the output is the combine's, which does not run
        p = out_ptr.to(gl.pointer_type(gl.int64)) + gl.program_id(0) * 64
    g = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    c = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    gl.store(p + k, g)
    gl.store(p + 32 + k, c)
    if k == 20:  # the producer's start: which SM the program runs on (slot 31)
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.store(p + 31, sm.to(gl.int64))

'''
# (a line of wgmma_ws.py, the probe put before it) then (a line, the probe put after it); the
# slot numbers are NAMES'. Each hook sits in a function that has ws_out_ptr, out_ptr and DIRECT
# (tests/test_scripts.py compiles the instrumented kernel for sm_90).
BEFORE = [
    ("    # A tile's indices in the two layouts its gather takes", "    _probe(ws_out_ptr, out_ptr, DIRECT, 20)\n"),
    ("    h_s = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)\n    # Both consumers are past",
     "    _probe(ws_out_ptr, out_ptr, DIRECT, WG * 10 + 4)\n"),  # _finish, the sums merged
    ("\n\n@gluon.jit\ndef _normalised(", "    _probe(ws_out_ptr, out_ptr, DIRECT, WG * 10 + 5)\n"),  # _finish's end
]
AFTER = [
    ("    if WG == 0:\n        _load_q_first(q_ptr, stride_qr, stride_qh, row, hb, H, q_nope, q_rope, q_ready, "
     "BLOCK_H, D_NOPE, D_ROPE)\n", "        _probe(ws_out_ptr, out_ptr, DIRECT, 21)\n"),
    ("        _async_copy.mbarrier_arrive(kv_ready.index(slot * OWNERS + j % OWNERS), increment_count=False)\n",
     "        if j == 0:\n            _probe(ws_out_ptr, out_ptr, DIRECT, 22)\n"),
    ("        idx_a, idx_b = _tile_indices(idx_row_ptr, n_next, end, BLOCK_N, KV_FP8, GATHER_N, GATHER_R)\n",
     "    _probe(ws_out_ptr, out_ptr, DIRECT, 23)\n"),
    ("    mbarrier.wait(q_ready, 0)\n", "    _probe(ws_out_ptr, out_ptr, DIRECT, WG * 10 + 1)\n"),
    ("                                  qk_scale, row_o, HALF, WG)\n",
     "            _probe(ws_out_ptr, out_ptr, DIRECT, 2)\n"),
    ("                              row_o, HALF, WG)\n",
     "        if (WG == 1) & (t == 1):\n            _probe(ws_out_ptr, out_ptr, DIRECT, 12)\n"),
    ("        mbarrier.arrive(kv_free.index((n_tiles - 1) % 2))\n",
     "    _probe(ws_out_ptr, out_ptr, DIRECT, WG * 10 + 3)\n"),
]
NAMES = {20: "producer entry", 21: "c0 q copies issued", 22: "tile 0 issued", 23: "last tile issued",
         1: "c0 q landed", 2: "c0 tile 0 done", 3: "c0 loop done", 4: "c0 sums merged", 5: "c0 stored",
         11: "c1 q landed", 12: "c1 tile 1 done", 13: "c1 loop done", 14: "c1 sums merged", 15: "c1 stored"}


def kernel_source(kernel: str) -> str:
    """The source of the kernel module at path ``kernel`` with its relative imports made
    absolute, so that an instrumented copy imports from anywhere."""
    src = open(kernel).read().replace("from ..common.kv_layout", "from graphattn.common.kv_layout")
    for module in ("wgmma", "wgmma_ws", "wgmma_dequant"):
        src = src.replace(f"from .{module} import", f"from graphattn.kernels.{module} import")
    return src


def instrument(kernel: str, first_def: str, probe: str, before, after) -> str:
    """``kernel``'s source (:func:`kernel_source`) with ``probe`` put before the function
    ``first_def`` and each hook's text before (``before``) or after (``after``) its anchor, which
    must occur exactly once."""
    src = kernel_source(kernel)
    head = f"\n\n@gluon.jit\ndef {first_def}("
    assert src.count(head) == 1, f"{first_def} not found once in {kernel}"
    src = src.replace(head, probe + head[1:], 1)
    for hooks, is_after in ((before, False), (after, True)):
        for anchor, text in hooks:
            assert src.count(anchor) == 1, f"probe anchor not found once in {kernel}: {anchor!r}"
            src = src.replace(anchor, anchor + text if is_after else text + anchor)
    return src


def instrumented_source() -> str:
    """wgmma_ws's source with the probes."""
    return instrument(KERNEL, "_producer", PROBE, BEFORE, AFTER)


def load_module(src: str, name: str):
    """``src`` imported as module ``graphattn.kernels.<name>`` from a temporary file."""
    path = tempfile.NamedTemporaryFile("w", suffix=f"_{name}.py", delete=False)
    path.write(src)
    path.close()
    spec = importlib.util.spec_from_file_location(f"graphattn.kernels.{name}", path.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def instrumented_module():
    """The instrumented kernel's module."""
    return load_module(instrumented_source(), "wsprobe")


def report(g, c, names, entry: int, ends) -> None:
    """Print each milestone's time (``g``: globaltimer ns, ``c``: clock64, ``[programs, 32]``):
    from the first program's start (slot ``entry``) and from each program's own start (clock64
    at the SM clock the stamps themselves measure: clock64 over globaltimer from the start to
    the first of ``ends``, the median over programs; under load it is well below the boost
    clock)."""
    g0 = g[:, entry].min()
    ghz = ((c[:, ends[0]] - c[:, entry]) / (g[:, ends[0]] - g[:, entry])).median().item()
    print(f"   span {(g[:, ends].max() - g0) / 1e3:.2f} us (globaltimer ticks are ~0.26 us; "
          f"clock64 at the measured {ghz:.2f} GHz)")
    for k, name in names.items():
        rel = (g[:, k] - g0) / 1e3
        own = (c[:, k] - c[:, entry]) / (ghz * 1e3)
        print(f"  {name:17s} us from the first program's start: min {rel.min():7.2f} median "
              f"{rel.median():7.2f} max {rel.max():7.2f} | from its own start: median {own.median():7.2f}")


def probe_launch(spec: str, kernel: str, module: str, words: int = 64, dtype=None, kv_fp8: bool = False):
    """flashmla's plan for ``spec`` (``HEADSxROWSxTOPK``) with its Gluon ``kernel`` (a key of
    ``GLUON_KERNELS``) taken from the instrumented module ``graphattn.kernels.<module>``
    (:func:`load_module`), its combine left out. Returns ``(plan, launch)``: ``launch(shift=0)``
    runs it on 8 input sets, the index rows rolled by ``shift`` rows (the last call's inputs cold
    in L2), and returns the last call's stamps ``[programs, 64]`` (f64: globaltimer in slots
    0-31, clock64 in 32-63, the SM in 31); ``None`` for a launch of clusters, whose CTAs use both
    the workspace and the output, leaving no room for the stamps. ``words``, ``dtype``: a
    program's stamps are ``words`` values of ``dtype`` instead (returned as int64, not f64);
    ``kv_fp8``: 656-byte FP8 tokens."""
    import dataclasses

    import torch

    from graphattn.bench.kernels import make_copies
    from graphattn.common.metadata import GraphMetadata
    from graphattn.kernels import flashmla, split_plan

    flashmla.GLUON_KERNELS[kernel] = (module, flashmla.GLUON_KERNELS[kernel][1])
    h, r, t = (int(x) for x in spec.split("x"))
    sets = make_copies(r, h, t, 8, kv_fp8=kv_fp8)
    md = GraphMetadata(r, h, t, torch.bfloat16, "cuda", **split_plan("flashmla", h, t, kv_fp8=kv_fp8).metadata_kwargs())
    ws_out, ws_lse = md.workspace_for(r)
    plan = flashmla.plan_flashmla(r, h, t, ws_out.shape[1], kv_fp8=kv_fp8)
    assert plan.kernel == kernel, f"{spec} runs {plan.kernel}, not {kernel}"
    if plan.main.cluster > 1:
        return None
    if plan.splits == 1:  # the stamps' room: a workspace the launch leaves alone
        ws_out = torch.zeros(r, 1, h, 512, device="cuda")
        ws_lse = torch.empty(r, 1, h, device="cuda")
    call = flashmla.bind_flashmla(dataclasses.replace(plan, combine=None), sets[0]["idx"], 1 / math.sqrt(576),
                                  ws_out, ws_lse)
    out = torch.zeros(r, h, 512, dtype=torch.bfloat16, device="cuda")  # rows x heads x 1 KB >= 512 B a program
    lse = torch.empty(r, h, device="cuda")
    progs = plan.main.grid[0]
    stamps = ws_out if plan.splits == 1 else out
    view = dtype or torch.int64
    room = stamps.numel() * stamps.element_size() // torch.empty(0, dtype=view).element_size()
    assert room >= progs * words, f"{spec}: {progs} programs x {words} stamps do not fit in {room}"

    def launch(shift: int = 0):
        idx = sets[0]["idx"]
        for s in sets:
            idx.copy_(s["idx"].roll(shift, 0) if shift else s["idx"])
            call(s["q"], s["kv"], (out, lse))
        torch.cuda.synchronize()
        got = stamps.reshape(-1).view(view)[: progs * words].view(progs, words).cpu()
        return got.double() if dtype is None else got.to(torch.int64)

    return plan, launch


def main(specs):
    instrumented_module()
    from graphattn.cuda import configs

    configs.WGMMA_RR_MIN_PROGRAMS = 1 << 30  # bf16 runs wgmma_ws at every size (see the docstring)
    for spec in specs:
        got = probe_launch(spec, "wgmma_ws", "wsprobe")
        if got is None:
            print(f"== {spec}: skipped, a launch of clusters leaves no buffer for the stamps")
            continue
        plan, launch = got
        p = launch()
        print(f"== {spec}: {plan.main.grid[0]} programs, {plan.splits} split(s)")
        report(p[:, :32], p[:, 32:], NAMES, 20, [5, 15])


if __name__ == "__main__":
    main(sys.argv[1:])
