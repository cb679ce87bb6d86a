"""The launch path (issue 11): typed kernel specs, memoised launch plans, the direct launch that
skips the custom-op dispatcher only when nothing watches the ops, and torch.compile(fullgraph).

GPU variants of the compile test run on a CUDA machine (``gpu`` marker); host timings live in
``graphattn bench`` (docs/benchmarks.md), never in tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graphattn.backends import get_backend_class, torch_ref
from graphattn.common.platform import current_platform
from graphattn.common.reference import sparse_mla_reference
from graphattn.common.tolerances import tolerance
from graphattn.kernels import launch
from graphattn.testing.specs import Q_STD, tolerance

BUILTIN = ("dispatch", "flashmla", "trtllm", "flashmla_mega", "torch")
TRITON = ("dispatch", "flashmla", "trtllm", "flashmla_mega")


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
    specs = cls.kernel_specs  # one path, or every path dispatch may choose
    assert (cls.uses_counter, cls.uses_workspace) == (any(s.uses_counter for s in specs),
                                                      any(s.uses_workspace for s in specs)), f"backend '{name}'"
    assert not cls.pads_q, f"backend '{name}': the Triton kernels read q unpadded"
    assert all(spec is launch.SPECS[spec.name] for spec in specs)


@pytest.mark.parametrize("name", TRITON)
def test_plan_builds_the_launch_plan_forward_uses(name, monkeypatch):
    """plan() builds the step's LaunchPlan; forward finds it (no second build) and it is frozen."""
    q, kv, idx = _inputs()
    backend = get_backend_class(name)(q.shape[1], idx.shape[1], q.dtype)
    md = backend.make_metadata(8)
    backend.plan(md, idx, pad_to=4)
    plan = backend.launch_plan(md, 4)
    assert isinstance(plan, launch.LaunchPlan) and plan.rows == 4 and plan.spec in backend.kernel_specs
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
    op = f"graphattn.{backend.launch_plan(md, 3).spec.op_name}.default"
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


@pytest.mark.parametrize("name", ["trtllm", "flashmla_mega"])
def test_clear_launch_plans_reaches_backends_and_bound_calls(name):
    """After a launch-settings change and clear_launch_plans(), a backend's next plan and
    forward use the new settings: neither its plan lookup nor the metadata's bound call keeps
    the old plan (a tile sweep over live backends would otherwise time the old tile)."""
    q, kv, idx = _inputs()
    backend = get_backend_class(name)(q.shape[1], idx.shape[1], q.dtype)
    md = backend.make_metadata(3)
    backend.plan(md, idx)
    before = backend.launch_plan(md, 3)
    call = backend.bound_call(md, q, kv)
    path = backend.kernel_spec.name
    table = current_platform().launch_table
    # A tile every GPU compiles (tl.dot needs 16 or more on each side; 8 only interprets).
    new_block = 16 if before.main.kwargs["BLOCK_N"] != 16 else 32
    try:
        with table.override(path, BLOCK_N=new_block):
            launch.clear_launch_plans()
            backend.plan(md, idx)
            after = backend.launch_plan(md, 3)
            assert after.main.kwargs["BLOCK_N"] == new_block, f"backend '{name}' kept {before.main}"
            assert backend.bound_call(md, q, kv) is not call, f"backend '{name}': stale bound call"
            _check(name, q, kv, idx, backend, *backend.forward(q, kv, md))
    finally:
        launch.clear_launch_plans()
    assert backend.launch_plan(md, 3).main.kwargs["BLOCK_N"] == before.main.kwargs["BLOCK_N"]


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


class _FakeCompiled:
    """What Triton's JITFunction.run returns: a compiled kernel with its launcher."""

    def __init__(self, log: list):
        self.function, self.packed_metadata = "function-handle", "packed-metadata"
        self.run = lambda *a: log.append(("cached", a))


