"""The CPU graph emulator refuses what a real CUDA/HIP capture refuses, and tracks every
storage a captured op borrows.

- Host reads: ``tolist``, ``numpy``, printing and ``.cpu()`` reach no aten op on the CPU, and
  ops whose output size depends on values (boolean indexing, ``unique``, ...) must read that
  size back; a real capture fails on each, so the emulator must not bake the value it read.
- A custom op that returns memory something else keeps (a backend's workspace) borrows it.
- A capture under ``torch.inference_mode()`` replays outside it, as a real graph does.
- Wrapper tensor subclasses and sparse tensors are tracked through their parts, or refused.

Every test runs on the ``cpu`` emulator and under the HIP rules over it where it captures a
graph (the ``platform_name`` fixture).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_map

from graphattn.common import (CapturedShapeChangedError, FreedCaptureBufferError, GraphSafetyError,
                              HostReadbackError, UntrackableTensorError)
from graphattn.graphs import BreakableGraph, GraphRunner, eager_on_graph

from test_sanitizer import track  # the real-graph sanitizer mode, no graph

pytestmark = pytest.mark.usefixtures("cpu_platform")


def replays_like_eager(fn, make_input, replays: int = 3) -> None:
    """Capture ``fn`` on one random input, then replay it on fresh ones against eager."""
    x = make_input()
    graph = BreakableGraph()
    graph.capture(fn, x)
    for _ in range(replays):
        x.copy_(make_input())
        torch.testing.assert_close(graph.replay(), fn(x))


# -- bug 1: host reads and data-dependent output sizes ----------------------------------------
HOST_READS = {
    "tolist": (lambda x: x * sum(v > 0 for v in x.tolist()), "Tensor.tolist"),
    "numpy": (lambda x: x * float(x.numpy().sum() > 0), "Tensor.numpy"),
    "np.asarray": (lambda x: x * float(np.asarray(x).max()), "numpy.asarray"),
    "print": (lambda x: (print(x), x * 2)[1], "printing a tensor"),
    "f-string": (lambda x: (f"{x}", x * 2)[1], "formatting a tensor"),
    ".cpu()": (lambda x: x.cpu() * 2, r"Tensor.cpu\(\)"),
    ".to('cpu')": (lambda x: x.to("cpu") * 2, r"Tensor.to\('cpu'\)"),
}


@pytest.mark.parametrize("case", list(HOST_READS))
def test_host_reads_that_reach_no_aten_op_are_refused(platform_name, case):
    fn, what = HOST_READS[case]
    with pytest.raises(HostReadbackError, match=what) as info:
        BreakableGraph().capture(fn, torch.randn(6))
    assert isinstance(info.value, GraphSafetyError)
    assert "Fix:" in str(info.value), str(info.value)
    # Host data made into tensors, moves to another dtype or to the device another tensor is
    # on, and an eager break (which runs outside the capture) read nothing back.
    host = np.arange(6, dtype=np.float32)
    replays_like_eager(
        lambda x: (x.to(torch.float64).to(x.device) * 2 + torch.ones(6).to(x.device)
                   + torch.tensor([1.0, 2, 3, 4, 5, 6]) + torch.as_tensor(host) + torch.from_numpy(host)),
        lambda: torch.randn(6),
    )
    replays_like_eager(lambda x: eager_scale_by_positives(x) + 1, lambda: torch.randn(6))


@eager_on_graph
def eager_scale_by_positives(x: torch.Tensor) -> torch.Tensor:
    """A graph break that reads values on the host: legal, it runs eagerly on every replay."""
    return x * sum(v > 0 for v in x.tolist())


# Each refused op with its fixed-size alternative, which must still capture and replay right.
DATA_DEPENDENT = {
    "x[mask]": (lambda x: x[x > 0].sum(), lambda x: torch.where(x > 0, x, 0).sum()),
    "x[uint8 mask]": (lambda x: x[(x > 0).to(torch.uint8)].sum(), lambda x: x.masked_fill(x <= 0, 0).sum()),
    "masked_select": (lambda x: torch.masked_select(x, x > 0).sum(),
                      lambda x: x[torch.nonzero_static(x > 0, size=8, fill_value=8).squeeze(1).clamp(max=7)]),
    "index_put_ with a mask": (
        lambda x: x.clone().index_put_((x > 0,), torch.tensor(1.0), accumulate=True),
        lambda x: x.clone().index_put_((x > 0,), torch.tensor(0.5)),  # runs as masked_fill_
    ),
    "unique": (lambda x: torch.unique(x.round()).sum(), lambda x: x.round().sort().values),
    "unique(dim)": (lambda x: torch.unique(x.round().view(4, 2), dim=0).sum(), lambda x: x.round().view(4, 2)),
    "unique_consecutive": (lambda x: torch.unique_consecutive(x.round()).sum(), lambda x: x.round().cumsum(0)),
    "repeat_interleave": (
        lambda x: torch.repeat_interleave(x, (x > 0).long() + 1).sum(),
        lambda x: torch.repeat_interleave(x, torch.full((8,), 2), output_size=16),
    ),
    "bincount": (lambda x: torch.bincount((x > 0).long()).float().sum(),
                 lambda x: torch.zeros(2).scatter_add_(0, (x > 0).long(), torch.ones(8))),
    "to_sparse": (lambda x: (x.relu().to_sparse() * 2).to_dense(), lambda x: x.relu() * 2),
}


@pytest.mark.parametrize("case", list(DATA_DEPENDENT))
def test_data_dependent_output_sizes_are_refused(platform_name, case):
    refused, alternative = DATA_DEPENDENT[case]
    replays_like_eager(alternative, lambda: torch.randn(8) * 3)
    with pytest.raises(HostReadbackError, match="output whose size depends on device values") as info:
        BreakableGraph().capture(refused, torch.randn(8) * 3)
    assert "Fix:" in str(info.value), str(info.value)


def test_sanitizer_refuses_data_dependent_ops_on_device_tensors_only():
    """The sanitizer rides on real captures: a CPU tensor's boolean index is legal there, a
    device tensor's (a meta tensor stands in for one here) is not."""
    x = torch.randn(8)
    tracker, out = track(lambda t: t[t > 0], x)
    torch.testing.assert_close(out, x[x > 0])
    dev = torch.empty(8, device="meta")
    with pytest.raises(HostReadbackError, match="aten.index.Tensor"):
        track(lambda t: t[t > 0], dev)
    with pytest.raises(HostReadbackError, match="repeat_interleave"):
        track(lambda t: torch.repeat_interleave(t, torch.ones(8, dtype=torch.long, device="meta")), dev)
    track(lambda t: t.index_put_((t > 0,), torch.tensor(0.0)), dev)  # masked_fill_: no read-back


