"""Graphs after something went wrong: a capture that raised (retried on the same BreakableGraph,
or a GraphRunner bucket that failed), a break that frees storage a later segment reads, padding
after the caller wrote the runner's static inputs itself, and checks on graphs that recorded
nothing (CPU emulator; a GPU is simulated where its path differs)."""

from __future__ import annotations

import gc

import pytest
import torch

from graphattn.common import (
    CaptureCapacityError,
    CapturedBufferGrowthError,
    FreedCaptureBufferError,
    GraphMetadata,
    GrowOnlyBuffer,
)
from graphattn.common.capture import is_capturing
from graphattn.common.platform import current_platform
from graphattn.graphs import BreakableGraph, GraphRunner, eager_on_graph
from graphattn.graphs.emulated import EmulatedGraphSegment

pytestmark = pytest.mark.usefixtures("cpu_platform")


class Transient(RuntimeError):
    """A capture failure the caller fixes before retrying."""


# -- a capture that raised, retried on the same BreakableGraph ----------------------------------
def test_retry_after_a_failed_capture_replays_only_the_retry(platform_name):
    breaks, fail = [], [True]
    counter = torch.zeros(1)

    @eager_on_graph
    def scale(y):
        breaks.append(1)
        return y * 3

    def fn(x, w):
        counter.add_(1)  # a side effect each replay must do exactly once
        y = scale(x @ w)
        if fail[0]:
            raise Transient("failed after the first break")
        return torch.tanh(y) + 1

    x, w = torch.randn(4, 5), torch.randn(5, 3)
    graph = BreakableGraph()
    with pytest.raises(Transient):
        graph.capture(fn, x, w)
    assert (graph.num_segments, graph.num_breaks, graph.captured) == (0, 0, False)
    fail[0] = False
    out = graph.capture(fn, x, w)
    assert (graph.num_segments, graph.num_breaks) == (2, 1)
    for _ in range(3):
        x.copy_(torch.randn(4, 5))
        w.copy_(torch.randn(5, 3))
        out.fill_(float("nan"))
        counter.zero_()
        breaks.clear()
        graph.replay()
        assert counter.item() == 1 and len(breaks) == 1, (counter.item(), len(breaks))
        torch.testing.assert_close(out, torch.tanh(x @ w * 3) + 1)


def test_retry_does_not_check_storage_only_the_failed_attempt_borrowed(platform_name):
    fail = [True]

    def fn(x, extra=None):
        if extra is not None:
            x = x + extra.sum()
        if fail[0]:
            raise Transient("boom")
        return x * 2

    graph = BreakableGraph(sanitize=True)
    extra = torch.randn(3)
    with pytest.raises(Transient):
        graph.capture(fn, torch.randn(3), extra)
    del extra
    gc.collect()  # the failed attempt's borrowed temporary is gone
    fail[0] = False
    x = torch.randn(3)
    out = graph.capture(fn, x)
    graph.check()
    for _ in range(2):
        x.copy_(torch.randn(3))
        torch.testing.assert_close(graph.replay(), x * 2)
        assert out is graph.out


def test_failed_capture_releases_the_buffers_its_views_marked():
    md = GraphMetadata(4, num_heads=2, topk=6, dtype=torch.float32, device="cpu", counter_cols=2)
    held = GrowOnlyBuffer("held", (3,), torch.float32, "cpu", rows=4)
    held.view(4).copy_(torch.randn(4, 3))
    BreakableGraph().capture(lambda t: t + held.view(4), torch.randn(4, 3))  # a live graph holds it
    assert held.captured

    def step(q, rows, counter_rows):
        idx = md.indices.view(rows)  # marks the table captured
        return q + idx.float().sum() + held.view(4).sum() + md.counter.view(counter_rows).float().sum()

    with pytest.raises(CaptureCapacityError, match="multi_cta_counter"):
        BreakableGraph().capture(step, torch.randn(4), 4, 8)  # the table fits, the counter not
    assert not md.indices.captured and not md.counter.captured and not md.captured
    md.reserve(8)  # no graph holds them: they may grow
    assert md.capacity == 8
    assert held.captured  # the live graph's mark stays
    with pytest.raises(CapturedBufferGrowthError, match="held"):
        held.reserve(8)
    q = torch.randn(4)
    graph = BreakableGraph()
    out = graph.capture(step, q, 8, 8)
    assert md.indices.captured and md.counter.captured
    q.copy_(torch.randn(4))
    graph.replay()
    torch.testing.assert_close(out, q + md.indices.view(8).float().sum() + held.view(4).sum())


