"""GraphMetadata: the q-pad rule, the counter rule, and in-place refresh for replays."""

import pytest
import torch

from graphattn.common import (
    CaptureCapacityError,
    CapturedBufferGrowthError,
    GraphMetadata,
    capture_scope,
)

HEADS, PADDED, TOPK = 20, 64, 12
BUCKETS = [32, 24, 16, 8, 4, 2, 1]  # captured largest first, as a runner does


def make(max_rows=32, **kw):
    kw.setdefault("padded_heads", PADDED)
    kw.setdefault("counter_cols", 2)
    kw.setdefault("num_splits", 3)
    return GraphMetadata(max_rows, HEADS, TOPK, torch.float16, "cpu", **kw)


def rand_q(rows):
    return torch.randn(rows, HEADS, 576).half()


def test_q_pad_slices_for_every_bucket_share_one_storage():
    m = make(max(BUCKETS))
    ptrs = set()
    for rows in BUCKETS:
        padded = m.zero_padded_q(rand_q(rows))
        assert padded.shape == (rows, PADDED, 576)
        ptrs.add(padded.data_ptr())
        ptrs.add(padded.untyped_storage().data_ptr())
    assert ptrs == {m.q_pad.data_ptr()}, "q-pad slices must share the reserved storage"


def test_q_pad_padding_stays_zero_and_real_heads_are_copied():
    m = make(32)
    for _ in range(50):
        rows = int(torch.randint(1, 33, ()))
        q = rand_q(rows)
        padded = m.zero_padded_q(q)
        assert torch.equal(padded[:, :HEADS], q)
    assert torch.all(m.q_pad.tensor[:, HEADS:] == 0), "padding heads were written"


def test_q_pad_grows_before_capture():
    m = make(4)
    padded = m.zero_padded_q(rand_q(16))
    assert padded.shape[0] == 16 and m.q_pad.capacity >= 16
    assert torch.all(m.q_pad.tensor[:, HEADS:] == 0)


def test_q_pad_growth_after_mark_raises_and_keeps_captured_storage():
    m = make(32)
    m.zero_padded_q(rand_q(32))
    storage, ptr = m.q_pad.tensor, m.q_pad.data_ptr()
    snapshot = storage.clone()
    m.mark_captured()
    assert m.q_pad_captured and m.captured
    with pytest.raises(CapturedBufferGrowthError, match="'q_pad'.*capacity 32.*33 rows"):
        m.zero_padded_q(rand_q(33))
    with pytest.raises(CapturedBufferGrowthError):
        m.reserve(64)
    assert m.q_pad.tensor is storage and m.q_pad.data_ptr() == ptr
    assert torch.equal(storage, snapshot), "the refused call modified the captured q-pad buffer"


def test_reserve_grows_every_buffer_or_none():
    """One captured buffer refuses the metadata's growth before any other buffer grows (the
    counter used to grow, then the captured index table raised)."""
    m = make(8)
    m.indices.view(8)
    m.indices.mark_captured()  # one buffer a graph holds; the others free
    before = {b.name: (b.capacity, b.data_ptr()) for b in m.buffers()}
    with pytest.raises(CapturedBufferGrowthError, match="indices"):
        m.reserve(16)
    assert {b.name: (b.capacity, b.data_ptr()) for b in m.buffers()} == before
    free = make(8)
    free.reserve(16)
    assert free.capacity == 16 and all(b.capacity >= 16 for b in free._row_buffers())


def test_counter_overflow_after_mark_gives_eager_a_temporary():
    m = make(8)
    captured = m.counter_for(8)
    ptr = captured.data_ptr()
    m.mark_captured()
    tmp = m.counter_for(20)
    assert tmp.dtype == torch.int32 and tmp.shape == (20, 2) and torch.all(tmp == 0)
    assert tmp.data_ptr() != ptr and m.counter.data_ptr() == ptr and m.counter.capacity == 8
    assert m.counter_for(8).data_ptr() == ptr


def test_workspace_pool_serves_every_row_count_from_one_storage():
    # A pool of 24 partials (8 rows x 3 splits): fewer splits per row as rows grow, never more
    # storage; past 24 rows no split fits (0), and the kernels then write out directly.
    m = make(8)
    pool_ptr = m.workspace_out.data_ptr()
    m.mark_captured()
    with capture_scope():
        for rows, splits in [(1, 3), (8, 3), (9, 2), (12, 2), (13, 1), (24, 1), (25, 0), (100, 0)]:
            ws_out, ws_lse = m.workspace_for(rows)
            assert m.workspace_splits(rows) == splits
            assert ws_out.shape == (rows, splits, PADDED, 512) and ws_lse.shape == (rows, splits, PADDED)
            assert ws_out.untyped_storage().data_ptr() == pool_ptr
            assert ws_lse.untyped_storage().data_ptr() == m.workspace_lse.data_ptr()
    assert m.workspace_out.capacity == 24 and m.workspace_out.data_ptr() == pool_ptr


