"""The bad-input matrix: every public entry point x backend x mode, fed what users will pass.

Each case asserts the exception type and that the message names the argument (and, where
there is one, the fix); a case that is accepted silently or fails inside torch fails here.
The graph, registry and environment side is in test_bad_inputs_graphs.py. Results of inputs
that must be accepted (NaN data, -1 indices) are compared with the float64 reference in
test_conformance.py and test_reference.py; here only errors, and the shapes of zero rows.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from graphattn.backends import builtin_backends, get_backend_class
from graphattn.common import CapturedBufferGrowthError, current_platform
from graphattn.common import validation
from graphattn.graphs import GraphRunner

DTYPE = torch.float16  # the Triton interpreter's dtype on the CPU
DEVICE = current_platform().device
HEADS, TOPK, POOL, ROWS = 8, 16, 64, 3
BACKENDS = builtin_backends()


def expect(exc: type[BaseException], *words: str, who: str = ""):
    """``pytest.raises(exc)`` whose message must contain every word (regex-escaped)."""
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(w)})" for w in words)
    if who:
        return _Labelled(exc, pattern, who)
    return pytest.raises(exc, match=pattern or None)


class _Labelled:
    """``pytest.raises`` that names the backend when nothing (or something else) is raised."""

    def __init__(self, exc, pattern, who):
        self.exc, self.pattern, self.who = exc, pattern, who

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        assert typ is not None, f"backend '{self.who}': expected {self.exc.__name__}, nothing raised"
        assert issubclass(typ, self.exc), (
            f"backend '{self.who}': expected {self.exc.__name__}, got {typ.__name__}: {value}")
        assert re.search(self.pattern, str(value)), (
            f"backend '{self.who}': the {typ.__name__} message does not name the argument "
            f"({self.pattern}): {value}")
        return True


def make(name: str, **kw):
    return get_backend_class(name)(HEADS, TOPK, DTYPE, **kw)


def q_rows(rows: int, heads: int = HEADS, dtype=DTYPE) -> torch.Tensor:
    return torch.randn(rows, heads, 576).to(dtype).to(DEVICE)


def indices(rows: int, topk: int = TOPK) -> torch.Tensor:
    idx = torch.argsort(torch.rand(rows, POOL), dim=1)[:, :topk]  # distinct per row
    return idx.to(torch.int32).to(DEVICE)


def kv_pool(tokens: int = POOL, width: int = 576) -> torch.Tensor:
    return torch.randn(tokens, width).to(DTYPE).to(DEVICE)


def planned(name: str, rows: int = ROWS):
    backend = make(name)
    md = backend.make_metadata(8)
    backend.plan(md, indices(rows))
    return backend, md


# -- constructors and make_metadata ---------------------------------------------------------
CONSTRUCTOR_CASES = [
    (dict(num_heads=0), ValueError, "num_heads"),
    (dict(num_heads=2.5), TypeError, "num_heads"),
    (dict(num_heads="16"), TypeError, "num_heads"),
    (dict(topk=0), ValueError, "topk"),
    (dict(topk=True), TypeError, "topk"),
    (dict(dtype="bfloat16"), TypeError, "dtype"),
    (dict(dtype=torch.int8), ValueError, "dtype"),
    (dict(sm_scale=float("nan")), ValueError, "sm_scale"),
    (dict(sm_scale=math.inf), ValueError, "sm_scale"),
    (dict(sm_scale=0.0), ValueError, "sm_scale"),
    (dict(sm_scale=-0.1), ValueError, "sm_scale"),
    (dict(sm_scale="0.1"), TypeError, "sm_scale"),
    (dict(kv_dtype="fp4"), ValueError, "kv_dtype"),
    (dict(platform="cpu"), TypeError, "platform"),
]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("kwargs,exc,word", CONSTRUCTOR_CASES, ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_constructor(name, kwargs, exc, word):
    args = dict(num_heads=HEADS, topk=TOPK, dtype=DTYPE) | kwargs
    with expect(exc, word, who=name):
        get_backend_class(name)(**args)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("max_rows,exc", [(0, ValueError), (-4, ValueError), (2.0, TypeError), (True, TypeError)])
def test_make_metadata(name, max_rows, exc):
    with expect(exc, "max_rows", who=name):
        make(name).make_metadata(max_rows)


# -- plan -----------------------------------------------------------------------------------
def _other_topk_metadata(name):
    return get_backend_class(name)(HEADS, TOPK * 2, DTYPE).make_metadata(4)


PLAN_CASES = {
    "int64 indices": (lambda b, md: b.plan(md, indices(2).long()), ValueError, ["indices", "int32"]),
    "list indices": (lambda b, md: b.plan(md, [[0] * TOPK]), TypeError, ["indices"]),
    "1-D indices": (lambda b, md: b.plan(md, indices(1)[0]), ValueError, ["indices", f"topk={TOPK}"]),
    "wrong topk": (lambda b, md: b.plan(md, indices(2, TOPK - 1)), ValueError, ["indices", f"topk={TOPK}"]),
    "meta indices": (lambda b, md: b.plan(md, torch.zeros(2, TOPK, dtype=torch.int32, device="meta")),
                     ValueError, ["indices", "meta"]),
    "pad_to < rows": (lambda b, md: b.plan(md, indices(3), pad_to=2), ValueError, ["pad_to", ">= 3"]),
    "negative pad_to": (lambda b, md: b.plan(md, indices(0), pad_to=-1), ValueError, ["pad_to"]),
    "float pad_to": (lambda b, md: b.plan(md, indices(2), pad_to=4.0), TypeError, ["pad_to"]),
    "metadata None": (lambda b, md: b.plan(None, indices(2)), TypeError, ["metadata", "make_metadata"]),
    "other top-k": (lambda b, md: b.plan(_other_topk_metadata(b.name), indices(2, TOPK * 2)),
                    ValueError, ["metadata", "make_metadata"]),
    "index < -1": (lambda b, md: b.plan(md, _with(indices(3), 1, 4, -7), check_indices=True),
                   IndexError, ["row 1", "-7"]),
    "index >= pool": (lambda b, md: b.plan(md, _with(indices(3), 2, 0, POOL), check_indices=True, pool_tokens=POOL),
                      IndexError, ["row 2", str(POOL)]),
    "pool_tokens 0": (lambda b, md: b.plan(md, indices(1), check_indices=True, pool_tokens=0),
                      ValueError, ["pool_tokens"]),
}


def _with(idx: torch.Tensor, row: int, col: int, value: int) -> torch.Tensor:
    idx[row, col] = value
    return idx


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_plan(name, case):
    call, exc, words = PLAN_CASES[case]
    backend = make(name)
    md = backend.make_metadata(4)
    with expect(exc, *words, who=name):
        call(backend, md)


@pytest.mark.parametrize("name", BACKENDS)
def test_check_indices_deferred_to_forward_and_minus_one_allowed(name):
    backend, md = make(name), None
    md = backend.make_metadata(4)
    ok = _with(indices(2), 0, 3, -1)
    backend.plan(md, ok, check_indices=True, pool_tokens=POOL)  # -1 is allowed
    backend.plan(md, _with(indices(2), 1, 5, POOL + 3), check_indices=True)  # the pool is not known yet
    with expect(IndexError, "row 1", str(POOL + 3), "fix", who=name):
        backend.forward(q_rows(2), kv_pool(), md)


@pytest.mark.parametrize("name", BACKENDS)
def test_check_indices_switch_read_at_import(name, monkeypatch):
    backend = make(name)
    md = backend.make_metadata(4)
    bad = _with(indices(2), 0, 0, -5)
    monkeypatch.setenv(validation.CHECK_INDICES_ENV, "1")
    monkeypatch.setattr(validation, "_CHECK_INDICES", validation._read_check_indices())
    with expect(IndexError, "row 0", "-5", who=name):
        backend.plan(md, bad)
    backend.plan(md, bad, check_indices=False)  # an explicit False wins
    monkeypatch.setenv(validation.CHECK_INDICES_ENV, "maybe")
    monkeypatch.setattr(validation, "_CHECK_INDICES", validation._read_check_indices())
    with expect(ValueError, validation.CHECK_INDICES_ENV, "maybe", who=name):
        backend.plan(md, indices(2))


def test_captured_metadata_cannot_grow():
    backend = make("torch")
    md = backend.make_metadata(2)
    runner = GraphRunner(lambda q: backend.forward(q, kv_pool(), md), {"q": q_rows(2)}, metadata=md, buckets=[2])
    runner.capture()
    backend.plan(md, indices(3))  # an oversized eager step: temporaries, captured storage kept
    assert md.oversized
    with expect(CapturedBufferGrowthError, "indices", "make_metadata"):
        md.reserve(3)


# -- forward (eager), out= ------------------------------------------------------------------
def _q_noncontiguous():
    return q_rows(ROWS).transpose(1, 2).contiguous().transpose(1, 2)[..., :576]  # last-dim stride != 1


FORWARD_CASES = {
    "q float32": (lambda: (q_rows(ROWS, dtype=torch.float32), kv_pool()), ValueError, ["q", "float16"]),
    "q int8": (lambda: (q_rows(ROWS).to(torch.int8), kv_pool()), ValueError, ["q", "int8"]),
    "q one head": (lambda: (q_rows(ROWS, heads=1), kv_pool()), ValueError, ["q", f"{HEADS}, 576"]),
    "q 2-D": (lambda: (q_rows(ROWS)[:, 0], kv_pool()), ValueError, ["q", f"{HEADS}, 576"]),
    "q head dim 512": (lambda: (q_rows(ROWS)[..., :512].contiguous(), kv_pool()), ValueError, ["q", "576"]),
    "q a list": (lambda: ([[0.0]], kv_pool()), TypeError, ["q", "tensor"]),
    "kv width 512": (lambda: (q_rows(ROWS), kv_pool(width=512)), ValueError, ["kv", "576"]),
    "kv float32": (lambda: (q_rows(ROWS), kv_pool().float()), ValueError, ["kv", "float32"]),
    "kv empty pool": (lambda: (q_rows(ROWS), kv_pool(tokens=0)), ValueError, ["kv", "empty pool"]),
    "q on meta": (lambda: (q_rows(ROWS).to("meta"), kv_pool()), ValueError, ["q", "meta"]),
    "q and kv on meta": (lambda: (q_rows(ROWS).to("meta"), kv_pool().to("meta")), ValueError, ["meta"]),
    "more rows than planned": (lambda: (q_rows(ROWS + 1), kv_pool()), ValueError,
                               ["4 rows", f"wrote {ROWS} rows", "plan("]),
}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward(name, case):
    make_args, exc, words = FORWARD_CASES[case]
    backend, md = planned(name)
    q, kv = make_args()
    with expect(exc, *words, who=name):
        backend.forward(q, kv, md)


@pytest.mark.parametrize("name", BACKENDS)
def test_forward_noncontiguous_last_dim(name):
    backend, md = planned(name)
    q = torch.randn(ROWS, HEADS, 2 * 576).to(DTYPE).to(DEVICE)[..., ::2]
    if not backend.unit_stride_only:  # the torch backend reads any strides
        backend.forward(q, kv_pool(), md)
        return
    with expect(ValueError, "stride", "contiguous", who=name):
        backend.forward(q, kv_pool(), md)


@pytest.mark.parametrize("name", BACKENDS)
def test_forward_before_any_plan(name):
    backend = make(name)
    md = backend.make_metadata(4)
    with expect(ValueError, "plan() has not been called", "backend.plan(metadata, indices)", who=name):
        backend.forward(q_rows(2), kv_pool(), md)


@pytest.mark.parametrize("name", BACKENDS)
def test_forward_with_metadata_of_another_configuration(name):
    backend, _ = planned(name)
    other = get_backend_class(name)(HEADS, TOPK * 2, DTYPE)
    md = other.make_metadata(4)
    other.plan(md, indices(ROWS, TOPK * 2))
    with expect(ValueError, "metadata", "make_metadata", who=name):
        backend.forward(q_rows(ROWS), kv_pool(), md)
    with expect(TypeError, "metadata", who=name):
        backend.forward(q_rows(ROWS), kv_pool(), object())


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("bad", ["shape", "dtype", "lse dtype", "not a pair", "non-contiguous"])
def test_forward_out(name, bad):
    backend, md = planned(name)
    out = torch.empty(ROWS, HEADS, 512, dtype=DTYPE, device=DEVICE)
    lse = torch.empty(ROWS, HEADS, dtype=torch.float32, device=DEVICE)
    given = {
        "shape": (out[:1], lse[:1]),
        "dtype": (out.float(), lse),
        "lse dtype": (out, lse.half()),
        "not a pair": out,
        "non-contiguous": (torch.empty(ROWS, 512, HEADS, dtype=DTYPE, device=DEVICE).transpose(1, 2), lse),
    }[bad]
    with expect(ValueError, "out must be", "contiguous", who=name):
        backend.forward(q_rows(ROWS), kv_pool(), md, out=given)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("bad", ["out overlaps q", "lse overlaps out", "out overlaps kv", "lse overlaps q"])
def test_forward_out_must_not_overlap_its_inputs_or_itself(name, bad):
    """An out= pair sharing bytes with q, kv or each other would be written while the kernel
    reads it (a silently wrong answer, or a corrupted cache): refused, naming both."""
    backend, md = planned(name)
    q_numel, o_numel = ROWS * HEADS * 576, ROWS * HEADS * 512
    buf = torch.randn(q_numel + o_numel, dtype=DTYPE, device=DEVICE)
    q, kv = buf[:q_numel].view(ROWS, HEADS, 576), kv_pool()
    out = torch.empty(ROWS, HEADS, 512, dtype=DTYPE, device=DEVICE)
    lse = torch.empty(ROWS, HEADS, dtype=torch.float32, device=DEVICE)
    kvbuf = torch.randn(POOL * 576 + o_numel, dtype=DTYPE, device=DEVICE)
    lse_bytes = ROWS * HEADS * 4 // 2  # lse's bytes in DTYPE elements
    given, pair = {
        "out overlaps q": ((buf[q_numel - 576:q_numel - 576 + o_numel].view(ROWS, HEADS, 512), lse), ("out", "q")),
        "lse overlaps out": ((out, out.view(-1)[:lse_bytes].view(torch.float32).view(ROWS, HEADS)), ("out", "lse")),
        "out overlaps kv": ((kvbuf[POOL * 576 - 8:POOL * 576 - 8 + o_numel].view(ROWS, HEADS, 512), lse), ("out", "kv")),
        "lse overlaps q": ((out, buf[:lse_bytes].view(torch.float32).view(ROWS, HEADS)), ("lse", "q")),
    }[bad]
    if bad == "out overlaps kv":
        kv = kvbuf[:POOL * 576].view(POOL, 576)
    with expect(ValueError, "overlaps", *pair, who=name):
        backend.forward(q, kv, md, out=given)
    # Disjoint slices of one allocation are fine.
    o_ok = buf[q_numel:].view(ROWS, HEADS, 512)
    res = backend.forward(q, kv, md, out=(o_ok, lse))
    assert res[0] is o_ok and torch.isfinite(lse).all(), f"backend '{name}': disjoint out= slices"


@pytest.mark.parametrize("name", BACKENDS)
def test_forward_refuses_tensors_that_need_a_gradient(name):
    """The backends have no backward: a q, kv or out that needs a gradient while autograd
    records is refused (it used to come back silently detached or fail in backward)."""
    backend, md = planned(name)
    q, kv = q_rows(ROWS).requires_grad_(), kv_pool()
    with expect(ValueError, "requires_grad", "inference_mode", who=name):
        backend.forward(q, kv, md)
    with expect(ValueError, "requires_grad", who=name):
        backend.forward(q.detach(), kv.requires_grad_(), md)
    out = torch.empty(ROWS, HEADS, 512, dtype=DTYPE, device=DEVICE, requires_grad=True)
    lse = torch.empty(ROWS, HEADS, dtype=torch.float32, device=DEVICE)
    with expect(ValueError, "requires_grad", who=name):
        backend.forward(q.detach(), kv.detach(), md, out=(out, lse))
    with torch.no_grad():  # not recorded: fine
        o, _ = backend.forward(q, kv, md)
    assert not o.requires_grad, f"backend '{name}'"


@pytest.mark.parametrize("name", BACKENDS)
def test_a_refused_plan_leaves_nothing_for_forward(name):
    """plan(check_indices=True) that raises must not leave its table (nor the previous step's)
    for the next forward or replay: they refuse, naming the refusal."""
    backend = make(name)
    md = backend.make_metadata(4)
    backend.plan(md, indices(2))
    for bad, kw in ((_with(indices(2), 1, 5, -7), {}), (_with(indices(2), 0, 2, POOL), dict(pool_tokens=POOL))):
        with expect(IndexError, "row", who=name):
            backend.plan(md, bad, check_indices=True, **kw)
        with expect(ValueError, "refused its indices", "plan(", who=name):
            backend.forward(q_rows(2), kv_pool(), md)
    backend.plan(md, indices(2), check_indices=True, pool_tokens=POOL)  # a good plan works again
    out, _ = backend.forward(q_rows(2), kv_pool(), md)
    assert out.shape == (2, HEADS, 512), f"backend '{name}'"


def test_bound_call_refuses_metadata_smaller_than_its_launch():
    """Metadata made by hand (or for fewer heads) passes check_metadata's configuration
    compare; the launch it binds must still fit its counter and workspace (the bound call
    skips the custom ops' checks)."""
    from graphattn.common.metadata import GraphMetadata
    from graphattn.kernels import split_plan

    heads = 40  # three 16-head blocks
    backend = get_backend_class("trtllm")(heads, TOPK, DTYPE)
    small = split_plan("trtllm", 16, TOPK).metadata_kwargs()  # sized for one head block
    md = GraphMetadata(4, heads, TOPK, DTYPE, DEVICE, **small)
    backend.plan(md, indices(2))
    with expect(ValueError, "counter columns", "make_metadata", who="trtllm"):
        backend.forward(q_rows(2, heads=heads), kv_pool(), md)


def test_trtllm_op_refuses_a_non_zero_counter_under_the_debug_switch(monkeypatch):
    args = _op_args("sparse_mla_trtllm")
    args["counter"][1, 0] = 3
    monkeypatch.setattr(validation, "_CHECK_INDICES", True)
    with expect(ValueError, "counter[1, 0] is 3", "zero"):
        torch.ops.graphattn.sparse_mla_trtllm(**args)


@pytest.mark.parametrize("name", BACKENDS)
def test_zero_rows_are_a_valid_step(name):
    backend = make(name)
    md = backend.make_metadata(4)
    backend.plan(md, indices(0))
    out, lse = backend.forward(q_rows(0), kv_pool(), md)
    assert out.shape == (0, HEADS, 512) and lse.shape == (0, HEADS), f"backend '{name}': {out.shape}, {lse.shape}"


# -- the custom ops -------------------------------------------------------------------------
def _op_args(op: str, **over):
    """Valid arguments of ``torch.ops.graphattn.<op>`` (64 heads), with ``over`` replacing some."""
    heads, rows = 64, 2
    from graphattn.common.metadata import GraphMetadata
    from graphattn.kernels import register_ops, split_plan

    register_ops()  # torch.ops.graphattn.* exist once the kernel modules are imported
    kernel = {"sparse_mla_flashmla": "flashmla", "sparse_mla_trtllm": "trtllm", "sparse_mla_mega": "mega"}[op]
    plan = split_plan(kernel, heads, TOPK)
    md = GraphMetadata(rows, heads, TOPK, DTYPE, DEVICE, **plan.metadata_kwargs())
    args = dict(q=q_rows(rows, heads=heads), kv=kv_pool(), indices=indices(rows), sm_scale=576 ** -0.5)
    if kernel == "trtllm":
        args["counter"] = md.counter_for(rows)
    if kernel != "mega":
        args["ws_out"], args["ws_lse"] = md.workspace_for(rows)
    return args | over


OPS = ["sparse_mla_flashmla", "sparse_mla_trtllm", "sparse_mla_mega"]
OP_CASES = {
    "int64 indices": (lambda: dict(indices=indices(2).long()), TypeError, ["indices", "int32"]),
    "indices rows": (lambda: dict(indices=indices(3)), ValueError, ["indices", "rows=2"]),
    "q float32": (lambda: dict(q=q_rows(2, heads=64, dtype=torch.float32)), TypeError, ["q", "float32"]),
    "kv width 512": (lambda: dict(kv=kv_pool(width=512)), ValueError, ["kv", "576"]),
    "kv dtype": (lambda: dict(kv=kv_pool().float()), TypeError, ["kv", "float32"]),
    "kv empty pool": (lambda: dict(kv=kv_pool(tokens=0)), ValueError, ["pool_tokens", ">= 1"]),
    "sm_scale nan": (lambda: dict(sm_scale=float("nan")), ValueError, ["sm_scale"]),
    "sm_scale 0": (lambda: dict(sm_scale=0.0), ValueError, ["sm_scale"]),
    "q last dim strided": (lambda: dict(q=torch.randn(2, 64, 1152).to(DTYPE)[..., ::2]), ValueError, ["q", "stride"]),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", list(OP_CASES))
def test_custom_op(op, case):
    over, exc, words = OP_CASES[case]
    args = _op_args(op, **over())  # registers the ops
    with expect(exc, *words, who=op):
        getattr(torch.ops.graphattn, op)(**args)


@pytest.mark.parametrize("op", ["sparse_mla_flashmla", "sparse_mla_trtllm"])
def test_custom_op_workspace(op):
    args = _op_args(op)
    with expect(TypeError, "workspace", "float32", who=op):
        getattr(torch.ops.graphattn, op)(**args | dict(ws_out=args["ws_out"].half()))
    if op == "sparse_mla_trtllm":
        with expect(TypeError, "counter", "int32", who=op):
            torch.ops.graphattn.sparse_mla_trtllm(**args | dict(counter=args["counter"].long()))


@pytest.mark.parametrize("op", ["sparse_mla_flashmla", "sparse_mla_trtllm"])
@pytest.mark.parametrize("layout", ["heads expanded", "heads-major permuted", "splits overlapping"])
def test_custom_op_refuses_a_workspace_whose_blocks_overlap(op, layout):
    """A (row, split)'s partials are one dense [heads, 512] block (the sm_90 kernels store a
    head block's partials as one run): a workspace that passes the shape checks but whose
    blocks alias each other would be overrun or overwritten, silently."""
    args = _op_args(op)
    rows, heads, splits = args["q"].shape[0], args["q"].shape[1], 2
    dense_out = torch.empty(rows, splits, heads, 512, device=DEVICE)
    dense_lse = torch.empty(rows, splits, heads, device=DEVICE)
    ws_out, ws_lse = {
        "heads expanded": (torch.empty(rows, splits, 1, 512, device=DEVICE).expand(rows, splits, heads, 512),
                           dense_lse),
        "heads-major permuted": (torch.empty(heads, rows, splits, 512, device=DEVICE).permute(1, 2, 0, 3),
                                 dense_lse),
        "splits overlapping": (dense_out, torch.empty(rows, 1, heads, device=DEVICE).expand(rows, splits, heads)),
    }[layout]
    with expect(ValueError, "workspace strides", "dense", who=f"{op} {layout}"):
        getattr(torch.ops.graphattn, op)(**args | dict(ws_out=ws_out, ws_lse=ws_lse))
    from graphattn.kernels import checks

    checks.check_workspace(op, args["q"], dense_out, dense_lse)  # dense blocks pass
    checks.check_workspace(op, args["q"], dense_out[:, :1], dense_lse[:, :1])  # a slice of splits too


@pytest.mark.parametrize("op", ["sparse_mla_flashmla", "sparse_mla_trtllm"])
def test_custom_op_refuses_a_workspace_with_fewer_heads_than_q(op):
    # Any head count is accepted (flashmla reads q unpadded too), but the workspace holds the
    # partials of every head q has.
    args = _op_args(op)
    with expect(ValueError, "workspace too small", "64 heads", "need >= 2 rows x 80 heads", who=op):
        getattr(torch.ops.graphattn, op)(**args | dict(q=q_rows(2, heads=80)))
