"""The CPU graph emulator bakes addresses like a real graph and catches the two docs/design.md bugs.

The "kernels" are plain torch ops (a q-pad copy + matmul, a counter add + reset) so these tests
do not depend on the Triton kernels. Every test runs on the ``cpu`` emulator and under the HIP
rules (``GRAPHATTN_PLATFORM=hip``, which layers HIP's segment over the emulator here).
"""

from __future__ import annotations

import gc

import pytest
import torch

from graphattn.common import FreedCaptureBufferError, GraphMetadata, GraphSafetyError
from graphattn.graphs import BreakableGraph, GraphRunner
from graphattn.graphs.emulated import EmulatedGraphSegment

H, PH, D, E, COLS = 3, 4, 16, 8, 4  # heads, padded heads, q dim, out dim, counter columns


pytestmark = pytest.mark.usefixtures("cpu_platform")


# -- the "kernels" ------------------------------------------------------------------------
def counter_kernel(x: torch.Tensor, w: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """``x [rows, D] @ w [D, E]``; exact only if ``counter [rows, COLS]`` int32 starts at 0.

    Like the multi-CTA kernel: every CTA increments, the last combines and resets to 0.
    """
    counter.add_(1)
    scale = counter.sum(1, keepdim=True).to(x.dtype) / counter.shape[1]  # 1 iff it was zero
    out = (x @ w) * scale
    counter.zero_()
    return out


def padded_matmul(q_pad: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``q_pad [rows, PH, D] @ w [D, E]`` for the real heads; padding heads must be zero."""
    out = q_pad @ w  # [rows, PH, E]
    return out[:, :H] + out[:, H:].sum(1, keepdim=True)  # a non-zero pad head shows up here


# -- bug 1: the counter rebinding, and its fix ---------------------------------------------
class RebindingCounterBackend:
    """docs/design.md bug 1: an eager call with more rows rebinds the captured counter."""

    def __init__(self, rows: int):
        self.multi_cta_counter = torch.zeros(rows, COLS, dtype=torch.int32)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows > self.multi_cta_counter.shape[0]:
            self.multi_cta_counter = torch.zeros(rows, COLS, dtype=torch.int32)  # THE BUG
        return counter_kernel(x, w, self.multi_cta_counter[:rows])


class MetadataCounterBackend:
    """The fix: the counter is a GrowOnlyBuffer (policy TEMPORARY) in GraphMetadata."""

    def __init__(self, rows: int):
        self.metadata = GraphMetadata(rows, H, 1, torch.float32, "cpu", counter_cols=COLS, d_qk=D, d_v=E)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return counter_kernel(x, w, self.metadata.counter_for(x.shape[0]))


# -- bug 2: the q-pad buffer replaced per bucket, and its fix ------------------------------
class StepMetadata:
    """A step metadata object that caches a padded-q buffer (the buggy engine's)."""

    q_pad_buffer: torch.Tensor | None = None


class ReplacingQPadBackend:
    """docs/design.md bug 2: a new zeroed q-pad buffer whenever the row count changes."""

    def forward(self, q: torch.Tensor, w: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        rows = q.shape[0]
        if meta.q_pad_buffer is None or meta.q_pad_buffer.shape[0] != rows:
            meta.q_pad_buffer = torch.zeros(rows, PH, D)  # THE BUG: frees the previous bucket's
        meta.q_pad_buffer[:, :H].copy_(q)
        return padded_matmul(meta.q_pad_buffer, w)


def metadata_qpad_forward(q: torch.Tensor, w: torch.Tensor, meta: GraphMetadata) -> torch.Tensor:
    """The fix: one grow-only q-pad buffer, a row slice per call."""
    return padded_matmul(meta.zero_padded_q(q), w)


def qpad_reference(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return q @ w


# -- tests: the bugs are caught -------------------------------------------------------------
def test_counter_rebinding_is_caught_naming_the_buffer(platform_name):
    backend = RebindingCounterBackend(rows=4)
    x, w = torch.randn(4, D), torch.randn(D, E)
    graph = BreakableGraph()
    graph.capture(backend.forward, x, w)
    x.copy_(torch.randn(4, D))
    torch.testing.assert_close(graph.replay(), x @ w, msg="replay before the bug must be right")
    backend.forward(torch.randn(16, D), w)  # a large eager call: rebinds, frees the old one
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match="multi_cta_counter") as info:
        graph.replay()
    assert "freed" in str(info.value), str(info.value)


def test_qpad_replaced_per_bucket_is_caught_naming_the_buffer(platform_name):
    backend, meta, w = ReplacingQPadBackend(), StepMetadata(), torch.randn(D, E)
    static_q = torch.randn(8, H, D)
    runner = GraphRunner(
        lambda q: backend.forward(q, w, meta), {"q": static_q}, buckets=[2, 4, 8]
    )
    runner.capture()  # largest first: each smaller bucket's warm-up frees the larger's buffer
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match="q_pad") as info:
        runner.run(q=torch.randn(7, H, D))  # bucket 8
    assert "q_pad_buffer" in str(info.value), str(info.value)
    q = torch.randn(2, H, D)  # the smallest bucket still holds a live buffer
    torch.testing.assert_close(runner.run(q=q), qpad_reference(q, w))


# -- tests: the fixed designs replay correctly ---------------------------------------------
def test_counter_in_metadata_survives_large_eager_calls(platform_name):
    backend, w = MetadataCounterBackend(rows=8), torch.randn(D, E)
    static_x = torch.randn(8, D)
    runner = GraphRunner(lambda x: backend.forward(x, w), {"x": static_x}, buckets=[1, 2, 4, 8])
    runner.capture()
    assert backend.metadata.captured, "the capture must mark the metadata"
    ptr = backend.metadata.counter.data_ptr()
    for rows in [3, 16, 1, 8, 40, 5, 2]:  # 16 and 40 run eagerly with temporary counters
        x = torch.randn(rows, D)
        out = runner.run(x=x).clone()
        torch.testing.assert_close(out, x @ w, msg=f"rows={rows}")
        assert backend.metadata.counter.data_ptr() == ptr, "the captured counter was replaced"
        assert int(backend.metadata.counter.tensor.abs().sum()) == 0, "counter not reset to 0"


def test_qpad_in_metadata_shared_by_all_buckets(platform_name):
    meta = GraphMetadata(8, H, 1, torch.float32, "cpu", padded_heads=PH, d_qk=D, d_v=E)
    w = torch.randn(D, E)
    runner = GraphRunner(
        lambda q: metadata_qpad_forward(q, w, meta), {"q": torch.randn(8, H, D)}, metadata=meta
    )
    runner.capture()
    assert meta.q_pad_captured
    for rows in [8, 1, 5, 2, 7, 4, 3]:
        q = torch.randn(rows, H, D)
        torch.testing.assert_close(runner.run(q=q), qpad_reference(q, w), msg=f"rows={rows}")
    # Every bucket's graph borrows the same q-pad storage: one largest-bucket buffer in all.
    qpads = [s for s in runner.held_storages() if s.name == "q_pad"]
    assert len(qpads) == 1, [s.name for s in runner.held_storages()]
    assert qpads[0].nbytes == meta.q_pad.nbytes() == 8 * PH * D * 4
    assert torch.count_nonzero(meta.q_pad.tensor[:, H:]) == 0, "padding heads were written"


# -- emulator mechanics ---------------------------------------------------------------------
def _capture_segment(fn, *args):
    seg = EmulatedGraphSegment()
    seg.capture_begin()
    try:
        out = fn(*args)
    finally:
        seg.capture_end()
    return seg, out


def test_functional_results_are_copied_into_captured_outputs():
    x = torch.randn(5, 3)
    seg, out = _capture_segment(lambda t: torch.tanh(t) * 2 + t.sum(0), x)
    before = out.data_ptr()
    x.copy_(torch.randn(5, 3))
    out.fill_(float("nan"))  # poison: the replay must overwrite every element
    seg.replay()
    assert out.data_ptr() == before
    torch.testing.assert_close(out, torch.tanh(x) * 2 + x.sum(0))


def test_in_place_writes_to_borrowed_buffers_replay_in_place():
    x, acc = torch.randn(6), torch.randn(6)
    seg, _ = _capture_segment(lambda a, b: b.add_(a * 3), x, acc)
    start = acc.clone()
    seg.replay()
    torch.testing.assert_close(acc, start + 3 * x)


def test_view_made_during_capture_of_old_storage_is_held_weakly():
    holder = {"buf": torch.randn(10)}
    seg, view = _capture_segment(lambda: holder["buf"][2:5].mul_(2))
    del holder["buf"], view  # the view made during capture must not keep the storage alive
    gc.collect()
    with pytest.raises(FreedCaptureBufferError, match="was freed"):
        seg.replay()


def test_moved_storage_is_refused():
    buf = torch.randn(8)
    seg, _ = _capture_segment(lambda: buf.add_(1))
    buf.untyped_storage().resize_(4096)  # reallocates: same storage, new address
    with pytest.raises(FreedCaptureBufferError, match="moved"):
        seg.replay()


def test_host_readback_during_capture_raises_like_a_real_capture():
    x = torch.randn(4)
    with pytest.raises(GraphSafetyError, match="host"):
        _capture_segment(lambda t: t * t.max().item(), x)


def test_tensors_made_during_capture_belong_to_the_pool():
    x = torch.randn(3)
    seg, out = _capture_segment(lambda t: t + torch.tensor([1.0, 2.0, 3.0]) + torch.ones(3), x)
    gc.collect()
    x.copy_(torch.randn(3))
    seg.replay()  # the capture-made constants are held strongly, like pool memory
    torch.testing.assert_close(out, x + torch.tensor([2.0, 3.0, 4.0]))


@torch.library.custom_op("graphattn_test::scaled_sum", mutates_args=())
def scaled_sum(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A stand-in for a Triton kernel registered as a custom op: two outputs."""
    return x * scale, x.sum(-1)


@scaled_sum.register_fake
def _(x, scale):
    return torch.empty_like(x), x.new_empty(x.shape[:-1])


def test_custom_op_is_recorded_as_one_op_and_re_executed():
    x = torch.randn(4, 5)
    seg, (a, b) = _capture_segment(lambda t: scaled_sum(t, 1.5), x)
    assert [str(op.func) for op in seg.ops] == ["graphattn_test.scaled_sum.default"]
    x.copy_(torch.randn(4, 5))
    a.fill_(float("nan")), b.fill_(float("nan"))
    seg.replay()
    torch.testing.assert_close(a, x * 1.5)
    torch.testing.assert_close(b, x.sum(-1))
