"""Backends: capabilities, metadata layout, the q-pad and counter rules, input checks.

Numerical conformance of every backend lives in test_conformance.py (the shared suite).
"""

from __future__ import annotations

import functools

import pytest
import torch

from graphattn.backends import GraphSupport, builtin_backends, get_backend_class
from graphattn.common import CapturedBufferGrowthError, GraphMetadata, current_platform, sparse_mla_reference
from graphattn.graphs import GraphRunner

DTYPE = torch.float16  # the Triton interpreter's dtype on the CPU
DEVICE = current_platform().device  # the backends run there: cpu, or the GPU when there is one
HEADS, TOPK, POOL = 8, 24, 64


def make(name: str, heads: int = HEADS, topk: int = TOPK):
    return get_backend_class(name)(heads, topk, DTYPE)


def inputs(rows: int, heads: int = HEADS, topk: int = TOPK):
    q = torch.randn(rows, heads, 576).to(DTYPE)
    idx = torch.stack([torch.randperm(POOL)[:topk] for _ in range(rows)]).to(torch.int32)
    return q.to(DEVICE), idx.to(DEVICE)


@functools.lru_cache(maxsize=None)
def kv_pool() -> torch.Tensor:
    """One ``[POOL, 576]`` KV pool shared by the tests (fixed seed: independent of test order)."""
    return torch.randn(POOL, 576, generator=torch.Generator().manual_seed(0)).to(DEVICE, DTYPE)


@pytest.mark.parametrize("name", builtin_backends())
def test_capabilities_are_class_data(name):
    cls = get_backend_class(name)
    caps = cls.capabilities()
    assert caps["graph_support"] == GraphSupport.FULL.name
    assert set(caps) >= {"dtypes", "heads", "pads_q", "uses_counter", "uses_workspace", "platforms"}
    assert cls.refusal_reasons(16, torch.bfloat16, 2048) == []
    assert cls.refusal_reasons(16, torch.int32, 2048) == [
        f"dtype int32 not in supported {[str(d).replace('torch.', '') for d in cls.supported_dtypes]}"
    ]


def test_refused_configuration_raises_with_reasons():
    with pytest.raises(ValueError, match=r"attention backend 'flashmla' refuses .*num_heads=0"):
        get_backend_class("flashmla")(0, 64, torch.float16)


def test_metadata_layout_follows_capabilities():
    md = make("flashmla").make_metadata(5)
    assert md.q_pad is None and md.counter is None, "flashmla: q is read unpadded, no counter"
    assert md.workspace_out.tensor.shape[1:] == (HEADS, 512), "flashmla: workspace partials of the real heads"
    md = make("trtllm").make_metadata(5)
    assert md.q_pad is None and md.counter.tensor.dtype == torch.int32 and md.workspace_out is not None
    for name in ("flashmla_mega", "torch"):
        md = make(name).make_metadata(5)
        assert (md.q_pad, md.counter, md.workspace_out) == (None, None, None)
        assert md.indices.tensor.shape == (5, TOPK)


@pytest.mark.parametrize("heads", [1, 4, 16])
def test_flashmla_reads_q_unpadded_and_writes_outputs_whole(heads):
    """No q-pad copy, no narrowed views: the kernel takes q [rows, H, 576] and writes contiguous
    [rows, H] outputs, into given ones directly."""
    backend = make("flashmla", heads=heads, topk=8)
    assert backend.padded_heads is None and not backend.pads_q, "flashmla: pads q"
    md = backend.make_metadata(2)
    q, idx = inputs(2, heads=heads, topk=8)
    backend.plan(md, idx)
    out, lse = backend.forward(q, kv_pool(), md)
    assert out.shape == (2, heads, 512) and lse.shape == (2, heads), f"flashmla: {out.shape} {lse.shape}"
    assert out.is_contiguous() and lse.is_contiguous(), "flashmla: outputs are views of padded ones"
    given = (torch.full_like(out, float("nan")), torch.full_like(lse, float("nan")))
    res = backend.forward(q, kv_pool(), md, out=given)
    assert res[0] is given[0] and res[1] is given[1], "flashmla: did not return the given outputs"
    ref_out, ref_lse = sparse_mla_reference(q, kv_pool(), idx, backend.sm_scale)
    for o, lse_ in ((out, lse), given):
        torch.testing.assert_close(o.double(), ref_out, atol=4e-3, rtol=4e-3, msg=lambda m: f"flashmla out: {m}")
        torch.testing.assert_close(lse_.double(), ref_lse, atol=1e-3, rtol=1e-4, msg=lambda m: f"flashmla lse: {m}")


