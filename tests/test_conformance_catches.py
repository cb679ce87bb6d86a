"""The conformance suite's checks of the contract beyond the numbers, each shown to fail a
backend that breaks it (and to pass one that keeps it):

* an oversized step (more rows than the metadata reserved) between replays: README's
  counter-rebinding bug, and a backend wrong only on the oversized path;
* ``forward(out=...)`` and ``bind_break``, as README and ``graphattn bench`` wire a breakable
  graph: an out= pair left unwritten, written wrong, or not returned; a replay call that
  returns the capture's results, or one shared between two breaks;
* inputs left alone: kv (and the memory around a strided kv view) and q, bit for bit;
* outputs that are the call's own: a later call must not change an earlier call's outputs;
* strided q and kv views (the built-ins accept them), last dim stride 1 for backends that
  declare ``unit_stride_only``.

The broken backends are small subclasses of the ``torch`` backend (fast on the CPU); each
commits one bug and is otherwise right.
"""

from __future__ import annotations

import sys

import pytest
import torch

from graphattn.backends.torch_ref import TorchBackend
from graphattn.common import FreedCaptureBufferError
from graphattn.common.metadata import D_V
from graphattn.common.tolerances import tolerance
from graphattn.testing.checks import check_case
from graphattn.testing.specs import MODES, REAL, SMALL, BatchSpec


def _bump(out: torch.Tensor) -> torch.Tensor:
    """``out`` moved by a few tolerances: clearly wrong."""
    tol = tolerance(out.dtype)
    return out + (3.0 * (tol.atol + tol.rtol * out.float().abs())).to(out.dtype)


class _Base(TorchBackend):
    """The torch backend with out= honoured through :meth:`_give` (so a test backend's one bug
    is the only one)."""

    def _fwd(self, q, kv, metadata):
        return TorchBackend.forward(self, q, kv, metadata)

    @staticmethod
    def _give(o, lse, out):
        if out is None:
            return o, lse
        out[0].copy_(o)
        out[1].copy_(lse)
        return out


def expect_failure(cls, spec: str, mode: str, *phrases: str, exc=AssertionError, kv_dtype: str = "auto"):
    """Run the case; it must raise ``exc`` whose message (or notes) names the backend, the spec
    and the mode, and contains every phrase."""
    with pytest.raises(exc) as err:
        check_case(cls, SMALL.spec(spec), mode, SMALL, kv_dtype=kv_dtype)
    text = str(err.value) + "".join(getattr(err.value, "__notes__", []))
    if exc is AssertionError or sys.version_info >= (3, 11):
        assert f"backend '{cls.name}'" in text and f"[{spec}/{mode}" in text, text
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in:\n{text}"
    return text


# -- 1. a step past the reserved rows -------------------------------------------------------------
class RebindPastReserved(_Base):
    """README's counter-rebinding bug: an own counter sized for the reserved rows, replaced by a
    bigger one when an eager step needs more rows than were reserved."""

    name = "t_rebind_past_reserved"

    def make_metadata(self, max_rows):
        md = super().make_metadata(max_rows)
        self.counter = torch.zeros(max_rows, self.num_heads, dtype=torch.int32, device=self.device)
        return md

    def forward(self, q, kv, metadata, out=None):
        rows = q.shape[0]
        if rows > self.counter.shape[0]:
            self.counter = torch.zeros(rows, self.num_heads, dtype=torch.int32, device=q.device)
        c = self.counter[:rows]
        c.add_(1)
        o, lse = self._fwd(q, kv, metadata)
        lse = lse + c.float() - 1.0
        c.sub_(1)
        return self._give(o, lse, out)


class OversizedWrong(_Base):
    """Wrong only on an oversized step (metadata.oversized: more rows than reserved)."""

    name = "t_oversized_wrong"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        return self._give(_bump(o) if metadata.oversized else o, lse, out)


@pytest.mark.parametrize("shape", [SMALL, REAL], ids=lambda s: s.name)
def test_prefill_chunk_steps_past_the_reserved_rows_then_replays(shape):
    spec = shape.spec("prefill_chunk")
    top = max(shape.buckets)
    reserved = max(top, spec.reserved_rows)  # what graph modes reserve
    steps = spec.steps
    within = [i for i, r in enumerate(steps) if top < r <= reserved]
    past = [i for i, r in enumerate(steps) if r > reserved]
    assert within and past, f"{spec}: needs an eager step within the reserve and one past it"
    # Each is followed by a replay, where a freed captured buffer shows.
    assert all(i + 1 < len(steps) and steps[i + 1] <= top for i in within + past), spec