class Limit:
    """Python state a custom op reads besides its arguments."""

    n = 3


@torch.library.custom_op("graphattn_test_refusals::first_n", mutates_args=())
def first_n(x: torch.Tensor) -> torch.Tensor:
    """``2 * x[:Limit.n]``: its output size follows a global, not its arguments."""
    return x[: Limit.n] * 2


@first_n.register_fake
def _(x):
    return x.new_empty(Limit.n)


def test_a_shape_that_changes_on_replay_is_a_graph_safety_error(platform_name, monkeypatch):
    monkeypatch.setattr(Limit, "n", 3)
    x = torch.randn(6)
    graph = BreakableGraph()
    out = graph.capture(lambda t: first_n(t) + 1, x)
    x.copy_(torch.randn(6))
    torch.testing.assert_close(graph.replay(), x[:3] * 2 + 1)
    assert graph.out is out
    Limit.n = 2
    with pytest.raises(CapturedShapeChangedError, match=r"first_n.*returned shape \(2,\), captured \(3,\)") as info:
        graph.replay()
    assert isinstance(info.value, GraphSafetyError) and "Fix:" in str(info.value)


# -- bug 2: an op's output whose storage existed before the op -------------------------------
class Workspace:
    """A backend-owned workspace that a custom op writes and returns (not an argument)."""

    buf = torch.zeros(8)


@torch.library.custom_op("graphattn_test_refusals::scaled_into_workspace", mutates_args=())
def scaled_into_workspace(x: torch.Tensor) -> torch.Tensor:
    """``2 * x``, written into (and returned as a view of) ``Workspace.buf``."""
    Workspace.buf[: x.shape[0]].copy_(x * 2)
    return Workspace.buf[: x.shape[0]]