def test_workspace_pool_does_not_grow_with_reserved_rows():
    small = make(8, workspace_partials=40)
    big = make(4096, workspace_partials=40)
    assert small.workspace_out.nbytes() == big.workspace_out.nbytes() == 40 * PADDED * 512 * 4
    assert big.workspace_splits(1) == 3 and big.workspace_splits(20) == 2 and big.capacity == 4096


def test_counter_overflow_during_capture_raises():
    m = make(8)
    m.mark_captured()
    ptr = m.counter.data_ptr()
    with capture_scope():
        with pytest.raises(CaptureCapacityError, match="'multi_cta_counter'.*capacity 8.*9 rows"):
            m.counter_for(9)
    assert m.counter.data_ptr() == ptr


def test_counter_is_zeroed_once():
    m = make(8)
    m.counter_for(8).fill_(3)  # a kernel that forgot to reset would leave this
    assert torch.all(m.counter_for(8) == 3), "counter_for must not re-zero the captured counter"


def test_refresh_is_in_place_and_keeps_the_mark():
    m = make(16)
    m.zero_padded_q(rand_q(16))
    m.mark_captured()
    ptrs = {b.name: b.data_ptr() for b in m.buffers()}
    objs = {b.name: b.tensor for b in m.buffers()}
    q_pad = m.q_pad
    for rows, bucket in [(3, 4), (16, 16), (1, 8), (7, 8)]:
        idx = torch.randint(0, 100, (rows, TOPK), dtype=torch.int32)
        m.refresh_(idx, pad_to=bucket)
        table = m.indices_for(bucket)
        assert torch.equal(table[:rows], idx)
        assert torch.all(table[rows:] == -1), "padding rows must be inert (-1)"
        assert m.num_rows == rows
    assert {b.name: b.data_ptr() for b in m.buffers()} == ptrs
    assert all(objs[b.name] is b.tensor for b in m.buffers())
    assert m.q_pad is q_pad and m.q_pad_captured and m.captured
    with pytest.raises(CapturedBufferGrowthError, match="'indices'"):
        m.indices.reserve(17)
    m.refresh_(torch.zeros(17, TOPK, dtype=torch.int32))  # oversized: a temporary table
    assert m.oversized and {b.name: b.data_ptr() for b in m.buffers()} == ptrs


def test_sized_in_rows_not_requests():
    # A prefill chunk of 40 tokens is 40 rows even if it is one request.
    m = make(40)
    assert m.capacity == 40
    assert m.zero_padded_q(rand_q(40)).shape[0] == 40


def test_bad_inputs_are_clear():
    m = make(8)
    with pytest.raises(ValueError, match=r"expected q \[rows, 20, 576\]"):
        m.zero_padded_q(torch.randn(2, 19, 576).half())
    with pytest.raises(ValueError, match="float16"):
        m.zero_padded_q(torch.randn(2, HEADS, 576))
    with pytest.raises(ValueError, match="expected indices"):
        m.refresh_(torch.zeros(2, TOPK + 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="padded_heads"):
        GraphMetadata(4, 20, 8, torch.float16, "cpu", padded_heads=16)
    bare = GraphMetadata(4, 20, 8, torch.float16, "cpu")
    for call in (lambda: bare.zero_padded_q(rand_q(1)), lambda: bare.counter_for(1),
                 lambda: bare.workspace_for(1)):
        with pytest.raises(RuntimeError, match="this metadata has no"):
            call()


def test_q_pad_and_counter_temporaries_follow_the_oversized_plan():
    md = GraphMetadata(2, 4, 8, torch.float16, "cpu", padded_heads=16, counter_cols=2)
    md.mark_captured()
    ptrs = {b.name: b.data_ptr() for b in md.buffers()}
    md.refresh_(torch.zeros(5, 8, dtype=torch.int32))
    assert md.oversized and md.indices_for(5).shape == (5, 8)
    q = torch.randn(5, 4, 576).to(torch.float16)
    padded = md.zero_padded_q(q)
    assert padded.shape == (5, 16, 576) and torch.equal(padded[:, :4], q)
    assert torch.count_nonzero(padded[:, 4:]) == 0, "temporary q-pad padding heads must be zero"
    counter = md.counter_for(5)
    assert counter.shape == (5, 2) and int(counter.abs().sum()) == 0
    assert {b.name: b.data_ptr() for b in md.buffers()} == ptrs
    assert padded.data_ptr() != ptrs["q_pad"] and counter.data_ptr() != ptrs["multi_cta_counter"]
    md.refresh_(torch.zeros(2, 8, dtype=torch.int32))
    assert not md.oversized and md.indices_for(2).data_ptr() == ptrs["indices"]