@pytest.mark.parametrize("shape", [SMALL, REAL], ids=lambda s: s.name)
def test_decode_is_strided_with_a_second_call(shape):
    decode = shape.spec("decode")
    assert decode.layout == "strided" and decode.second_call
    assert all(s.layout == "contiguous" for s in shape.specs if s.name != "decode")


def test_counter_rebound_past_the_reserved_rows_is_caught():
    err = expect_failure(RebindPastReserved, "prefill_chunk", "full", exc=FreedCaptureBufferError)
    assert "RebindPastReserved.counter" in err


def test_wrong_only_on_an_oversized_step_is_caught():
    for mode in ("full", "breakable"):
        expect_failure(OversizedWrong, "prefill_chunk", mode, "step 2 (6 rows)", "out differs")


def test_a_spec_reserve_below_one_or_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="reserve must be >= 1"):
        BatchSpec("x", num_heads=4, topk=8, steps=(1,), reserve=0)
    with pytest.raises(ValueError, match="layout must be one of"):
        BatchSpec("x", num_heads=4, topk=8, steps=(1,), layout="transposed")


# -- 2. forward(out=...) and bind_break ----------------------------------------------------------
class StaleOut(_Base):
    """forward(out=...) returns the given pair without writing it."""

    name = "t_stale_out"

    def forward(self, q, kv, metadata, out=None):
        if out is not None:
            self.check_call(q, kv, metadata)
            return out
        return self._fwd(q, kv, metadata)


class OutNotReturned(_Base):
    """Writes out= one row off and returns fresh, correct tensors (not the pair given)."""

    name = "t_out_not_returned"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        if out is not None:
            out[0].zero_()
            out[0][1:].copy_(o[:-1])
            out[1].copy_(lse)
        return o, lse


class OutOffByOne(_Base):
    """Writes out= one row off and returns it."""

    name = "t_out_off_by_one"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        if out is None:
            return o, lse
        out[0].zero_()
        out[0][1:].copy_(o[:-1])
        out[1].copy_(lse)
        return out


class StaleBind(_Base):
    """bind_break's replay call returns what the capture computed."""

    name = "t_stale_bind"

    def forward(self, q, kv, metadata, out=None):
        return self._give(*self._fwd(q, kv, metadata), out)

    def bind_break(self, args, kwargs):
        frozen = tuple(t.clone() for t in self.forward(*args, **kwargs))
        return lambda: frozen


class SharedBind(_Base):
    """bind_break keeps one replay call per backend, not per break: with two breaks (two
    layers), the first break's replays run the second break's call."""

    name = "t_shared_bind"

    def forward(self, q, kv, metadata, out=None):
        return self._give(*self._fwd(q, kv, metadata), out)

    def bind_break(self, args, kwargs):
        self._replay_args = (args, kwargs)
        return lambda: self.forward(*self._replay_args[0], **self._replay_args[1])


class NoOutParameter(TorchBackend):
    """A third-party backend written without out= (and right)."""

    name = "t_no_out"

    def forward(self, q, kv, metadata):
        return TorchBackend.forward(self, q, kv, metadata)


class OutRecorder(TorchBackend):
    """The torch backend, recording whether calls pass out= and which replay calls run."""

    name = "t_out_recorder"
    calls: list = []

    def forward(self, q, kv, metadata, out=None):
        type(self).calls.append("out" if out is not None else "plain")
        return super().forward(q, kv, metadata, out)

    def bind_break(self, args, kwargs):
        type(self).calls.append("bind" if "out" in kwargs else "bind without out")
        return super().bind_break(args, kwargs)


def test_out_not_written_is_caught():
    expect_failure(StaleOut, "one_row", "eager", "out= not written", "2048 of 2048 elements of the given out")
    expect_failure(StaleOut, "decode", "breakable", "out differs", "out='out', bind=backend.bind_break")


def test_out_not_returned_is_caught():
    expect_failure(OutNotReturned, "decode", "eager", "returned other tensors than the out= pair")