def _capture(backend, md, rows: int) -> GraphRunner:
    kv = kv_pool()
    static = torch.zeros(rows, backend.num_heads, 576, dtype=DTYPE, device=DEVICE)
    runner = GraphRunner(lambda q: backend.forward(q, kv, md), {"q": static}, metadata=md, buckets=[rows])
    backend.plan(md, inputs(rows)[1], pad_to=rows)
    runner.capture()
    return runner


def test_oversized_eager_call_after_capture_follows_each_rule():
    # After capture, a step beyond the reserved rows runs on temporaries (tests/test_oversized.py
    # checks the numbers); the buffers themselves keep their rules: the counter is TEMPORARY,
    # a q-pad buffer (no built-in backend pads q any more: GraphMetadata(padded_heads=...)) is
    # RAISE when asked directly, and neither is ever replaced.
    trt = make("trtllm")
    md = trt.make_metadata(2)
    runner = _capture(trt, md, 2)
    counter_ptr = md.counter.data_ptr()
    q, idx = inputs(3)
    trt.plan(md, idx)  # oversized: a temporary index table
    assert md.oversized and md.num_planned_rows == 3
    assert md.counter.data_ptr() == counter_ptr
    md = GraphMetadata(2, HEADS, TOPK, DTYPE, DEVICE, padded_heads=16)
    md.zero_padded_q(inputs(2)[0])
    md.mark_captured()
    with pytest.raises(CapturedBufferGrowthError, match="'q_pad'"):
        md.zero_padded_q(q)  # no oversized step planned: the q-pad rule refuses the growth
    with pytest.raises(CapturedBufferGrowthError, match="'q_pad'"):
        md.q_pad.reserve(3)
    with pytest.raises(ValueError, match="planned step has 3 rows"):
        runner.run(q=inputs(2)[0])  # the trtllm runner's planned step is the oversized one
    trt.plan(runner.metadata, inputs(2)[1])
    assert runner.run(q=inputs(2)[0])[0].shape == (2, HEADS, 512)


def test_counter_temporary_when_eager_rows_exceed_capture():
    # An eager call through the counter path on more rows than captured: the captured counter
    # stays, the call gets a fresh zeroed one (the counter rule).
    trt = make("trtllm")
    md = trt.make_metadata(2)
    md.mark_captured()
    ptr = md.counter.data_ptr()
    tmp = md.counter_for(4)
    assert tmp.shape[0] == 4 and tmp.data_ptr() != ptr and int(tmp.abs().sum()) == 0
    assert md.counter.data_ptr() == ptr


@pytest.mark.parametrize("name", builtin_backends())
def test_input_checks(name):
    backend = make(name)
    md = backend.make_metadata(2)
    q, idx = inputs(2)
    with pytest.raises(ValueError, match="int32"):
        backend.plan(md, idx.long())
    with pytest.raises(ValueError, match=r"expected q \[rows, 8, 576\]"):
        backend.forward(q[:, :4], kv_pool(), md)
    with pytest.raises(ValueError, match=r"expected kv \[pool, 576\]"):
        backend.forward(q, kv_pool().float(), md)


@pytest.mark.parametrize("name", ["flashmla", "trtllm", "flashmla_mega"])
def test_triton_backends_refuse_foreign_metadata(name):
    backend = make(name)
    other = make(name, heads=4).make_metadata(2)
    with pytest.raises(ValueError, match="metadata was made for"):
        backend.forward(inputs(2)[0], kv_pool(), other)