@scaled_into_workspace.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("graphattn_test_refusals::scaled_fresh_view", mutates_args=())
def scaled_fresh_view(x: torch.Tensor) -> torch.Tensor:
    """``3 * x`` as a view of a larger tensor it allocates: fresh memory nobody else holds."""
    big = torch.empty(2 * x.shape[0])
    big[: x.shape[0]].copy_(x * 3)
    return big[: x.shape[0]]


@scaled_fresh_view.register_fake
def _(x):
    return torch.empty_like(x)


def test_custom_op_returning_a_workspace_it_keeps_is_borrowed(platform_name, monkeypatch):
    monkeypatch.setattr(Workspace, "buf", torch.zeros(8))
    ws_ptr = Workspace.buf.data_ptr()
    x = torch.randn(4)
    graph = BreakableGraph(sanitize=True)
    graph.capture(lambda t: scaled_into_workspace(t) + scaled_fresh_view(t), x)
    gc.collect()  # the fresh view's temporary is graph-owned: nothing to check
    held = {s.data_ptr for s in graph.held_storages()}
    assert held == {x.data_ptr(), ws_ptr}, graph.held_storages()
    for _ in range(3):
        x.copy_(torch.randn(4))
        torch.testing.assert_close(graph.replay(), x * 5)
    Workspace.buf = torch.zeros(16)  # the backend grows its workspace: the captured one is freed
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match="scaled_into_workspace.*was freed"):
        graph.replay()


def test_sanitizer_borrows_memory_an_op_returns_but_did_not_allocate(monkeypatch):
    monkeypatch.setattr(Workspace, "buf", torch.randn(8))
    x = torch.randn(4)
    tracker, out = track(lambda t: scaled_into_workspace(t) * scaled_fresh_view(t), x)
    torch.testing.assert_close(out, 6 * x * x)
    assert {b.data_ptr for b in tracker.borrowed()} == {x.data_ptr(), Workspace.buf.data_ptr()}
    results = [b for b in tracker.borrowed() if b.arg == "result"]
    assert [b.op for b in results] == ["graphattn_test_refusals.scaled_into_workspace.default"], results


# -- bug 3: capture under inference mode, replay outside it ----------------------------------
def test_capture_under_inference_mode_replays_outside_it(platform_name):
    w = torch.randn(5, 3)
    for capture_inference in (True, False):
        acc = torch.randn(4, 3)
        x = torch.randn(4, 5)

        def step(t):
            acc.add_(t @ w)  # an in-place write to a buffer made outside inference mode
            return torch.tanh(t @ w) + 1

        graph = BreakableGraph()
        with torch.inference_mode(capture_inference):
            out = graph.capture(step, x)
        for _ in range(3):
            x.copy_(torch.randn(4, 5))
            before = acc.clone()
            torch.testing.assert_close(graph.replay(), torch.tanh(x @ w) + 1)
            torch.testing.assert_close(acc, before + x @ w)
        assert out.is_inference() == capture_inference, "the replay changed what the capture returned"
        assert not acc.is_inference()

        runner = GraphRunner(lambda t: t @ w * 2, {"t": torch.randn(4, 5)}, buckets=[1, 2, 4])
        with torch.inference_mode(capture_inference):
            runner.capture()
        for rows in (3, 1, 4):
            t = torch.randn(rows, 5)
            torch.testing.assert_close(runner.run(t=t), t @ w * 2, msg=f"rows={rows}")