def test_out_written_wrong_is_caught():
    expect_failure(OutOffByOne, "decode", "eager", "out=", "out differs from the float64 reference")


def test_stale_replay_call_of_bind_break_is_caught():
    text = expect_failure(StaleBind, "decode", "breakable", "out differs", "bind_break's replay call")
    assert "breakable mode" in text
    check_case(StaleBind, SMALL.spec("decode"), "eager", SMALL)  # only replays use bind_break
    check_case(StaleBind, SMALL.spec("decode"), "full", SMALL)


def test_replay_call_shared_between_breaks_is_caught():
    # decode's breakable steps call attention twice (two breaks, like two layers, the second one
    # row): the first break's replay runs the second's call, whose result has another shape.
    expect_failure(SharedBind, "decode", "breakable", "must return the captured shape", exc=RuntimeError)
    check_case(SharedBind, SMALL.spec("decode"), "eager", SMALL)


def test_breakable_mode_is_wired_as_readme_and_bench_wire_it():
    OutRecorder.calls = []
    check_case(OutRecorder, SMALL.spec("decode"), "breakable", SMALL)
    calls = OutRecorder.calls
    # Captures call forward plainly; bind_break gets the out= pair; replays pass it (the
    # torch backend's bind_break returns None: forward runs on every replay).
    assert "bind" in calls and "bind without out" not in calls and "out" in calls, calls
    OutRecorder.calls = []
    check_case(OutRecorder, SMALL.spec("decode"), "eager", SMALL)
    assert "out" in OutRecorder.calls and "plain" in OutRecorder.calls, OutRecorder.calls


@pytest.mark.parametrize("mode", MODES)
def test_a_backend_without_out_still_runs_every_mode(mode):
    check_case(NoOutParameter, SMALL.spec("decode"), mode, SMALL)


# -- 3. inputs left alone ------------------------------------------------------------------------
class KVWipeUnselected(_Base):
    """Right output, then zeroes every kv token it did not select."""

    name = "t_kv_wipe"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        idx = metadata.indices_for(q.shape[0]).long()
        keep = torch.zeros(kv.shape[0] + 1, dtype=torch.bool, device=kv.device)
        keep.index_fill_(0, torch.where(idx < 0, kv.shape[0], idx).flatten(), True)
        kv.masked_fill_(~keep[:-1, None], 0)
        return self._give(o, lse, out)


class KVPaddingScribbler(_Base):
    """Right output, but writes the element just past each kv row of a strided view (the
    cache's row padding: the engine's memory)."""

    name = "t_kv_padding"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        if not kv.is_contiguous():
            past = kv.as_strided((kv.shape[0],), (kv.stride(0),), kv.storage_offset() + kv.shape[1] * kv.stride(1))
            past.zero_()
        return self._give(o, lse, out)


class QScribbler(_Base):
    """Right output, then zeroes q's last feature column."""

    name = "t_q_scribble"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        q[..., -1].zero_()
        return self._give(o, lse, out)


@pytest.mark.parametrize("mode", MODES)
def test_kv_modified_is_caught(mode):
    expect_failure(KVWipeUnselected, "one_row", mode, "kv modified at token")


def test_kv_modified_is_caught_in_fp8_tokens():
    expect_failure(KVWipeUnselected, "decode", "eager", "kv modified at token", kv_dtype="fp8")


def test_memory_around_a_strided_kv_view_modified_is_caught():
    expect_failure(KVPaddingScribbler, "decode", "eager", "memory around the kv view modified at token 0")
    check_case(KVPaddingScribbler, SMALL.spec("one_row"), "eager", SMALL)  # contiguous: nothing past


@pytest.mark.parametrize("mode", MODES)
def test_q_modified_is_caught(mode):
    expect_failure(QScribbler, "decode", mode, "q modified at row 0")


class QNaNPayload(_Base):
    """Right output, then rewrites q's NaN with another NaN payload (bf16 0x7FFF), as torch's
    CUDA copies do to a step's q on its way into a graph runner's static input."""

    name = "t_q_nan_payload"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        q.view(torch.int16).masked_fill_(q.isnan(), 0x7FFF)  # a NaN in bf16 and fp16 alike
        return self._give(o, lse, out)


