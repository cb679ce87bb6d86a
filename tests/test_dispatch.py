"""``auto`` per batch size (issue 12): the ``dispatch`` backend runs, per row count, the kernel
path the platform measured fastest, and its metadata serves every path it may choose.

The measured table (``graphattn.cuda.kernel_times``) is pinned to the kernel table in
docs/benchmarks.md: the two must hold the same numbers, and at every measured configuration the
choice must be within 5% of the fastest path.
"""

from __future__ import annotations

import pathlib
import re
from types import MappingProxyType

import pytest
import torch

from graphattn.backends import get_backend_class, resolve_backend
from graphattn.backends.dispatch import DispatchBackend
from graphattn.common.interpreter_configs import InterpreterLaunchTable
from graphattn.common.platform import LaunchTable, current_platform
from graphattn.cuda import kernel_times
from graphattn.cuda.launch import NvidiaLaunchTable
from graphattn.graphs.runner import GraphRunner
from test_launch_path import _check, _inputs

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
_ROW = re.compile(r"^\| (\d+) \| (\d+) \| (\d+) \| \**(\w+)\** \| ([\d.]+) \|")


def _doc_kernel_table(after: str = "## Kernels") -> dict[tuple[int, int, int], dict[str, float]]:
    """The first kernel table after the line ``after`` in docs/benchmarks.md:
    {(heads, rows, topk): {path: µs}}."""
    section = DOCS.read_text().split("\n" + after + "\n", 1)[1]
    table: dict[tuple[int, int, int], dict[str, float]] = {}
    lines = iter(section.splitlines())
    for line in lines:  # the first table only: it ends at the first line that is not a row
        if line.startswith("| heads | rows | topk | path"):
            break
    for line in lines:
        if line.startswith("|---"):
            continue
        found = _ROW.match(line)
        if not found:
            break
        heads, rows, topk, path, us = found.groups()
        table.setdefault((int(heads), int(rows), int(topk)), {})[path] = float(us)
    return table


# (kv layout, the line the docs table follows, the measured times graphattn keeps)
TABLES = [(False, "## Kernels", kernel_times.H200_US), (True, "### FP8 kernel table", kernel_times.H200_US_FP8)]


@pytest.mark.parametrize("kv_fp8, heading, kept", TABLES, ids=["bf16", "fp8"])
def test_measured_times_are_the_benchmark_table(kv_fp8, heading, kept):
    doc = {shape: {p: us for p, us in paths.items() if p != "torch"}
           for shape, paths in _doc_kernel_table(heading).items()}
    assert len(doc) >= 20, f"found {len(doc)} configurations in {DOCS}'s table after {heading!r}"
    assert doc == kept, f"graphattn/cuda/kernel_times.py must hold the table after {heading!r} in {DOCS}"


@pytest.mark.parametrize("kv_fp8, heading, kept", TABLES, ids=["bf16", "fp8"])
def test_dispatch_is_within_5_percent_of_the_fastest_path_on_the_h200(kv_fp8, heading, kept):
    table = NvidiaLaunchTable((9, 0))
    for (heads, rows, topk), paths in _doc_kernel_table(heading).items():
        kernels = {p: us for p, us in paths.items() if p != "torch"}
        chosen = table.fastest_path(rows, heads, topk, kv_fp8)
        assert kernels[chosen] <= 1.05 * min(kernels.values()), (
            f"dispatch ({'fp8' if kv_fp8 else 'bf16'} kv) at {heads} heads x {rows} rows x topk {topk} "
            f"picks {chosen} ({kernels[chosen]} µs); measured {kernels}")


def test_unmeasured_hardware_falls_back_to_the_static_order():
    assert NvidiaLaunchTable((8, 0)).fastest_path(1, 16, 2048) is None
    assert InterpreterLaunchTable().fastest_path(64, 128, 2048) is None


class _MeasuredHere(LaunchTable):
    """This machine's launch settings with made-up times: trtllm fastest at 1 row, mega at 2,
    flashmla at 4 (each path wins somewhere, so one test runs all three)."""

    def __init__(self, real: LaunchTable, heads: int, topk: int):
        super().__init__()
        self.real = real
        self.kernel_times = MappingProxyType({
            (heads, 1, topk): {"flashmla": 3.0, "trtllm": 1.0, "mega": 2.0},
            (heads, 2, topk): {"flashmla": 3.0, "trtllm": 2.0, "mega": 1.0},
            (heads, 4, topk): {"flashmla": 1.0, "trtllm": 2.0, "mega": 3.0},
        })

    def settings(self, path, **shape):
        return self.real.kernel_config(path, **shape)


def _platform(heads, topk):
    here = current_platform()
    return type(here)(launch_table=_MeasuredHere(here.launch_table, heads, topk))


def test_dispatch_runs_the_path_planned_for_each_row_count_eager_and_in_a_graph():
    heads, topk, pool = 5, 24, 60
    platform = _platform(heads, topk)
    dtype = torch.float16 if platform.uses_triton_interpreter else torch.bfloat16
    backend = DispatchBackend(heads, topk, dtype, platform=platform)
    metadata = backend.make_metadata(4)
    # Room for every path it may choose: trtllm's counter and a split-KV workspace.
    assert metadata.counter is not None and metadata.workspace_out is not None
    expected = {1: "trtllm", 2: "mega", 4: "flashmla"}
    kv = _inputs(heads, 1, topk, pool, dtype, platform.device)[1]
    for rows, path in expected.items():
        q, _, idx = _inputs(heads, rows, topk, pool, dtype, platform.device)
        backend.plan(metadata, idx)
        assert backend.path_for(rows) == path
        assert backend.launch_plan(metadata, rows).spec.name == path, f"backend 'dispatch' at {rows} rows"
        _check(f"dispatch, eager, {rows} rows ({path})", q, kv, idx, backend, *backend.forward(q, kv, metadata))

    # One graph per bucket: each captures the path planned for its row count and replays it
    # on fresh inputs (the counter stays clean: trtllm's last program resets it).
    static = torch.zeros(4, heads, 576, dtype=dtype, device=platform.device)
    runner = GraphRunner(lambda q: backend.forward(q, kv, metadata), {"q": static}, metadata=metadata,
                         buckets=list(expected), platform=platform)
    backend.plan(metadata, _inputs(heads, 4, topk, pool, dtype, platform.device)[2])
    runner.capture()
    for rows, path in reversed(list(expected.items())):
        q, _, idx = _inputs(heads, rows, topk, pool, dtype, platform.device)
        backend.plan(metadata, idx)
        _check(f"dispatch, graph replay, {rows} rows ({path})", q, kv, idx, backend, *runner.run(q=q))
        assert not metadata.counter_for(rows).any(), "backend 'dispatch': the counter is not clean"


def test_auto_is_dispatch_on_a_gpu_and_torch_in_the_interpreter():
    here = current_platform()
    gpu = type(here)(launch_table=NvidiaLaunchTable((9, 0)))
    if not gpu.uses_triton_interpreter:
        assert resolve_backend("auto", 16, torch.bfloat16, 2048, platform=gpu) is DispatchBackend
    assert get_backend_class("dispatch") is DispatchBackend
    assert (DispatchBackend.uses_counter, DispatchBackend.uses_workspace) == (True, True)
