"""BreakableGraph: segments, breaks, eager_on_graph, buffer marking, HIP rules (CPU emulator)."""

from __future__ import annotations

import pytest
import torch

from graphattn.common import GraphMetadata, GraphSafetyError, GrowOnlyBuffer, capture_scope
from graphattn.graphs import BreakableGraph, eager_on_graph
from graphattn.graphs.emulated import EmulatedGraphSegment
from graphattn.common.platform import current_platform, reset_platform_cache
from graphattn.hip.graphs import HipGraphSegment


pytestmark = pytest.mark.usefixtures("cpu_platform")


calls = {"rescale": 0}


@eager_on_graph
def rescale(y: torch.Tensor) -> torch.Tensor:
    """A break that reads a value back to the host (not capturable): y / max|y|."""
    calls["rescale"] += 1
    return y / y.abs().max().item()


@eager_on_graph
def split_sorted(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A break returning two tensors."""
    values, order = torch.sort(z, dim=1)
    return values, order


def three_segments(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [rows, d] @ w [d, e] -> break -> tanh -> break -> combine: 3 segments, 2 breaks."""
    y = rescale(x @ w)
    values, order = split_sorted(torch.tanh(y) + 1)
    return values * 2 + order.to(values.dtype)


def test_breakable_graph_with_two_breaks_replays_new_inputs(platform_name):
    x, w = torch.randn(5, 6), torch.randn(6, 7)
    graph = BreakableGraph()
    out = graph.capture(three_segments, x, w)
    assert (graph.num_segments, graph.num_breaks) == (3, 2)
    if platform_name == "hip":
        assert all(isinstance(s, HipGraphSegment) for s in graph.segments)
    for _ in range(3):
        x.copy_(torch.randn(5, 6))
        w.copy_(torch.randn(6, 7))
        out.fill_(float("nan"))  # poison
        replayed = graph.replay()
        assert replayed is out, "replay must write the captured output in place"
        torch.testing.assert_close(replayed, three_segments(x, w), msg=platform_name)


def test_break_runs_eagerly_on_every_replay():
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    graph = BreakableGraph()
    graph.capture(three_segments, x, w)
    before = calls["rescale"]
    graph.replay()
    graph.replay()
    assert calls["rescale"] == before + 2


def test_eager_on_graph_outside_capture_just_calls():
    y = torch.randn(4, 4)
    torch.testing.assert_close(rescale(y), y / y.abs().max())
    assert getattr(rescale, "eager_on_graph", False)


def test_full_graph_captures_breaks_inline():
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    graph = BreakableGraph(breaks=False)
    with pytest.raises(GraphSafetyError, match="host"):  # rescale's .item() is now captured
        graph.capture(three_segments, x, w)
    inline = BreakableGraph(breaks=False)
    out = inline.capture(lambda a: split_sorted(a * 2)[0], x)
    assert (inline.num_segments, inline.num_breaks) == (1, 0)
    x.copy_(torch.randn(3, 4))
    torch.testing.assert_close(inline.replay(), torch.sort(x * 2, dim=1).values)
    assert out.data_ptr() == inline.out.data_ptr()


def test_break_at_start_gives_an_empty_first_segment(platform_name):
    x = torch.randn(4, 4)
    graph = BreakableGraph()
    graph.capture(lambda a: rescale(a) + 1, x)
    assert graph.num_segments == 2 and graph.segments
    x.copy_(torch.randn(4, 4))
    torch.testing.assert_close(graph.replay(), x / x.abs().max() + 1)


def test_break_must_keep_its_output_shape():
    box = {"rows": 3}

    @eager_on_graph
    def shaped(t):
        return t[: box["rows"]] * 1

    x = torch.randn(4, 2)
    graph = BreakableGraph()
    graph.capture(lambda a: shaped(a) + 1, x)
    box["rows"] = 2
    with pytest.raises(RuntimeError, match="captured shape"):
        graph.replay()


def test_capture_marks_the_buffers_and_metadata_it_used(platform_name):
    meta = GraphMetadata(8, 2, 3, torch.float32, "cpu", padded_heads=4, d_qk=8, d_v=4)
    untouched = GrowOnlyBuffer("untouched", (4,), torch.float32, "cpu", rows=4)
    scratch = GrowOnlyBuffer("scratch", (4,), torch.float32, "cpu", rows=4)

    class Cache:  # holds a view taken before capture: only the tracker sees it is used
        def __init__(self):
            self.buf, self.pre = scratch, scratch.view(4)

    cache = Cache()

    def step(q):
        return meta.zero_padded_q(q).sum() + cache.pre.sum()

    graph = BreakableGraph()
    graph.capture(step, torch.randn(3, 2, 8))
    assert meta.q_pad_captured and meta.captured
    assert scratch.captured, "a buffer a captured op touched must be marked"
    assert not untouched.captured


@pytest.mark.skipif(torch.cuda.is_available(), reason="HIP over the emulator needs no GPU")
def test_hip_rules_refuse_nested_capture(monkeypatch):
    monkeypatch.setenv("GRAPHATTN_PLATFORM", "hip")
    reset_platform_cache()  # the cpu_platform fixture restores the cpu platform afterwards
    cls = current_platform().graph_segment_class()
    assert issubclass(cls, HipGraphSegment) and cls.platform is current_platform()
    seg = HipGraphSegment()
    assert seg.emulated and isinstance(seg._inner, EmulatedGraphSegment)
    with capture_scope(), pytest.raises(GraphSafetyError, match="already capturing"):
        seg.capture_begin()
    seg.capture_begin()
    with pytest.raises(GraphSafetyError, match="capturing"):
        seg.replay()
    seg.capture_end()
    seg.replay()


def test_capture_error_leaves_no_capture_open():
    def bad(t):
        t = t * 2
        raise ValueError("boom")

    graph = BreakableGraph()
    with pytest.raises(ValueError, match="boom"):
        graph.capture(bad, torch.randn(2))
    from graphattn.common.capture import is_capturing

    assert not is_capturing()
    with pytest.raises(RuntimeError, match="before capture"):
        graph.replay()


def test_graph_benchmark_runs_small_on_the_cpu(tmp_path, capsys):
    import json

    from graphattn.bench import graphs as bench

    path = tmp_path / "bench.json"
    assert bench.main(["--iters", "2", "--max-rows", "8", "--rows", "4", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    for key in ("raw_us", "graph_us", "runner_us", "one_break_us", "sanitizer_us", "capture_s"):
        assert isinstance(res[key], float), (key, res)
    assert res["buckets"] == 4 and "GraphRunner.run" in capsys.readouterr().out


def test_capture_keeps_the_garbage_collector_off_and_restores_it():
    """No collection mid-capture (it could free an earlier graph's pool); the state is restored,
    also after a failed capture and when the caller had the collector off already."""
    import gc

    seen = []

    def step(x):
        seen.append(gc.isenabled())
        return x + 1

    def failing(x):
        seen.append(gc.isenabled())
        raise ValueError("boom")

    x = torch.randn(4)
    assert gc.isenabled()
    BreakableGraph().capture(step, x)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ValueError, match="boom"):
        BreakableGraph().capture(failing, x)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        BreakableGraph().capture(step, x)
        assert not gc.isenabled(), "a caller's disabled collector must stay disabled"
    finally:
        gc.enable()


def test_break_with_out_keyword_writes_in_place_on_replay():
    """eager_on_graph(fn, out="out"): replays hand fn the captured outputs, so the segments
    after the break read fresh results and nothing is copied."""
    seen = []

    @eager_on_graph(out="out")
    def scaled(a, out=None):
        seen.append(out)
        res = torch.empty_like(a) if out is None else out
        torch.mul(a, a.abs().max().item(), out=res)  # .item(): must run eagerly
        return res

    x = torch.randn(4, 4)
    graph = BreakableGraph()
    out = graph.capture(lambda a: scaled(a * 2) + 1, x)
    captured_mid = graph._breaks[0].out
    assert seen == [None]
    for _ in range(2):
        x.copy_(torch.randn(4, 4))
        out.fill_(float("nan"))
        res = graph.replay()
        assert seen[-1] is captured_mid, "the replay must pass the captured output"
        torch.testing.assert_close(res, (x * 2) * (x * 2).abs().max() + 1)


def test_runners_and_standalone_graphs_capture_on_streams_of_their_own():
    """Each GraphRunner captures its buckets with one segment class of its own, and a
    BreakableGraph made on its own gets one too: graphs freed at different times never share a
    capture stream (torch frees a stream's cuBLAS workspaces when any graph captured on it is
    destroyed, pytorch/pytorch#193402). Runners keep torch's capture error mode. The classes are
    checked as the CUDA rules build them (no GPU needed)."""
    from graphattn.cuda.graphs import CudaGraphSegment
    from graphattn.graphs import BreakableGraph, GraphRunner

    class Cuda(type(current_platform())):
        def graph_segment_class(self):
            return CudaGraphSegment

    platform = Cuda()
    static = {"x": torch.randn(4, 3)}
    a = GraphRunner(lambda x: x * 2, static, buckets=(4,), platform=platform)
    b = GraphRunner(lambda x: x * 2, static, buckets=(4,), platform=platform)
    for runner in (a, b):
        cls = runner._segment_class
        assert issubclass(cls, CudaGraphSegment) and cls._streams is not CudaGraphSegment._streams, cls
        assert cls.capture_error_mode == "global", cls.capture_error_mode
    assert a._segment_class._streams is not b._segment_class._streams
    g, h = BreakableGraph(platform), BreakableGraph(platform)
    assert g.segment_class._streams is not h.segment_class._streams
    assert g.segment_class._streams is not CudaGraphSegment._streams