class QNaNOverNumbers(_Base):
    """Right output, then writes NaN into q's last feature column (numbers before)."""

    name = "t_q_nan_over_numbers"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        q[..., -1] = float("nan")
        return self._give(o, lse, out)


@pytest.mark.parametrize("mode", MODES)
def test_q_nan_payload_changed_passes_nan_over_numbers_is_caught(mode):
    # Any NaN equals any NaN (the GPU runner's copy rewrites bf16 NaN 0x7FC0 as 0x7FFF), but a
    # NaN where q held a number is a change.
    check_case(QNaNPayload, SMALL.spec("nan_q"), mode, SMALL)
    expect_failure(QNaNOverNumbers, "nan_q", mode, "q modified at row 0")


# -- 4. outputs that are the call's own ----------------------------------------------------------
class ReusedOut(_Base):
    """Returns views of one persistent buffer: a later call overwrites an earlier one's result."""

    name = "t_reused_out"

    def forward(self, q, kv, metadata, out=None):
        o, lse = self._fwd(q, kv, metadata)
        rows = q.shape[0]
        if getattr(self, "_o", None) is None or self._o.shape[0] < rows:
            self._o = torch.empty(max(rows, 64), self.num_heads, D_V, dtype=q.dtype, device=q.device)
            self._l = torch.empty(max(rows, 64), self.num_heads, dtype=torch.float32, device=q.device)
        self._o[:rows].copy_(o)
        self._l[:rows].copy_(lse)
        return self._give(self._o[:rows], self._l[:rows], out)


class ReusedOutNoOutParameter(ReusedOut):
    name = "t_reused_out_no_out"

    def forward(self, q, kv, metadata):
        return ReusedOut.forward(self, q, kv, metadata)


def test_outputs_reused_across_calls_are_caught():
    expect_failure(ReusedOut, "decode", "eager", "step 0: the out that step's forward returned changed when "
                   "step 1's forward(out=...) ran")
    expect_failure(ReusedOutNoOutParameter, "ragged", "eager", "changed when step 1's forward ran")
    expect_failure(ReusedOut, "decode", "breakable", "out differs", "the first break's outputs must not change")


# -- 5. strided q and kv -------------------------------------------------------------------------
class StrideIgnorer(_Base):
    """Reads q and kv as if they were dense (a kernel that computes its own offsets)."""

    name = "t_strides"

    def forward(self, q, kv, metadata, out=None):
        def dense(t):
            strides, acc = [], 1
            for n in reversed(t.shape):
                strides.insert(0, acc)
                acc *= n
            return t.as_strided(t.shape, strides)

        return self._give(*self._fwd(dense(q), dense(kv), metadata), out)


class StrideRecorder(TorchBackend):
    """The torch backend, recording the strides it is given."""

    name = "t_stride_recorder"
    seen: list = []

    def forward(self, q, kv, metadata, out=None):
        type(self).seen.append((q.stride(), q.is_contiguous(), kv.stride(), kv.is_contiguous()))
        return super().forward(q, kv, metadata, out)


class UnitStrideRecorder(StrideRecorder):
    name = "t_unit_stride_recorder"
    unit_stride_only = True  # check_call refuses a last dim of stride != 1


@pytest.mark.parametrize("mode", MODES)
def test_strided_views_read_as_dense_are_caught(mode):
    expect_failure(StrideIgnorer, "decode", mode, "out differs", "layout 'strided'")


@pytest.mark.parametrize("cls, last", [(StrideRecorder, 2), (UnitStrideRecorder, 1)], ids=["any", "unit"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_strided_spec_passes_views_respecting_unit_stride_only(cls, last, kv_dtype):
    cls.seen = []
    check_case(cls, SMALL.spec("decode"), "eager", SMALL, kv_dtype=kv_dtype)
    assert cls.seen
    for q_stride, q_contig, kv_stride, kv_contig in cls.seen:
        assert not q_contig and not kv_contig
        assert q_stride[-1] == last and kv_stride[-1] == (1 if kv_dtype == "fp8" else last)


# -- a correct backend passes every new check -----------------------------------------------------
@pytest.mark.parametrize("spec", ["decode", "prefill_chunk"])
@pytest.mark.parametrize("mode", MODES)
def test_torch_backend_passes(spec, mode):
    check_case(TorchBackend, SMALL.spec(spec), mode, SMALL)
