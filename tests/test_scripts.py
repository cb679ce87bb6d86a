"""The diagnostic scripts that docs/benchmarks.md cites and that patch kernel source: they must
still apply to the kernels as committed (they run only on a GPU, so a CPU test keeps them honest).
"""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ws_probe_hooks_every_milestone_once():
    probe = _load("ws_probe")
    src = probe.instrumented_source()  # asserts each anchor is in wgmma_ws.py exactly once
    compile(src, "wsprobe.py", "exec")
    calls = [line.strip() for line in src.splitlines() if line.strip().startswith("_probe(ws_out_ptr, ")]
    assert len(calls) == len(probe.BEFORE) + len(probe.AFTER), calls
    slots = set()
    for call in calls:  # "_probe(ws_out_ptr, 21)" or "_probe(ws_out_ptr, WG * 10 + 3)" (both consumers)
        arg = call[len("_probe(ws_out_ptr, "):-1]
        slots |= {int(arg.split("+")[1]), 10 + int(arg.split("+")[1])} if "WG" in arg else {int(arg)}
    assert set(probe.NAMES) <= slots, sorted(set(probe.NAMES) - slots)