class _FakeJit:
    """A stand-in ``@triton.jit`` function: ``fn[grid](*args, **kwargs)`` logs and returns a
    compiled kernel (or ``None``, as the interpreter does)."""

    def __init__(self, compiled: bool = True):
        def kernel(x_ptr, n, scale, BLOCK, FLAG=7):
            pass

        self.signature = inspect.signature(kernel)
        self.log: list = []
        self.compiled = _FakeCompiled(self.log) if compiled else None

    def __getitem__(self, grid):
        def runner(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return self.compiled

        return runner


@pytest.fixture
def fake_triton(monkeypatch):
    """Triton's runtime as the cached launcher sees it on a GPU: device 0, stream 99, no hooks."""
    state = types.SimpleNamespace(device=0, hook=None)

    class Knobs:
        launch_enter_hook = property(lambda self: state.hook)

    monkeypatch.setattr(launch._Triton, "device", staticmethod(lambda: state.device))
    monkeypatch.setattr(launch._Triton, "stream", staticmethod(lambda device: 99 + device))
    monkeypatch.setattr(launch._Triton, "knobs", Knobs())
    monkeypatch.setattr(launch._Triton, "load", classmethod(lambda cls: None))
    return state


def test_keyed_launch_reuses_the_compiled_kernel_per_key(fake_triton):
    fn = _FakeJit()
    keyed = launch.KeyedLaunch(launch.make_launch(fn, (6,), BLOCK=32, num_warps=4))
    x = torch.randn(64)
    keyed("k", x, 16, 0.5)  # first call: Triton's path (compiles or finds the kernel)
    keyed("k", x, 16, 0.5)  # same key: straight to the compiled kernel's launcher
    assert [e[0] for e in fn.log] == ["jit", "cached"]
    assert fn.log[0][1:] == ((6,), (x, 16, 0.5), {"BLOCK": 32, "num_warps": 4})
    # grid padded to 3 dims, the device's stream, handles, no hooks, then every kernel
    # parameter in signature order: the positional args, then constexprs (given, else default).
    assert fn.log[1][1] == (6, 1, 1, 99, "function-handle", "packed-metadata", None, None, None,
                            x, 16, 0.5, 32, 7)
    keyed("other", x, 16, 0.5)
    assert fn.log[-1][0] == "jit"


class _FakeClusterJit(_FakeJit):
    """A ``@gluon.jit`` stand-in with a ``CLUSTER`` constexpr and ``warmup`` (Triton's compile
    without launching), whose compiled kernel has Triton's packed launch metadata."""

    def __init__(self, packed):
        super().__init__()

        def kernel(x_ptr, n, scale, BLOCK, FLAG=7, CLUSTER=0):
            pass

        self.signature = inspect.signature(kernel)
        self.compiled.packed_metadata = packed

    def warmup(self, *args, grid, **kwargs):
        self.log.append(("warmup", grid, args, kwargs))
        return self.compiled


def test_cluster_launch_asks_for_clusters_and_says_so_in_the_metadata(fake_triton):
    """A launch with ``CLUSTER=2`` (flashmla's two splits merged in a thread-block cluster) runs
    one-CTA code in clusters: the compiled kernel's packed metadata carries ``num_ctas`` 2 and the
    grid asks for half as many clusters, through Triton's path and the cached launcher alike;
    a Triton whose launcher has no such metadata is refused with a clear error."""
    fn = _FakeClusterJit((4, 1, 1000))
    keyed = launch.KeyedLaunch(launch.Launch(fn, (8,), {"BLOCK": 32, "CLUSTER": 2}))  # a GPU's launch
    assert keyed.launch.cluster == 2 and launch.Launch(fn, (8,), {"BLOCK": 32}).cluster == 1
    x = torch.randn(64)
    keyed("k", x, 16, 0.5)
    keyed("k", x, 16, 0.5)
    assert [e[0] for e in fn.log] == ["warmup", "jit", "cached"], fn.log
    assert fn.log[0][1] == (8,) and fn.log[1][1] == (4,), fn.log  # the launch asks for 4 clusters of 2
    assert fn.compiled.packed_metadata == (4, 2, 1000)
    assert fn.log[2][1][:6] == (4, 1, 1, 99, "function-handle", (4, 2, 1000)), fn.log[2]
    assert fn.log[2][1][-3:] == (32, 7, 2), fn.log[2]  # BLOCK, FLAG's default, CLUSTER
    with pytest.raises(RuntimeError, match="clusters"):
        launch.Launch(_FakeClusterJit(None), (8,), {"BLOCK": 32, "CLUSTER": 2})(x, 16, 0.5)


class _FakeHoldJit(_FakeClusterJit):
    """A stand-in combine with a ``HOLD_SMEM`` constexpr (flashmla's combines)."""

    def __init__(self, packed):
        super().__init__(packed)

        def kernel(x_ptr, n, scale, BLOCK, FLAG=7, HOLD_SMEM=0):
            pass

        self.signature = inspect.signature(kernel)


def test_held_shared_memory_is_reserved_once_and_launched_with(fake_triton, monkeypatch):
    """A launch with ``HOLD_SMEM`` (flashmla's combine as a programmatic dependent launch, one
    program per SM) launches with that much dynamic shared memory: the launch table lets the
    compiled function have it (once: the packed metadata then says so) and both Triton's path
    and the cached launcher launch with it; a kernel that already needs as much is left alone;
    a table that cannot reserve any refuses clearly."""
    from graphattn.common.platform import LaunchTable, current_platform

    allowed = []
    table = current_platform().launch_table
    monkeypatch.setattr(type(table), "allow_launch_shared_memory",
                        lambda self, kernel, nbytes: allowed.append((kernel, nbytes)))
    fn = _FakeHoldJit((4, 1, 1000))
    keyed = launch.KeyedLaunch(launch.Launch(fn, (8,), {"BLOCK": 32, "HOLD_SMEM": 120_000}))
    x = torch.randn(64)
    for _ in range(3):
        keyed("k", x, 16, 0.5)
    assert [e[0] for e in fn.log] == ["warmup", "jit", "cached", "cached"], fn.log
    assert fn.log[1][1] == (8,), fn.log  # no clusters: the grid as planned
    assert allowed == [(fn.compiled, 120_000)], allowed
    assert fn.compiled.packed_metadata == (4, 1, 120_000)
    assert fn.log[2][1][:6] == (8, 1, 1, 99, "function-handle", (4, 1, 120_000)), fn.log[2]
    assert fn.log[2][1][-1] == 120_000, fn.log[2]  # the constexpr, as compiled
    launch.Launch(fn, (8,), {"BLOCK": 32, "HOLD_SMEM": 120_000})(x, 16, 0.5)  # another plan, same kernel
    assert len(allowed) == 1, allowed
    big = _FakeHoldJit((4, 1, 200_000))  # its own shared memory is more than the hold
    launch.Launch(big, (8,), {"BLOCK": 32, "HOLD_SMEM": 120_000})(x, 16, 0.5)
    assert len(allowed) == 1 and big.compiled.packed_metadata == (4, 1, 200_000)
    with pytest.raises(RuntimeError, match="HOLD_SMEM"):
        launch.Launch(_FakeHoldJit(None), (8,), {"BLOCK": 32, "HOLD_SMEM": 120_000})(x, 16, 0.5)

    class Plain(LaunchTable):
        name = "plain"

    with pytest.raises(NotImplementedError, match="HOLD_SMEM=120000"):
        Plain().allow_launch_shared_memory(fn.compiled, 120_000)


def test_call_key_separates_what_triton_specialises(fake_triton):
    q, kv = torch.randn(2, 4, 576), torch.randn(10, 576)
    out, lse = torch.empty(2, 4, 512), torch.empty(2, 4)
    key, qs, kvs, ptrs = launch.call_key(q, kv, out, lse)
    assert qs == q.stride() and kvs == 576
    assert ptrs == (q.data_ptr(), kv.data_ptr(), out.data_ptr(), lse.data_ptr())
    assert key[-2:] == (q.get_device(), kv.get_device()), key  # where q and kv are, not only the current GPU
    assert launch.call_key(q.clone(), kv.clone(), out, lse)[0] == key  # same layout, new storage
    others = [
        (q.double(), kv, out, lse),  # dtype
        (q, torch.randn(11, 576), out, lse),  # pool size
        (q, torch.randn(10, 600)[:, :576], out, lse),  # kv row stride
        (torch.randn(4, 2, 576).transpose(0, 1), kv, out, lse),  # q strides
        (q, torch.randn(10 * 576 + 2)[2:].view(10, 576), out, lse),  # kv not 16-byte aligned
        (q, kv, torch.randn(2 * 4 * 512 + 1)[1:].view(2, 4, 512), lse),  # out not aligned
    ]
    assert all(launch.call_key(*a)[0] != key for a in others)
    fake_triton.device = 1
    assert launch.call_key(q, kv, out, lse)[0] != key  # another current device


class CudaLauncher:
    """Triton 3.6's NVIDIA launcher as ``_Triton.raw_launcher`` finds it: a C entry point and
    its fixed launch flags, no scratch memory."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = "coop", "pdl"

    def __init__(self, log: list):
        self.launch = lambda *a: log.append(("raw", a))

    def __call__(self, *a):
        raise AssertionError("the checked C entry point, not the wrapper, must launch")


def test_keyed_launch_passes_int_pointers_to_the_checked_entry_point(fake_triton, monkeypatch):
    """Once a key has launched (with tensors, to specialise), ``run(key, tensors, pointers,
    ...)`` launches through the C entry point with the pointers as ints (no data_ptr(), no
    driver check per pointer); never on the key's first call, for another key, while a hook is
    registered, or where the entry point was not checked (other Triton versions, AMD: the
    wrapper launches, with the tensors)."""
    monkeypatch.setattr(launch._Triton, "raw_ok", True)
    fn = _FakeJit()
    fn.compiled.run = CudaLauncher(fn.log)
    keyed = launch.KeyedLaunch(launch.make_launch(fn, (6,), BLOCK=32))
    x = torch.randn(64)
    keyed.run("k", (x,), (1234,), 16, 0.5)  # nothing specialised yet: the first call passes tensors
    assert fn.log[-1][0] == "jit" and fn.log[-1][2] == (x, 16, 0.5), fn.log[-1]
    keyed.run("k", (x,), (1234,), 16, 0.5)
    assert fn.log[-1] == ("raw", (6, 1, 1, 99, "function-handle", "coop", "pdl", None, None, "packed-metadata",
                                  None, None, None, 1234, 16, 0.5, 32, 7))
    keyed.run("other", (x,), (1234,), 16, 0.5)
    assert fn.log[-1][0] == "jit" and fn.log[-1][2] == (x, 16, 0.5), fn.log[-1]
    fake_triton.hook = types.SimpleNamespace(calls=[print])  # a profiler wants to see launches
    keyed.run("k", (x,), (1234,), 16, 0.5)
    assert fn.log[-1][0] == "jit" and fn.log[-1][2] == (x, 16, 0.5), fn.log[-1]
    fake_triton.hook = None
    monkeypatch.setattr(launch._Triton, "raw_ok", False)  # an unchecked launcher: the wrapper's path
    fn = _FakeJit()
    keyed = launch.KeyedLaunch(launch.make_launch(fn, (6,), BLOCK=32))
    keyed.run("k", (x,), (1234,), 16, 0.5)
    keyed.run("k", (x,), (1234,), 16, 0.5)
    assert [e[0] for e in fn.log] == ["jit", "cached"] and fn.log[-1][1][-5] is x, fn.log


def test_specialised_launch_defers_to_triton_for_hooks_and_the_interpreter(fake_triton, monkeypatch):
    fn = _FakeJit()
    fast = launch.make_launch(fn, (2, 3), BLOCK=16).specialised(torch.randn(32), 1, 1.0)
    fake_triton.hook = types.SimpleNamespace(calls=[print])  # a profiler registered a hook
    fast(torch.randn(32), 1, 1.0)
    fake_triton.hook = types.SimpleNamespace(calls=[])  # Triton 3.6's empty hook chain
    fast(torch.randn(32), 1, 1.0)
    assert [e[0] for e in fn.log] == ["jit", "jit", "cached"]
    for compiled, cached_launcher in ((False, True), (True, False)):  # interpreter; the switch
        monkeypatch.setattr(launch, "_CACHED_LAUNCHER", cached_launcher)
        fn = _FakeJit(compiled=compiled)
        keyed = launch.KeyedLaunch(launch.make_launch(fn, (2,), BLOCK=16))
        for _ in range(3):
            keyed("k", torch.randn(32), 1, 1.0)
        assert [e[0] for e in fn.log] == ["jit"] * 3


@pytest.mark.parametrize("name", BUILTIN)
def test_forward_writes_into_given_outputs(name):
    """forward(..., out=(out, lse)) writes there and returns them; a wrong pair is refused."""
    q, kv, idx = _inputs(heads=4)
    backend = get_backend_class(name)(4, idx.shape[1], q.dtype)
    md = backend.make_metadata(4)
    backend.plan(md, idx)
    out = (torch.full((3, 4, 512), float("nan"), dtype=q.dtype, device=q.device),
           torch.full((3, 4), float("nan"), device=q.device))
    res = backend.forward(q, kv, md, out=out)
    assert res[0] is out[0] and res[1] is out[1], f"backend '{name}' did not return out"
    _check(name, q, kv, idx, backend, *out)
    for bad in ((out[0][:2], out[1][:2]), (out[0].float(), out[1]), (out[0], out[1].half()),
                (torch.empty(3, 512, 4, dtype=q.dtype).transpose(1, 2), out[1]), out[0]):
        with pytest.raises(ValueError, match="out must be"):
            backend.forward(q, kv, md, out=bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_torch_backend_chunks_rows_like_one_call(dtype, monkeypatch):
    """Rows past the gather budget run in chunks, into new or given outputs, with the same
    results as one call (the budget here fits one row per chunk)."""
    q, kv, idx = _inputs(rows=5, dtype=dtype)
    backend = get_backend_class("torch")(q.shape[1], idx.shape[1], dtype)
    md = backend.make_metadata(5)
    backend.plan(md, idx)
    whole = backend.forward(q, kv, md)
    monkeypatch.setattr(torch_ref, "_GATHER_BUDGET_BYTES", idx.shape[1] * 576 * 4)
    assert backend._chunk_rows(5) == 1
    out = (torch.full_like(whole[0], float("nan")), torch.full_like(whole[1], float("nan")))
    # Not bitwise: a GPU's batched matmul may pick another algorithm for another batch size.
    tol = tolerance(dtype)
    for chunked in (backend.forward(q, kv, md), backend.forward(q, kv, md, out=out)):
        torch.testing.assert_close(chunked[0], whole[0], atol=tol.atol, rtol=tol.rtol, equal_nan=True,
                                   msg=lambda m: f"backend 'torch': chunked out differs from one call\n{m}")
        torch.testing.assert_close(chunked[1], whole[1], atol=tol.lse_atol, rtol=tol.lse_rtol, equal_nan=True,
                                   msg=lambda m: f"backend 'torch': chunked lse differs from one call\n{m}")
    _check("torch", q, kv, idx, backend, *out)


@pytest.mark.parametrize("name", TRITON)
def test_bound_calls_follow_buffer_growth(name):
    """A bound call keeps views of the metadata's buffers; when a buffer grows (before any
    capture) every bound call is rebuilt on the new storage, so results stay right."""
    q, kv, idx = _inputs(heads=4, rows=6)
    backend = get_backend_class(name)(4, idx.shape[1], q.dtype)
    md = backend.make_metadata(2)
    backend.plan(md, idx[:2])
    _check(name, q[:2], kv, idx[:2], backend, *backend.forward(q[:2], kv, md))
    old = md.indices.tensor
    backend.plan(md, idx)  # 6 rows > 2 reserved: the index table grows (a new storage)
    assert md.indices.tensor is not old
    _check(name, q, kv, idx, backend, *backend.forward(q, kv, md))
    md.reserve(16)  # every row buffer grows again
    backend.plan(md, idx[2:4])
    _check(name, q[2:4], kv, idx[2:4], backend, *backend.forward(q[2:4], kv, md))


def test_padding_rows_stay_inert_whatever_the_step_sequence():
    """plan() fills padding rows with -1 only where an earlier, larger step wrote; every
    planned row past the step's own must read -1 after any sequence of sizes."""
    backend = get_backend_class("torch")(2, 5, torch.float32)
    md = backend.make_metadata(16)
    gen = torch.Generator().manual_seed(5)
    for n, pad in [(3, 8), (8, 8), (2, 8), (2, 4), (6, None), (1, 16), (16, None), (4, 6), (4, 12)]:
        idx = torch.randint(0, 100, (n, 5), dtype=torch.int32, generator=gen).to(md.device)
        backend.plan(md, idx, pad_to=pad)
        rows = max(n, pad or 0)
        table = md.indices.tensor
        assert torch.equal(table[:n], idx)
        assert (table[n:rows] == -1).all(), f"step ({n}, pad_to={pad}): padding rows not -1"