# -- bug 4: wrapper subclasses and sparse tensors ----------------------------------------------
class OpaqueWrapper(torch.Tensor):
    """A wrapper subclass that does not say which tensor holds its data (no __tensor_flatten__)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    def __repr__(self):
        return "OpaqueWrapper()"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.inner if isinstance(t, OpaqueWrapper) else t  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


class ScaledWeight(torch.Tensor):
    """A traceable wrapper like an FP8 weight: ``data`` (fp16 here) times a per-tensor ``scale``."""

    @staticmethod
    def __new__(cls, data, scale):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.float32, device=data.device)

    def __init__(self, data, scale):
        self.data_, self.scale = data, scale

    def __tensor_flatten__(self):
        return ["data_", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return ScaledWeight(inner["data_"], inner["scale"])

    def __repr__(self):
        return "ScaledWeight()"

    def dequantized(self) -> torch.Tensor:
        """The float32 weight it stands for (outside any capture)."""
        return self.data_.float() * self.scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.data_.float() * t.scale if isinstance(t, ScaledWeight) else t  # noqa: E731
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


def test_wrapper_subclass_without_flatten_is_refused_naming_the_argument(platform_name):
    w, x = OpaqueWrapper(torch.randn(4, 4)), torch.randn(2, 4)
    with pytest.raises(UntrackableTensorError, match=r"'mat2' of op 'aten.mm.default' is a OpaqueWrapper") as info:
        BreakableGraph().capture(lambda t: torch.mm(t, w), x)
    assert isinstance(info.value, GraphSafetyError) and "__tensor_flatten__" in str(info.value)
    with pytest.raises(UntrackableTensorError, match="'mat2'"):
        track(lambda t: torch.mm(t, w), x)


def test_traceable_wrapper_subclass_is_tracked_through_its_parts(platform_name):
    w = ScaledWeight(torch.randn(4, 4).half(), torch.tensor(0.5))
    x = torch.randn(2, 4)
    graph = BreakableGraph(sanitize=True)
    graph.capture(lambda t: torch.mm(t, w) + 1, x)
    names = {s.name for s in graph.held_storages()}
    assert {"w.data_", "w.scale"} <= names, names
    for _ in range(3):  # the captured parts are read in place, as a real graph reads them
        x.copy_(torch.randn(2, 4))
        w.data_.copy_(torch.randn(4, 4).half())
        w.scale.fill_(float(torch.rand(())) + 0.5)
        torch.testing.assert_close(graph.replay(), x @ w.dequantized() + 1)
    w.data_ = torch.randn(4, 4).half()  # re-pointed: the captured part is freed
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match="'w.data_' of op 'aten.mm.default'.*was freed"):
        graph.replay()


def test_a_wrapper_made_during_capture_holds_its_parts_weakly(platform_name):
    data, scale, x = torch.randn(4, 4).half(), torch.tensor(3.0), torch.randn(2, 4)
    graph = BreakableGraph()
    graph.capture(lambda t: torch.mm(t, ScaledWeight(data, scale)) * 2, x)
    for _ in range(2):
        x.copy_(torch.randn(2, 4))
        data.copy_(torch.randn(4, 4).half())
        torch.testing.assert_close(graph.replay(), (x @ (data.float() * 3.0)) * 2)
    del data
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match="was freed"):
        graph.replay()


def _sparse(dense: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "coo":
        return dense.to_sparse()
    if layout == "bsr":
        return dense.to_sparse_bsr((2, 2))
    return dense.to_sparse_csr() if layout == "csr" else dense.to_sparse_csc()


def _values(s: torch.Tensor) -> torch.Tensor:
    return s._values() if s.layout == torch.sparse_coo else s.values()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "bsr"])
def test_sparse_operands_are_tracked_through_indices_and_values(platform_name, layout):
    a = _sparse(torch.randn(6, 6).relu(), layout)
    x = torch.randn(6, 3)
    graph = BreakableGraph(sanitize=True)
    graph.capture(lambda t: (a @ t) * 2, x)
    parts = {"coo": ["_indices()", "_values()"], "csr": ["crow_indices()", "col_indices()", "values()"],
             "bsr": ["crow_indices()", "col_indices()", "values()"],
             "csc": ["ccol_indices()", "row_indices()", "values()"]}[layout]
    assert {s.name for s in graph.held_storages()} == {"arg0"} | {f"a.{p}" for p in parts}
    for _ in range(3):
        x.copy_(torch.randn(6, 3))
        _values(a).copy_(torch.randn_like(_values(a)))
        torch.testing.assert_close(graph.replay(), (a.to_dense() @ x) * 2)
    del a
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match=r"'a\..*' of op .*was freed"):
        graph.replay()


def test_sanitizer_tracks_sparse_and_wrapper_parts():
    a = torch.randn(6, 6).relu().to_sparse()
    w = ScaledWeight(torch.randn(3, 5).half(), torch.tensor(2.0))
    x = torch.randn(6, 3)
    tracker, out = track(lambda t: torch.mm(torch.sparse.mm(a, t), w), x)
    torch.testing.assert_close(out, (a.to_dense() @ x) @ w.dequantized())
    ptrs = {b.data_ptr for b in tracker.borrowed()}
    assert ptrs == {x.data_ptr(), a._indices().data_ptr(), a._values().data_ptr(), w.data_.data_ptr(),
                    w.scale.data_ptr()}, tracker.borrowed()