# -- a GraphRunner whose capture failed part way ------------------------------------------------
def test_runner_capture_failed_at_a_bucket_says_so_and_resumes():
    failing = [True]
    w = torch.randn(6)

    def step(x):
        if x.shape[0] == 2 and failing[0] and is_capturing():
            raise Transient("bucket 2 cannot be captured yet")
        return x * w[: x.shape[0]]

    runner = GraphRunner(step, {"x": torch.zeros(6)}, buckets=[1, 2, 6])
    with pytest.raises(Transient):
        runner.capture()
    assert list(runner.graphs) == [6]
    x = torch.randn(5)
    torch.testing.assert_close(runner.run(x=x), x * w[:5])  # the captured bucket still works
    with pytest.raises(RuntimeError, match=r"bucket 2 \(for 2 rows\) is not captured: capture\(\) "
                                           r"failed at bucket 2 \(Transient: bucket 2 cannot.*"
                                           r"missing buckets \[2, 1\]"):
        runner.run(x=torch.randn(2))
    failing[0] = False
    runner.capture()  # the missing buckets, largest first, into the same pool
    assert sorted(runner.graphs) == [1, 2, 6]
    assert len({id(p) for p in runner.pools()}) == 1
    for rows in (2, 1, 5, 2):
        x = torch.randn(rows)
        torch.testing.assert_close(runner.run(x=x), x * w[:rows])
    with pytest.raises(RuntimeError, match="already called"):
        runner.capture()


def test_runner_whose_first_capture_failed_leaves_its_metadata_unpinned():
    md = GraphMetadata(8, num_heads=2, topk=3, dtype=torch.float32, device="cpu", counter_cols=2)
    failing = [True]
    w = torch.randn(8)

    def step(x):
        rows = x.shape[0]
        y = x * w[:rows] + md.indices.view(rows).float().sum(1) + md.counter.view(rows).float().sum(1)
        if failing[0] and is_capturing():
            raise Transient("capture failed after the views")
        return y

    runner = GraphRunner(step, {"x": torch.zeros(8)}, metadata=md, buckets=[2, 8])
    with pytest.raises(Transient):
        runner.capture()
    assert not runner.graphs and not md.captured
    md.reserve(16)  # no graph holds the metadata: it may still grow
    failing[0] = False
    runner.capture()
    assert md.captured and md.capacity == 16
    for rows in (7, 2, 1):
        x = torch.randn(rows)
        torch.testing.assert_close(runner.run(x=x), x * w[:rows] - 3)  # indices are −1: 3 per row


# -- a break that frees storage a later segment reads --------------------------------------------
class DeviceLikeSegment(EmulatedGraphSegment):
    """An emulated segment that, like a real CUDA/HIP graph, does not check its own storages
    (``emulated = False``); it logs its replays."""

    emulated = False
    replays: list[int] = []

    def replay(self) -> None:
        """Log, then replay."""
        type(self).replays.append(id(self))
        super().replay()


def test_break_that_frees_a_later_segments_storage_is_refused_before_that_segment():
    class Sampler:
        def __init__(self):
            self.scale = torch.randn(4)
            self.grow = False

        @eager_on_graph
        def step(self, y):
            if self.grow:
                self.scale = torch.randn(8)  # rebinding frees the storage segment 2 reads
            return y * 1.0

    s = Sampler()

    def fn(x):
        return s.step(x + 1) * s.scale[:4]

    x = torch.randn(4)
    graph = BreakableGraph(sanitize=True, segment_class=DeviceLikeSegment)
    out = graph.capture(fn, x)
    first, second = graph.segments
    for _ in range(2):  # nothing freed: replays are right and not refused
        x.copy_(torch.randn(4))
        torch.testing.assert_close(graph.replay(), (x + 1) * s.scale)
    DeviceLikeSegment.replays.clear()
    s.grow = True
    out.fill_(float("nan"))
    with pytest.raises(FreedCaptureBufferError, match="Sampler.scale"):
        graph.replay()
    assert DeviceLikeSegment.replays == [id(first)], "segment 2 replayed on freed storage"
    assert torch.isnan(out).all()


# -- padding after the caller wrote the runner's static inputs -----------------------------------
def _scatter_runner(buckets):
    """A runner whose step writes each row's value into its cache slot (−1: no slot), as a KV
    write does: a padding row that is not inert writes a slot."""
    cache = torch.zeros(32)

    def step(x, slots):
        ok = slots >= 0
        idx = torch.where(ok, slots, torch.full_like(slots, 31))  # 31: scratch
        cache.index_copy_(0, idx, torch.where(ok, x, cache[idx]))
        return x * 2

    static = {"x": torch.zeros(8), "slots": torch.full((8,), -1, dtype=torch.int64)}
    runner = GraphRunner(step, static, {"slots": -1}, buckets=buckets)
    runner.capture()
    return runner, cache


def _expected_cache(x, slots):
    want = torch.zeros(32)
    want[slots] = x
    return want


