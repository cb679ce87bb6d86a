"""The torch backend's private graphs for eager calls (issue 11: host cost of an eager forward).

On a GPU an eager ``TorchBackend.forward`` replays a private graph of its own ops once its key
repeats (``graphattn.backends._replay.EagerGraphs``). The CPU tests run the same mechanism with
the CPU graph emulator standing in for real graphs (a test platform whose
``eager_graph_class()`` is the emulator's segment); the ``gpu`` tests check real CUDA graphs
(and HIP's rules forced onto them) bitwise against the op path.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import weakref

import pytest
import torch

from graphattn.backends import torch_ref
from graphattn.backends.torch_ref import TorchBackend
from graphattn.common import kv_layout
from graphattn.common.platform import CpuPlatform, current_platform, reset_platform_cache
from graphattn.common.reference import sparse_mla_reference
from graphattn.common.tolerances import tolerance
from graphattn.graphs import GraphRunner, eager_on_graph
from graphattn.graphs.emulated import EmulatedGraphSegment
from graphattn.testing.specs import Q_STD

from test_launch_path import _Recorder

NAME = "torch"
HEADS, TOPK, POOL = 4, 24, 60


class EmulatedGraphsPlatform(CpuPlatform):
    """The CPU platform, with the graph emulator standing in for the real graphs a GPU
    platform gives eager calls (the mechanism under test; everything else is the CPU's)."""

    def eager_graph_class(self) -> type:
        return self.graph_segment_class()


def make(dtype=torch.float16, kv_dtype="auto", heads=HEADS, topk=TOPK, platform=None) -> TorchBackend:
    return TorchBackend(heads, topk, dtype, platform=platform or EmulatedGraphsPlatform(), kv_dtype=kv_dtype)


def op_path(backend: TorchBackend) -> TorchBackend:
    """The same configuration with private graphs off: every call runs its ops."""
    ops = TorchBackend(backend.num_heads, backend.topk, backend.dtype, platform=backend.platform,
                       kv_dtype=backend.kv_dtype)
    ops._graphs = None
    return ops


def make_kv(backend: TorchBackend, pool=POOL) -> torch.Tensor:
    kv = torch.randn(pool, 576, device=backend.device)
    if backend.kv_fp8:
        return kv_layout.quantize_kv(kv, backend.platform.fp8_dtype)  # [pool, 656] uint8
    return kv.to(backend.dtype)


def make_step(backend: TorchBackend, rows: int, pool=POOL) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random q and indices (-1 and out-of-pool values included: both are skipped)."""
    q = (torch.randn(rows, backend.num_heads, 576) * Q_STD).to(backend.dtype).to(backend.device)
    idx = torch.randint(-1, pool + 3, (rows, backend.topk), dtype=torch.int32).to(backend.device)
    return q, idx


def poisoned_out(backend: TorchBackend, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.full((rows, backend.num_heads, 512), float("nan"), dtype=backend.dtype, device=backend.device),
            torch.full((rows, backend.num_heads), float("nan"), device=backend.device))


def check_reference(what, backend, q, kv, idx, out, lse):
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, backend.sm_scale, fp8_dtype=backend.platform.fp8_dtype)
    tol = tolerance(q.dtype, backend.kv_dtype)
    torch.testing.assert_close(out.double(), ref_out, atol=tol.atol, rtol=tol.rtol, equal_nan=True,
                               msg=lambda m: f"backend '{NAME}' ({what}) out: {m}")
    torch.testing.assert_close(lse.double(), ref_lse, atol=tol.lse_atol, rtol=tol.lse_rtol, equal_nan=True,
                               msg=lambda m: f"backend '{NAME}' ({what}) lse: {m}")


def check_same(what, got, want):
    """Bitwise equal, NaN where NaN (the replay runs the op path's very ops)."""
    for name, a, b in zip(("out", "lse"), got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m: f"backend '{NAME}' ({what}) {name} differs from the op path: {m}")


def stats(backend: TorchBackend) -> dict[str, int]:
    return backend._graphs.stats()


def expect(backend: TorchBackend, what: str = "", **want: int) -> None:
    """Assert some of the graph counts (shapes, graphs, captures, replays)."""
    got = stats(backend)
    assert {k: got[k] for k in want} == want, f"backend '{NAME}'{what and f' ({what})'}: {got}, expected {want}"


def captured(rows: int = 3):
    """``(backend, metadata, kv, q, indices)`` of a backend whose private graph for that call
    was just captured (its second call)."""
    backend = make()
    md = backend.make_metadata(rows)
    kv = make_kv(backend)
    q, idx = make_step(backend, rows)
    backend.plan(md, idx)
    backend.forward(q, kv, md)
    backend.forward(q, kv, md)
    expect(backend, captures=1)
    return backend, md, kv, q, idx


def statics(backend: TorchBackend) -> list:
    return list(backend._graphs._shapes.current().values())


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_second_call_captures_and_replays_equal_the_op_path(dtype, kv_dtype):
    """The first call with a key runs the ops, the second captures and replays, later ones
    replay: each on fresh q and indices, into fresh tensors or a poisoned ``out=`` pair, with
    the statics poisoned before each replay, equal to the op path and to the float64 reference."""
    backend = make(dtype, kv_dtype)
    ops = op_path(backend)
    md = backend.make_metadata(8)
    kv = make_kv(backend)
    for step in range(5):
        q, idx = make_step(backend, 3)
        backend.plan(md, idx)
        for shape in statics(backend):
            shape.out.fill_(float("nan"))
            shape.lse.fill_(float("nan"))
        out = poisoned_out(backend, 3) if step % 2 else None
        res = backend.forward(q, kv, md, out=out)
        if out is not None:
            assert res[0] is out[0] and res[1] is out[1], f"backend '{NAME}': out= not returned"
        what = f"{dtype}, kv {kv_dtype}, step {step}"
        check_same(what, res, ops.forward(q, kv, md))
        check_reference(what, backend, q, kv, idx, *res)
        expect(backend, what, shapes=int(step > 0), graphs=int(step > 0), captures=int(step > 0), replays=step)
        assert res[0].dtype == dtype and res[1].dtype == torch.float32


def test_nan_in_q_and_invalid_indices_propagate_as_in_the_op_path():
    backend = make(torch.float32)
    md = backend.make_metadata(4)
    kv = make_kv(backend)
    for step in range(3):
        q, idx = make_step(backend, 4)
        q[0, 1, 7] = float("nan")  # one head of row 0
        idx[1] = -1  # a row with no valid index
        idx[2, ::2] = -1
        idx[3, ::3] = POOL + 5  # outside the pool: skipped too
        backend.plan(md, idx)
        out, lse = backend.forward(q, kv, md)
        check_same(f"step {step}", (out, lse), op_path(backend).forward(q, kv, md))
        check_reference(f"step {step}", backend, q, kv, idx, out, lse)
        assert out[0, 1].isnan().all() and lse[0, 1].isnan(), f"backend '{NAME}': NaN in q did not propagate"
        assert not out[0, [0, 2, 3]].isnan().any(), f"backend '{NAME}': NaN leaked into other heads"
        assert (out[1] == 0).all() and (lse[1] == float("-inf")).all(), f"backend '{NAME}': all-invalid row"
    expect(backend, replays=2)


def test_results_never_alias_the_graph_outputs():
    """A later call must not change an earlier call's results (the statics are never handed out)."""
    backend = make()
    md = backend.make_metadata(2)
    kv = make_kv(backend)
    results = []
    for _ in range(4):
        q, idx = make_step(backend, 2)
        backend.plan(md, idx)
        res = backend.forward(q, kv, md)
        results.append((res, tuple(t.clone() for t in res)))
    expect(backend, replays=3)
    shape = statics(backend)[0]
    owned = {shape.q.data_ptr(), shape.out.data_ptr(), shape.lse.data_ptr()}
    for i, (res, snapshot) in enumerate(results):
        check_same(f"call {i} after later calls", res, snapshot)
        assert not {t.data_ptr() for t in res} & owned, f"backend '{NAME}': call {i} returned a static output"


def test_graphs_serve_calls_in_and_out_of_inference_mode():
    backend = make()
    md = backend.make_metadata(3)
    kv = make_kv(backend)
    for step, inference in enumerate((True, True, False, True, False)):
        q, idx = make_step(backend, 3)
        backend.plan(md, idx)
        with torch.inference_mode(inference):
            out, lse = backend.forward(q, kv, md)
        assert out.is_inference() == inference, f"backend '{NAME}' step {step}"
        check_reference(f"step {step}, inference_mode={inference}", backend, q, kv, idx, out, lse)
    expect(backend, replays=4)


def test_kv_written_in_place_is_read_by_the_replay():
    """The graph reads kv through its address: an engine writing new tokens into its KV pool
    between steps is seen by the next replay."""
    backend, md, kv, q, idx = captured()
    kv.copy_(make_kv(backend))
    out, lse = backend.forward(q, kv, md)
    expect(backend, replays=2)
    check_reference("kv rewritten in place", backend, q, kv, idx, out, lse)


def test_another_kv_never_replays_a_stale_graph():
    """A kv at another address, or at the captured address with another layout, never replays
    the captured graph: its first call runs the ops, its second captures its own graph."""
    backend = make()
    md = backend.make_metadata(3)
    base = torch.randn(POOL * 600).to(backend.dtype)
    layer0 = base[: POOL * 576].view(POOL, 576)
    others = {
        "another pool": make_kv(backend),
        "same address, fewer tokens": layer0[: POOL - 10],
        "same address, other strides": base.as_strided((POOL - 1, 576), (600, 1)),
    }
    q, idx = make_step(backend, 3, pool=POOL - 10)
    backend.plan(md, idx)
    backend.forward(q, layer0, md)
    backend.forward(q, layer0, md)  # captured for layer0
    graphs = 1
    for what, kv in others.items():
        before = stats(backend)
        check_reference(what, backend, q, kv, idx, *backend.forward(q, kv, md))
        expect(backend, f"{what}: no replay of another kv's graph", replays=before["replays"])
        check_reference(what, backend, q, kv, idx, *backend.forward(q, kv, md))
        graphs += 1
        expect(backend, what, graphs=graphs, replays=before["replays"] + 1)
    for what, kv in [("layer0 again", layer0), *others.items()]:  # each replays its own graph
        check_reference(what, backend, q, kv, idx, *backend.forward(q, kv, md))
    expect(backend, captures=4, shapes=1)


def test_kv_freed_and_made_again_is_not_replayed_stale():
    """A kv freed after its capture and made again (maybe at the same address): the results
    are the new kv's (the emulator refuses the freed storage; the graph is dropped)."""
    backend, md, kv, q, idx = captured()
    del kv
    kv = make_kv(backend)
    for _ in range(3):
        check_reference("kv made again", backend, q, kv, idx, *backend.forward(q, kv, md))


def test_cache_bounds():
    """Shapes (each holding static q/out/lse), their bytes, graphs per shape and keys seen once
    are bounded. Past a bound every graph goes at once, before the next capture, never one graph
    alone (destroying a graph frees its capture stream's cuBLAS workspace, which the others
    captured there still use); a dropped key starts over (ops, then capture)."""

    def setup(**bounds):
        backend = make()
        for name, value in bounds.items():
            setattr(backend._graphs, name, value)
        md = backend.make_metadata(4)
        kv = make_kv(backend)
        q, idx = make_step(backend, 4)

        def call(rows, kv=kv):
            backend.plan(md, idx[:rows])
            check_reference(f"{rows} rows", backend, q[:rows], kv, idx[:rows], *backend.forward(q[:rows], kv, md))

        return backend, call

    backend, call = setup(max_shapes=2)
    for rows in (1, 2):
        call(rows)
        call(rows)
    expect(backend, shapes=2, graphs=2, captures=2, replays=2)
    call(3)
    call(3)  # a third shape: every shape and graph goes before its capture
    expect(backend, "past max_shapes", shapes=1, graphs=1, captures=3, replays=3)
    call(1)  # dropped: its key is new again, so the ops run ...
    expect(backend, captures=3, replays=3)
    call(1)  # ... and then it is captured again
    expect(backend, shapes=2, graphs=2, captures=4, replays=4)

    backend, call = setup(max_graphs=2)
    layers = [make_kv(backend) for _ in range(3)]
    for kv_layer in layers:
        call(1, kv_layer)
        call(1, kv_layer)
    expect(backend, "past max_graphs: the two graphs went before the third's capture", graphs=1, captures=3)
    call(1, layers[2])
    expect(backend, replays=4)
    call(1, layers[0])  # dropped: ops again
    expect(backend, captures=3, replays=4)

    backend, call = setup()
    for rows in (1, 2):
        call(rows)
        call(rows)
    backend._graphs.max_static_bytes = 1
    call(4)
    call(4)
    expect(backend, "past max_static_bytes: the newest shape only", shapes=1, graphs=1)
    assert statics(backend)[0].q.shape[0] == 4, f"backend '{NAME}': kept {statics(backend)[0].q.shape}"

    backend, call = setup(max_seen=2)
    call(3)  # seen once ...
    call(2)
    call(1)  # ... and forgotten: the next call of 3 rows is a first call again
    call(3)
    expect(backend, captures=0)


def test_isolated_segment_classes_capture_on_streams_of_their_own():
    """The classes the private graphs capture with (``isolated()`` of the platform's segment
    class, one per caller stream) use side streams of their own (a runner's graphs use the shared
    one), with ``capture_error_mode="thread_local"``; each call makes another. Checked on the
    classes (no GPU needed)."""
    from graphattn.cuda.graphs import CudaGraphSegment
    from graphattn.graphs.emulated import EmulatedGraphSegment
    from graphattn.hip.graphs import HipGraphSegment

    a, b = CudaGraphSegment.isolated(), CudaGraphSegment.isolated()
    assert issubclass(a, CudaGraphSegment) and a is not b
    assert a._streams is not b._streams and a._streams is not CudaGraphSegment._streams
    assert a.stream_key != CudaGraphSegment.stream_key
    assert a.capture_error_mode == "thread_local" and CudaGraphSegment.capture_error_mode == "global"
    h = HipGraphSegment.isolated()
    assert issubclass(h, HipGraphSegment) and h._stream_class._streams is not HipGraphSegment._stream_class._streams
    assert h._stream_class.capture_error_mode == "thread_local"
    assert EmulatedGraphSegment.isolated() is EmulatedGraphSegment  # no streams to keep apart


def test_buffer_growth_forgets_every_graph():
    """The graphs live in an EpochDict: when a metadata buffer replaces its storage, none is
    kept (and the next calls of a key start over)."""
    backend = make()
    md = backend.make_metadata(2)
    kv = make_kv(backend)
    q, idx = make_step(backend, 5)
    backend.plan(md, idx[:2])
    backend.forward(q[:2], kv, md)
    backend.forward(q[:2], kv, md)
    expect(backend, graphs=1)
    backend.plan(md, idx)  # 5 rows > 2 reserved: the index table grows (new storage)
    check_reference("after growth", backend, q, kv, idx, *backend.forward(q, kv, md))
    expect(backend, graphs=0, shapes=0)
    backend.plan(md, idx[:2])
    for _ in range(2):
        check_reference("after growth, 2 rows", backend, q[:2], kv, idx[:2], *backend.forward(q[:2], kv, md))
    expect(backend, replays=2)


def test_ops_run_where_something_watches_them_or_the_call_does_not_qualify(monkeypatch):
    """No private graph under a dispatch mode (the sanitizer and the emulator are ones: they
    see every op), for q needing grad, for q that is not contiguous, past one chunk, and for an
    oversized step (temporary index table); results stay right."""
    backend = make(torch.float32)
    md = backend.make_metadata(4)
    kv = make_kv(backend)
    q, idx = make_step(backend, 4)
    backend.plan(md, idx)
    for _ in range(2):
        with _Recorder() as mode:
            check_reference("dispatch mode", backend, q, kv, idx, *backend.forward(q, kv, md))
        assert "aten.bmm.default" in mode.ops, f"backend '{NAME}': the mode saw {mode.ops}"
        with torch.no_grad():  # a q that needs grad, autograd off: the ops run, not the graph
            check_reference("grad", backend, q, kv, idx, *backend.forward(q.clone().requires_grad_(), kv, md))
        with pytest.raises(ValueError, match="inference-only"):  # autograd on: refused
            backend.forward(q.clone().requires_grad_(), kv, md)
        strided = torch.empty(4, HEADS, 600)[..., :576].copy_(q)
        check_reference("non-contiguous q", backend, strided, kv, idx, *backend.forward(strided, kv, md))
    monkeypatch.setattr(torch_ref, "_GATHER_BUDGET_BYTES", TOPK * 576 * 4)  # one row per chunk
    for _ in range(2):
        check_reference("chunked", backend, q, kv, idx, *backend.forward(q, kv, md))
    expect(backend, captures=0)
    monkeypatch.undo()
    backend._graph_rows = 3  # the graph budget: 3 rows
    for _ in range(2):
        check_reference("past the graph budget", backend, q, kv, idx, *backend.forward(q, kv, md))
    expect(backend, captures=0)
    backend._graph_rows = 4
    md.mark_captured()  # as a runner's capture does: a larger step is oversized now
    q6, idx6 = make_step(backend, 6)
    backend.plan(md, idx6)
    assert md.oversized
    for _ in range(2):
        check_reference("oversized step", backend, q6, kv, idx6, *backend.forward(q6, kv, md))
    expect(backend, captures=0)


def test_graph_runner_captures_see_the_ops_and_breaks_use_private_graphs():
    """Inside a runner's capture the ops are captured (no private graph); an attention break
    of a breakable graph runs eagerly on each replay, so from its second call on it replays a
    private graph, on each step's fresh q and indices."""
    backend = make()
    md = backend.make_metadata(4)
    kv = make_kv(backend)
    static = {"q": torch.zeros(4, HEADS, 576, dtype=backend.dtype)}
    full = GraphRunner(lambda q: backend.forward(q * 1, kv, md), static, metadata=md, buckets=(4,),
                       platform=backend.platform)  # the emulator, on a GPU machine too
    full.capture()
    for step in range(3):
        q, idx = make_step(backend, 3)
        backend.plan(md, idx)
        out, lse = full.run(q=q)
        check_reference(f"full graph step {step}", backend, q, kv, idx, out[:3], lse[:3])
    expect(backend, captures=0)

    attention = eager_on_graph(backend.forward, out="out")
    breakable = GraphRunner(lambda q: attention(q * 1, kv, md), static, metadata=md, buckets=(4,), mode="breakable",
                            platform=backend.platform)
    backend.plan(md, make_step(backend, 4)[1])
    breakable.capture()
    for step in range(4):
        q, idx = make_step(backend, 3)
        backend.plan(md, idx)
        breakable.graphs[4].out[0].fill_(float("nan"))
        out, lse = breakable.run(q=q)
        check_reference(f"breakable step {step}", backend, q, kv, idx, out[:3], lse[:3])
    expect(backend, "breakable graph", captures=1)
    assert stats(backend)["replays"] >= 3, f"backend '{NAME}': {stats(backend)}"


def test_torch_compile_traces_the_ops():
    """Under torch.compile the call is traced as ops (no private graph), equal to eager."""
    backend = make()
    md = backend.make_metadata(3)
    kv = make_kv(backend)
    q, idx = make_step(backend, 3)
    backend.plan(md, idx)
    eager = backend.forward(q, kv, md)
    torch._dynamo.reset()
    compiled = torch.compile(backend.forward, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        check_same("compiled", compiled(q, kv, md), eager)
    expect(backend, captures=0)
    torch._dynamo.reset()


def test_a_failed_capture_turns_graphs_off_and_runs_the_ops(caplog):
    class Failing(EmulatedGraphSegment):
        def capture_begin(self):
            raise RuntimeError("operation not permitted when stream is capturing")

    class FailingPlatform(CpuPlatform):
        def eager_graph_class(self):
            return Failing

    backend = make(platform=FailingPlatform())
    md = backend.make_metadata(3)
    kv = make_kv(backend)
    with caplog.at_level(logging.WARNING, logger="graphattn.backends._replay"):
        for step in range(4):
            q, idx = make_step(backend, 3)
            backend.plan(md, idx)
            check_reference(f"step {step}", backend, q, kv, idx, *backend.forward(q, kv, md))
    assert "operation not permitted" in (backend._graphs.failed or "")
    assert [r.message for r in caplog.records if "torch" in r.message and "op by op" in r.message], caplog.text
    expect(backend, "after a failed capture", shapes=0, graphs=0, captures=0, replays=0)


def test_graphs_are_freed_with_the_backend():
    """Nothing global and nothing cyclic holds a graph: dropping the backend frees its graphs
    and statics at once (no garbage collection needed)."""
    backend, md, kv, q, idx = captured()
    shape = statics(backend)[0]
    refs = [weakref.ref(backend), weakref.ref(shape.out), weakref.ref(shape.q)]
    refs += [weakref.ref(graph[0].__self__) for graph in shape.graphs.values()]
    del backend, shape
    assert [r() for r in refs] == [None] * len(refs), f"backend '{NAME}': graphs outlived the backend"


def test_switch_off_and_the_platform_decide(monkeypatch):
    """``GRAPHATTN_TORCH_GRAPHS=0`` (read at import) turns private graphs off; without real
    graphs (the CPU platform) there are none either. ``graphattn list`` notes it on a GPU."""
    assert make(platform=CpuPlatform())._graphs is None, f"backend '{NAME}': graphs without real graphs"
    assert TorchBackend.notes(CpuPlatform()) == [], f"backend '{NAME}'"
    notes = TorchBackend.notes(EmulatedGraphsPlatform())
    assert any("private graph" in n and "GRAPHATTN_TORCH_GRAPHS=0" in n for n in notes), f"backend '{NAME}': {notes}"
    monkeypatch.setattr(torch_ref, "_EAGER_GRAPHS", False)
    backend = make()
    assert backend._graphs is None, f"backend '{NAME}': graphs with the switch off"
    notes = TorchBackend.notes(EmulatedGraphsPlatform())
    assert notes == ["eager calls run op by op (GRAPHATTN_TORCH_GRAPHS=0)"], f"backend '{NAME}': {notes}"
    md = backend.make_metadata(3)
    kv = make_kv(backend)
    for _ in range(3):
        q, idx = make_step(backend, 3)
        backend.plan(md, idx)
        check_reference("switch off", backend, q, kv, idx, *backend.forward(q, kv, md))


def test_switch_is_read_from_the_environment_at_import():
    code = "from graphattn.backends import torch_ref; print(torch_ref._EAGER_GRAPHS)"
    for value, want in (("0", "False"), ("off", "False"), ("1", "True"), ("", "True")):
        env = dict(os.environ, GRAPHATTN_TORCH_GRAPHS=value, GRAPHATTN_PLATFORM="cpu")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip() == want, f"{value!r}: {proc.stdout}{proc.stderr[-2000:]}"
    env = dict(os.environ, GRAPHATTN_TORCH_GRAPHS="maybe", GRAPHATTN_PLATFORM="cpu")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "GRAPHATTN_TORCH_GRAPHS='maybe'" in proc.stderr, proc.stderr[-2000:]


# -- real graphs ----------------------------------------------------------------------------------


@pytest.fixture(params=["cuda", "hip"])
def gpu_platform(request, monkeypatch):
    """Real CUDA graph segments, and HIP's segment rules forced onto NVIDIA hardware."""
    monkeypatch.setenv("GRAPHATTN_PLATFORM", request.param)
    reset_platform_cache()
    assert current_platform().eager_graph_class() is not None
    yield current_platform()
    monkeypatch.undo()
    reset_platform_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("heads,rows", [(16, 1), (16, 8), (128, 1), (128, 8)])
def test_real_graph_replays_equal_the_op_path_bitwise(gpu_platform, heads, rows, kv_dtype):
    """On the GPU: the second call captures a real graph, replays equal the op path bit for bit
    (NaN in q, -1 and all-invalid rows included), per KV pool (layer) and per stream."""
    backend = make(torch.bfloat16, kv_dtype, heads=heads, topk=512, platform=gpu_platform)
    assert backend._graphs is not None, f"backend '{NAME}': no private graphs on {gpu_platform.name}"
    ops = op_path(backend)
    md = backend.make_metadata(8)
    layers = [make_kv(backend, pool=4096) for _ in range(3)]
    calls = 0
    for step in range(4):
        for layer, kv in enumerate(layers):
            q, idx = make_step(backend, rows, pool=4096)
            q[0, 0, 3] = float("nan")
            idx[-1] = -1
            backend.plan(md, idx)
            out = poisoned_out(backend, rows) if layer == 1 else None
            res = backend.forward(q, kv, md, out=out)
            calls += 1
            what = f"{gpu_platform.name}, {heads} heads x {rows} rows, kv {kv_dtype}, step {step}, layer {layer}"
            check_same(what, res, ops.forward(q, kv, md))
            check_reference(what, backend, q, kv, idx, *res)
            assert (res[0][-1] == 0).all() and (res[1][-1] == float("-inf")).all(), \
                f"backend '{NAME}' ({what}): the all-invalid row is not out 0, lse -inf"
    expect(backend, gpu_platform.name, shapes=1, graphs=3, captures=3, replays=calls - len(layers))
    first = backend.forward(q, layers[0], md)
    snapshot = tuple(t.clone() for t in first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # another stream: its own graphs and pool
        for _ in range(3):
            res = backend.forward(q, layers[0], md)
            check_same("side stream", res, snapshot)
    torch.cuda.current_stream().wait_stream(side)
    check_same("earlier result after later calls", first, snapshot)
    expect(backend, captures=4, shapes=2)
