"""GrowOnlyBuffer: grow before capture, slice never copy, pin on capture, declared overflow."""

import pytest
import torch

from graphattn.common import (
    CaptureCapacityError,
    CapturedBufferGrowthError,
    GrowOnlyBuffer,
    capture_scope,
)


def make(policy="raise", rows=8, fill=0):
    return GrowOnlyBuffer("buf", (3, 5), torch.float32, "cpu", policy, rows, fill)


def test_view_is_a_slice_of_one_storage():
    b = make(rows=8)
    views = [b.view(r) for r in (8, 5, 1, 3)]
    assert {v.data_ptr() for v in views} == {b.data_ptr()}
    assert all(v.untyped_storage().data_ptr() == b.tensor.untyped_storage().data_ptr() for v in views)
    assert [v.shape[0] for v in views] == [8, 5, 1, 3]
    views[1].fill_(7.0)
    assert torch.all(b.tensor[:5] == 7.0), "view(rows) must alias the buffer, not copy it"


def test_fill_happens_once_at_allocation():
    b = make(rows=4, fill=-1)
    assert torch.all(b.tensor == -1)
    b.view(4).fill_(3.0)
    b.view(2)
    assert torch.all(b.tensor == 3.0), "taking a view must not re-fill the buffer"


def test_growth_before_capture_allocates_filled_storage():
    b = make(rows=2, fill=0)
    b.view(2).fill_(9.0)
    b.reserve(16)
    assert b.capacity == 16 and torch.all(b.tensor == 0)
    old = b.data_ptr()
    b.reserve(4)  # smaller: no-op
    assert b.data_ptr() == old and b.capacity == 16
    assert b.view(20).shape[0] == 20, "an eager view before capture grows on demand"


def test_marked_buffer_never_moves_and_raise_policy_refuses_growth():
    b = make("raise", rows=8)
    ptr, storage = b.data_ptr(), b.tensor
    b.mark_captured()
    b.view(8).uniform_()
    before = b.tensor.clone()
    with pytest.raises(CapturedBufferGrowthError, match=r"'buf'.*capacity 8.*9 rows"):
        b.view(9)
    with pytest.raises(CapturedBufferGrowthError):
        b.reserve(100)
    assert b.data_ptr() == ptr and b.tensor is storage, "captured storage was replaced"
    assert torch.equal(b.tensor, before), "captured storage was modified by a refused growth"


def test_temporary_policy_gives_eager_overflow_a_fresh_buffer():
    b = make("temporary", rows=4, fill=0)
    ptr = b.data_ptr()
    b.mark_captured()
    b.view(4).fill_(5.0)  # e.g. a kernel left state in the captured rows
    tmp = b.view(10)
    assert tmp.shape == (10, 3, 5) and torch.all(tmp == 0)
    assert tmp.data_ptr() != ptr and b.data_ptr() == ptr and b.capacity == 4
    assert torch.all(b.tensor == 5.0), "the temporary must not touch the captured storage"


@pytest.mark.parametrize("policy", ["raise", "temporary"])
def test_overflow_during_capture_is_a_capacity_error(policy):
    b = make(policy, rows=4)
    ptr = b.data_ptr()
    with capture_scope():
        with pytest.raises(CaptureCapacityError, match=r"'buf'.*capacity 4.*6 rows"):
            b.view(6)
        with pytest.raises(CaptureCapacityError):
            b.reserve(6)
    assert b.data_ptr() == ptr


def test_view_during_capture_marks_the_buffer():
    b = make(rows=4)
    assert not b.captured
    with capture_scope():
        b.view(2)
    assert b.captured
    with pytest.raises(CapturedBufferGrowthError):
        b.reserve(5)


def test_bad_rows_are_value_errors():
    b = make()
    with pytest.raises(ValueError, match="rows must be >= 0"):
        b.view(-1)
    with pytest.raises(ValueError):
        GrowOnlyBuffer("x", (2,), torch.float32, "cpu", policy="sometimes")