def test_eager_step_on_the_static_inputs_leaves_the_next_buckets_padding_inert():
    runner, cache = _scatter_runner([1, 2, 4])  # static rows 8 > largest bucket 4
    slots = torch.randperm(30)
    runner.static["x"][:6] = torch.randn(6)  # an engine writing its inputs in place
    runner.static["slots"][:6] = slots[:6]
    runner.run(x=runner.static["x"][:6], slots=runner.static["slots"][:6])  # eager
    cache.zero_()
    x, live = torch.randn(3), slots[10:13]
    torch.testing.assert_close(runner.run(x=x, slots=live), x * 2)  # bucket 4: row 3 pads
    assert runner.static["slots"][3].item() == -1
    torch.testing.assert_close(cache[:31], _expected_cache(x, live)[:31])


def test_live_input_in_later_static_rows_leaves_larger_buckets_padding_inert():
    runner, cache = _scatter_runner([4, 8])
    slots = torch.randperm(30)
    runner.static["x"][4:7] = torch.randn(3)  # the caller's rows 4..6 of the static tensors
    runner.static["slots"][4:7] = slots[:3]
    runner.run(x=runner.static["x"][4:7], slots=runner.static["slots"][4:7])  # bucket 4
    cache.zero_()
    x, live = torch.randn(5), slots[10:15]
    torch.testing.assert_close(runner.run(x=x, slots=live), x * 2)  # bucket 8: rows 5..7 pad
    assert runner.static["slots"][5:8].tolist() == [-1, -1, -1]
    torch.testing.assert_close(cache[:31], _expected_cache(x, live)[:31])


# -- check() on graphs that recorded nothing ------------------------------------------------------
@pytest.fixture
def gpu_like_platform():
    """The CPU platform posing as a GPU one whose segments are real graphs (not the emulator),
    so graphs made with ``sanitize=False`` record nothing, as in production."""
    base = current_platform()

    class GpuLike(type(base)):
        has_gpu = property(lambda self: True)

        def graph_segment_class(self):
            return DeviceLikeSegment

    platform = GpuLike.__new__(GpuLike)
    platform.__dict__.update(base.__dict__)
    return platform


def test_check_of_graphs_captured_without_the_sanitizer_raises(gpu_like_platform, monkeypatch):
    w = torch.randn(4)
    graph = BreakableGraph(gpu_like_platform, sanitize=False)
    x = torch.randn(4)
    graph.capture(lambda t: t * w, x)
    assert not graph.tracking and graph.held_storages() == []
    x.copy_(torch.randn(4))
    torch.testing.assert_close(graph.replay(), x * w)  # replays pay for no check
    with pytest.raises(RuntimeError, match="captured without the capture sanitizer.*sanitize=True"):
        graph.check()

    def device_like_runner(sanitize):
        runner = GraphRunner(lambda x: x * w, {"x": torch.zeros(4)}, buckets=[4],
                             platform=gpu_like_platform, sanitize=sanitize)
        monkeypatch.setattr(runner, "_memory", lambda: 0)  # no device memory to ask about
        monkeypatch.setattr(runner, "_synchronize", lambda: None)
        return runner

    runner = device_like_runner(False)
    runner.check()  # before capture: nothing captured, nothing to check
    runner.capture()
    assert not runner.tracking and runner.held_storages() == []
    with pytest.raises(RuntimeError, match="GraphRunner.check\\(\\).*sanitize=True"):
        runner.check()

    tracked = device_like_runner(True)
    tracked.capture()
    assert tracked.tracking and tracked.held_storages()
    tracked.check()


def test_break_captured_in_inference_mode_replays_outside_it(platform_name):
    """Engines capture under torch.inference_mode(); a break's copy into the outputs made
    there (inference tensors) must still work when a replay runs outside it."""
    @eager_on_graph
    def brk(t):
        return t * 3

    x = torch.randn(5)
    graph = BreakableGraph()
    with torch.inference_mode():
        graph.capture(lambda t: brk(t * 2) + 1, x)
    for _ in range(2):
        x.copy_(torch.randn(5))
        torch.testing.assert_close(graph.replay(), x * 6 + 1, msg=lambda m: f"[{platform_name}] {m}")


def test_live_input_overlapping_the_rows_it_is_copied_into_is_refused(platform_name):
    w = torch.randn(4)
    runner = GraphRunner(lambda x: x * w, {"x": torch.zeros(8, 4)}, buckets=[2, 4])
    runner.capture()
    runner.static["x"][:6].copy_(torch.randn(6, 4))
    with pytest.raises(ValueError, match=r"'x'.*overlaps the rows \[:3\].*runner.static\['x'\]\[:rows\]"):
        runner.run(x=runner.static["x"][1:4])  # rows 1-3 would be copied into rows 0-2
    later = runner.static["x"][4:6].clone()
    out = runner.run(x=runner.static["x"][4:6])  # disjoint rows of the static tensor: copied
    torch.testing.assert_close(out, later * w, msg=lambda m: f"[{platform_name}] {m}")