@pytest.mark.parametrize("name", TRITON)
def test_break_replay_call_matches_the_reference_and_keeps_forwards_checks(name):
    """A breakable graph whose attention break binds the backend's replay call
    (``eager_on_graph(forward, out="out", bind=backend.bind_break)``): every replay attends over
    that step's plan (fresh indices and q each step, fewer live rows than the bucket), writes
    into the captured outputs, takes forward's path under a dispatch mode, and still refuses
    a replay over rows the plan did not write."""
    from graphattn.graphs import GraphRunner, eager_on_graph

    q0, kv, _ = _inputs()
    backend = get_backend_class(name)(q0.shape[1], 24, q0.dtype)
    md = backend.make_metadata(4)
    bound = []

    def bind(args, kwargs):
        bound.append(backend.bind_break(args, kwargs))
        return bound[-1]

    attention = eager_on_graph(backend.forward, out="out", bind=bind)
    static = {"q": torch.zeros(4, *q0.shape[1:], dtype=q0.dtype, device=q0.device)}
    runner = GraphRunner(lambda q: attention(q * 1, kv, md), static,
                         metadata=md, buckets=(4,), mode="breakable")
    backend.plan(md, _inputs(rows=4)[2])
    runner.capture()
    assert len(bound) == 1 and callable(bound[0]), f"backend '{name}' gave no replay call"

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    checks = []  # forward's own path checks its arguments; the replay call does not
    check_call = backend.check_call
    backend.check_call = lambda *a: (checks.append(1), check_call(*a))[1]
    for step in range(3):
        q, _, idx = _inputs(rows=3)
        backend.plan(md, idx)
        captured_out = runner.graphs[4].out
        captured_out[0].fill_(float("nan"))
        with Watch() if step == 2 else contextlib.nullcontext():  # forward's own path
            out, lse = runner.run(q=q)
        assert out.data_ptr() == captured_out[0].data_ptr()
        _check(name, q, kv, idx, backend, out, lse)
        assert len(checks) == (1 if step == 2 else 0), f"backend '{name}' step {step}: {len(checks)} checks"
    q, _, idx = _inputs(rows=3)
    idx = idx.clamp(-1, kv.shape[0] - 1)  # valid: the check passes (and then runs no more)
    backend.plan(md, idx, check_indices=True)  # a pending index check: forward's slow path
    out, lse = runner.run(q=q)
    _check(name, q, kv, idx, backend, out, lse)
    assert len(checks) == 2, f"backend '{name}': the pending index check was skipped"


def test_bind_break_declines_calls_it_does_not_recognise():
    q, kv, idx = _inputs()
    backend = get_backend_class("trtllm")(q.shape[1], idx.shape[1], q.dtype)
    md = backend.make_metadata(3)
    backend.plan(md, idx)
    out = backend.forward(q, kv, md)
    assert backend.bind_break((q, kv, md), {}) is None  # no out: the break copies results
    assert backend.bind_break((q, kv, md, out), {}) is None  # out passed positionally
    assert backend.bind_break((q,), {"kv": kv, "metadata": md, "out": out}) is not None
    assert get_backend_class("torch")(q.shape[1], idx.shape[1], q.dtype).bind_break((q, kv, md), {"out": out}) is None
    with pytest.raises(ValueError, match="out must be"):
        backend.bind_break((q, kv, md), {"out": (out[0][:1], out[1])})
