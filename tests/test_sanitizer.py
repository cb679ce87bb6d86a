"""Capture sanitizer: borrowed storages are tracked weakly and checked before any replay."""

from __future__ import annotations

import ctypes
import functools
import gc

import pytest
import torch

from graphattn.common import FreedCaptureBufferError, GraphSafetyError, GrowOnlyBuffer
from graphattn.graphs import BreakableGraph, eager_on_graph
from graphattn.graphs.sanitizer import (
    CaptureSanitizer,
    StorageTracker,
    collect_buffer_names,
    sanitize_enabled,
)


pytestmark = pytest.mark.usefixtures("cpu_platform")


def track(fn, *args):
    """Run ``fn`` under the sanitizer mode (no graph): returns (tracker, output)."""
    tracker = StorageTracker()
    with CaptureSanitizer(tracker):
        out = fn(*args)
    tracker.end_capture()
    return tracker, out


def test_sanitize_flag_and_env(monkeypatch):
    monkeypatch.setenv("GRAPHATTN_SANITIZE", "0")
    assert not sanitize_enabled() and sanitize_enabled(True)
    monkeypatch.setenv("GRAPHATTN_SANITIZE", "1")
    assert sanitize_enabled() and not sanitize_enabled(False)
    monkeypatch.delenv("GRAPHATTN_SANITIZE")
    assert not sanitize_enabled(), "production replays are not sanitized by default"


def test_classifies_by_storage_not_by_tensor_object():
    old, other = torch.randn(16), torch.randn(4)
    tracker, out = track(lambda: (old[4:8] + other) * torch.ones(4) + torch.tensor(1.0), )
    borrowed = tracker.borrowed()
    assert {b.data_ptr for b in borrowed} == {old.data_ptr(), other.data_ptr()}, borrowed
    assert out.untyped_storage().data_ptr() not in {b.data_ptr for b in borrowed}
    tracker.check()  # everything alive and in place


def test_freed_and_moved_storages_are_reported_with_op_and_argument():
    a, b = torch.randn(8), torch.randn(8)
    tracker, out = track(lambda: a.mul_(2).add_(b))
    b.untyped_storage().resize_(1024)  # moved
    with pytest.raises(FreedCaptureBufferError, match=r"'other' of op 'aten.add_.Tensor'.*moved"):
        tracker.check()
    del a, out  # freed (out is a itself); a is first in use order, so reported first
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match=r"aten.mul_.Tensor.*was freed"):
        tracker.check()


def test_host_readback_is_refused_by_the_emulator_but_legal_for_cpu_tensors_on_gpus():
    from graphattn.graphs.emulated import EmulatedGraphSegment

    seg = EmulatedGraphSegment()
    seg.capture_begin()
    try:
        with pytest.raises(GraphSafetyError, match="_local_scalar_dense"):
            torch.randn(3).sum().item()
    finally:
        seg.capture_end()
    # The sanitizer rides on real captures: a CPU tensor's .item() is legal there.
    tracker, value = track(lambda t: t.sum().item(), torch.ones(3))
    assert value == 3.0


class Backend:
    """Deliberately wrong: ``grow`` rebinds the captured counter (docs/design.md bug 1)."""

    def __init__(self):
        self.multi_cta_counter = torch.zeros(4, 2, dtype=torch.int32)
        self.out1 = torch.randn(4)

    def grow(self, rows: int) -> None:
        self.multi_cta_counter = torch.zeros(rows, 2, dtype=torch.int32)


calls = {"n": 0}


@eager_on_graph
def eager_double(t: torch.Tensor) -> torch.Tensor:
    calls["n"] += 1
    return t * 2


def test_wrong_object_is_caught_before_any_segment_or_break_runs():
    backend, x = Backend(), torch.randn(4)

    def step(t):
        backend.out1.copy_(t + 1)  # segment 1 writes a borrowed buffer
        y = eager_double(t)  # break
        c = backend.multi_cta_counter  # segment 2 reads the counter
        c.add_(1)
        out = y * c[:, 0]
        c.zero_()
        return out

    graph = BreakableGraph(sanitize=True)
    graph.capture(step, x)
    backend.grow(64)
    gc.collect()
    backend.out1.fill_(float("nan"))  # poison: an early segment must not run
    before = calls["n"]
    with pytest.raises(FreedCaptureBufferError, match="multi_cta_counter"):
        graph.replay()
    assert bool(backend.out1.isnan().all()), "segment 1 ran although segment 2 was unsafe"
    assert calls["n"] == before, "the break ran although the replay was refused"


def test_buffer_names_prefer_grow_only_buffer_names():
    buf = GrowOnlyBuffer("q_pad", (4,), torch.float32, "cpu", rows=2)

    class Owner:
        def __init__(self):
            self.alias = buf.tensor
            self.buffer = buf
            self.scratch = torch.randn(3)

        def run(self, t):
            return t

    owner, loose = Owner(), torch.randn(2)
    names = collect_buffer_names(
        [("fn", owner.run), ("p", functools.partial(lambda a, b: a, loose)), ("kw", torch.randn(1))]
    )
    assert names[buf.tensor.untyped_storage()._cdata] == "q_pad"
    assert names[owner.scratch.untyped_storage()._cdata] == "Owner.scratch"
    assert loose.untyped_storage()._cdata in names


def test_blind_spot_work_that_bypasses_the_dispatcher_is_not_seen():
    """Documented limitation: a raw kernel launch (here: numpy on the same memory) never
    reaches the dispatcher, so the sanitizer cannot know the graph depends on that buffer."""
    hidden = torch.randn(4)

    def raw_launch(ptr: int) -> None:  # a kernel that gets an address, not a tensor
        (ctypes.c_float * 4).from_address(ptr)[0] += 1.0

    before = hidden[0].item()
    tracker, _ = track(lambda: raw_launch(hidden.data_ptr()))
    assert hidden[0].item() == before + 1.0
    assert tracker.borrowed() == []
