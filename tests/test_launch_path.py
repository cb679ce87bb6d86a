"""The launch path (issue 11): typed kernel specs, memoised launch plans, the direct launch that
skips the custom-op dispatcher only when nothing watches the ops, and torch.compile(fullgraph).

GPU variants of the compile test run on a CUDA machine (``gpu`` marker); host timings live in
``graphattn bench`` (docs/benchmarks.md), never in tests.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graphattn.backends import get_backend_class
from graphattn.common.platform import current_platform
from graphattn.common.reference import sparse_mla_reference
from graphattn.kernels import launch
from graphattn.testing.specs import Q_STD, tolerance

BUILTIN = ("flashmla", "trtllm", "flashmla_mega", "torch")
TRITON = ("flashmla", "trtllm", "flashmla_mega")


def _inputs(heads=5, rows=3, topk=24, pool=60, dtype=torch.float16, device=None):
    device = device or current_platform().device
    q = (torch.randn(rows, heads, 576) * Q_STD).to(dtype).to(device)
    kv = torch.randn(pool, 576).to(dtype).to(device)
    idx = torch.randint(-1, pool + 3, (rows, topk), dtype=torch.int32).to(device)
    return q, kv, idx


def _check(name, q, kv, idx, backend, out, lse):
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, backend.sm_scale)
    tol = tolerance(q.dtype)
    torch.testing.assert_close(out.double(), ref_out, atol=tol.atol, rtol=tol.rtol,
                               msg=lambda m: f"backend '{name}' out: {m}")
    torch.testing.assert_close(lse.double(), ref_lse, atol=tol.lse_atol, rtol=tol.lse_rtol,
                               msg=lambda m: f"backend '{name}' lse: {m}")


@pytest.mark.parametrize("name", TRITON)
def test_capabilities_follow_the_kernel_spec(name):
    cls = get_backend_class(name)
    spec = cls.kernel_spec
    assert (cls.pads_q, cls.uses_counter, cls.uses_workspace) == (
        spec.pads_heads, spec.uses_counter, spec.uses_workspace), f"backend '{name}'"
    assert spec is launch.SPECS[spec.name]


@pytest.mark.parametrize("name", TRITON)
def test_plan_builds_the_launch_plan_forward_uses(name, monkeypatch):
    """plan() builds the step's LaunchPlan; forward finds it (no second build) and it is frozen."""
    q, kv, idx = _inputs()
    backend = get_backend_class(name)(q.shape[1], idx.shape[1], q.dtype)
    md = backend.make_metadata(8)
    backend.plan(md, idx, pad_to=4)
    plan = backend.launch_plan(md, 4)
    assert isinstance(plan, launch.LaunchPlan) and plan.rows == 4 and plan.spec is backend.kernel_spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.splits = 3
    built = []
    monkeypatch.setattr(type(backend), "_build_plan", lambda self, *a: built.append(a))
    assert backend.launch_plan(md, 4) is plan and not built, f"backend '{name}': plan rebuilt"
    q4 = torch.cat([q, q[:1]])
    out, lse = backend.forward(q4, kv, md)
    assert not built, f"backend '{name}': forward built a plan that plan() should have"
    _check(name, q, kv, idx, backend, out[:3], lse[:3])


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", TRITON)
def test_dispatch_modes_still_see_the_custom_op(name):
    """Under a TorchDispatchMode (the capture sanitizer, the emulator's capture are ones) the
    call goes through the custom op, so the mode sees it; with none, it launches directly and
    gives the same answer."""
    q, kv, idx = _inputs()
    backend = get_backend_class(name)(q.shape[1], idx.shape[1], q.dtype)
    md = backend.make_metadata(3)
    backend.plan(md, idx)
    assert launch.direct_launch_allowed()
    direct = backend.forward(q, kv, md)
    with _Recorder() as mode:
        assert not launch.direct_launch_allowed()
        via_op = backend.forward(q, kv, md)
    op = f"graphattn.{backend.kernel_spec.op_name}.default"
    assert op in mode.ops, f"backend '{name}': the dispatch mode saw {mode.ops}"
    for a, b in zip(direct, via_op):
        torch.testing.assert_close(a, b, msg=lambda m: f"backend '{name}' direct vs op: {m}")
    _check(name, q, kv, idx, backend, *direct)


def test_launch_plans_are_memoised_per_shape():
    from graphattn.kernels.mega import plan_mega
    from graphattn.kernels.trtllm import plan_trtllm

    assert plan_mega(3, 16, 64) is plan_mega(3, 16, 64)
    assert plan_mega(3, 16, 64) is not plan_mega(4, 16, 64)
    p = plan_trtllm(2, 20, 300, 4)
    assert p.splits >= 1 and p.main.grid == (2 * p.splits * p.head_blocks,)
    with pytest.raises(TypeError):
        p.main.kwargs["BLOCK_H"] = 1  # launch settings are read-only
    launch.clear_launch_plans()
    assert plan_trtllm(2, 20, 300, 4) == p and plan_trtllm(2, 20, 300, 4) is not p


def _compiled_matches_eager(name, device):
    q, kv, idx = _inputs(device=device, dtype=torch.float16 if device.type == "cpu" else torch.bfloat16)
    backend = get_backend_class(name)(q.shape[1], idx.shape[1], q.dtype)
    md = backend.make_metadata(3)
    backend.plan(md, idx)
    eager = backend.forward(q, kv, md)
    torch._dynamo.reset()
    compiled = torch.compile(backend.forward, fullgraph=True, backend="aot_eager" if device.type == "cpu" else "inductor")
    got = compiled(q, kv, md)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, msg=lambda m: f"backend '{name}' compiled vs eager: {m}")
    _check(name, q, kv, idx, backend, *got)


@pytest.mark.parametrize("name", BUILTIN)
def test_torch_compile_fullgraph_cpu(name, cpu_platform):
    if name in TRITON and torch.cuda.is_available():
        pytest.skip("Triton kernels on CPU tensors need the interpreter, which is off where a GPU is")
    _compiled_matches_eager(name, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", BUILTIN)
def test_torch_compile_fullgraph_gpu(name):
    _compiled_matches_eager(name, torch.device("cuda"))
