"""Device-index safety: backends, metadata, runner, sanitizer and kernels on ``cuda:N``.

Tensors on two devices are refused before any launch (CPU tests, with ``meta`` as the second
device); on a machine with two GPUs everything runs on ``cuda:1`` while ``cuda:0`` is the
current device, and again with ``cuda:1`` current, against the float64 reference.
"""

from __future__ import annotations

import pytest
import torch

from graphattn.backends import builtin_backends, get_backend_class
from graphattn.common import FreedCaptureBufferError, GraphMetadata, sparse_mla_reference
from graphattn.common.platform import DeviceFacts, current_platform, device_scope, reset_platform_cache
from graphattn.common.tolerances import tolerance
from graphattn.cuda.platform import CudaPlatform
from graphattn.graphs import BreakableGraph, GraphRunner, eager_on_graph

from test_conformance import _run_suite

HEADS, TOPK, POOL, ROWS = 16, 64, 256, 4


def _backend(name: str, platform, dtype: torch.dtype):
    return get_backend_class(name)(HEADS, TOPK, dtype, platform=platform)


def _inputs(rows: int, device: torch.device, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, HEADS, 576, generator=gen).to(device, dtype)
    kv = torch.randn(POOL, 576, generator=gen).to(device, dtype)
    idx = torch.stack([torch.randperm(POOL, generator=gen)[:TOPK] for _ in range(rows)]).to(device, torch.int32)
    return q, kv, idx


def _assert_reference(name: str, q, kv, idx, sm_scale: float, out, lse) -> None:
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, sm_scale)
    tol = tolerance(q.dtype)
    torch.testing.assert_close(out.double(), ref_out, atol=tol.atol, rtol=tol.rtol,
                               msg=lambda m: f"backend '{name}' on {q.device}: out differs from the float64 reference\n{m}")
    torch.testing.assert_close(lse.double(), ref_lse, atol=tol.lse_atol, rtol=tol.lse_rtol,
                               msg=lambda m: f"backend '{name}' on {q.device}: lse differs from the float64 reference\n{m}")


# -- CPU: the checks ------------------------------------------------------------------------------
def test_cpu_platform_binds_only_the_cpu(cpu_platform):
    platform = current_platform()
    assert platform.on_device("cpu") is platform
    with pytest.raises(ValueError, match=r"platform 'cpu' keeps tensors on 'cpu', got device cuda:1.*no GPU here"):
        platform.on_device("cuda:1")


def test_a_bound_platform_keeps_its_device_and_checks_the_index(cpu_platform):
    fake = DeviceFacts("nvidia", "fake", 132, capability=(9, 0))
    bound = CudaPlatform(fake, device="cuda:1")
    assert bound.device == torch.device("cuda", 1) and bound.has_gpu
    assert bound.describe()["device"] == "cuda:1"
    assert device_scope(torch.device("cpu")) is device_scope(torch.device("cuda"))  # both no-ops


@pytest.mark.parametrize("name", builtin_backends())
def test_tensors_on_two_devices_are_refused_before_any_launch(name, cpu_platform):
    platform = current_platform()
    backend = _backend(name, platform, torch.float16)
    metadata = backend.make_metadata(ROWS)
    q, kv, idx = _inputs(ROWS, torch.device("cpu"), torch.float16)
    backend.plan(metadata, idx)
    with pytest.raises(ValueError, match=rf"{name}: q is on cpu, kv on meta, metadata on cpu; expected all on q's device"):
        backend.forward(q, kv.to("meta"), metadata)
    meta_md = GraphMetadata(ROWS, metadata.num_heads, TOPK, torch.float16, "meta",
                            padded_heads=metadata.padded_heads, counter_cols=metadata.counter.row_shape[0]
                            if metadata.counter is not None else 0, num_splits=metadata.num_splits)
    with pytest.raises(ValueError, match=rf"{name}: q is on cpu, kv on cpu, metadata on meta"):
        backend.forward(q, kv, meta_md)


def test_runner_refuses_inputs_on_another_device(cpu_platform):
    static = {"x": torch.zeros(4, 3)}
    runner = GraphRunner(lambda x: x * 2, static, buckets=[2, 4])
    runner.capture()
    with pytest.raises(ValueError, match=r"input 'x' must be \[rows, 3\] torch.float32 on cpu .* on meta"):
        runner.run(x=torch.ones(2, 3, device="meta"))
    with pytest.raises(ValueError, match=r"static inputs must be on one device"):
        GraphRunner(lambda x, y: x, {"x": torch.zeros(4), "y": torch.zeros(4, device="meta")})
    bound = CudaPlatform(DeviceFacts("nvidia", "fake", 132, capability=(9, 0)), device="cuda:1")
    with pytest.raises(ValueError, match=r"static inputs are on cpu but the platform is bound to cuda:1"):
        GraphRunner(lambda x: x, static, platform=bound)


# -- two GPUs ---------------------------------------------------------------------------------------
def _gpu_backends(platform) -> list[str]:
    return [n for n in builtin_backends()
            if not get_backend_class(n).refusal_reasons(HEADS, torch.bfloat16, TOPK, platform)]


@pytest.fixture
def on_gpu0(monkeypatch):
    """The real GPU platform, with ``cuda:0`` current; yields the platform bound to ``cuda:1``."""
    monkeypatch.delenv("GRAPHATTN_PLATFORM", raising=False)
    reset_platform_cache()
    with torch.cuda.device(0):
        yield current_platform().on_device(1)
    reset_platform_cache()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("current", [0, 1])
def test_backends_run_on_cuda1_whichever_device_is_current(on_gpu0, current):
    platform, dev1 = on_gpu0, torch.device("cuda", 1)
    for name in _gpu_backends(platform):
        backend = _backend(name, platform, torch.bfloat16)
        metadata = backend.make_metadata(ROWS)
        assert {b.tensor.device for b in metadata.buffers()} == {dev1}, f"backend '{name}': metadata not on cuda:1"
        with torch.cuda.device(current):
            for seed in range(3):  # the first call binds and specialises; later ones reuse
                q, kv, idx = _inputs(ROWS, dev1, torch.bfloat16, seed)
                backend.plan(metadata, idx)
                out, lse = backend.forward(q, kv, metadata)
                assert torch.cuda.current_device() == current, f"backend '{name}' changed the current device"
                torch.cuda.synchronize(dev1)
                _assert_reference(name, q, kv, idx, backend.sm_scale, out, lse)


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_cross_device_calls_are_refused(on_gpu0):
    platform0 = current_platform().on_device(0)
    for name in _gpu_backends(on_gpu0):
        backend = _backend(name, platform0, torch.bfloat16)
        metadata = backend.make_metadata(ROWS)  # on cuda:0
        q, kv, idx = _inputs(ROWS, torch.device("cuda", 1), torch.bfloat16)
        with pytest.raises(ValueError, match=r"plan: indices are on cuda:1 but the metadata is on cuda:0"):
            backend.plan(metadata, idx)
        backend.plan(metadata, idx.cpu())  # host indices are copied in
        with pytest.raises(ValueError, match=rf"{name}: q is on cuda:1, kv on cuda:1, metadata on cuda:0"):
            backend.forward(q, kv, metadata)


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("rules", ["cuda", "hip"])
@pytest.mark.parametrize("mode", ["full", "breakable"])
def test_runner_captures_and_replays_on_cuda1(monkeypatch, rules, mode):
    monkeypatch.setenv("GRAPHATTN_PLATFORM", rules)
    reset_platform_cache()
    try:
        with torch.cuda.device(0):
            platform, dev1 = current_platform().on_device(1), torch.device("cuda", 1)
            for name in _gpu_backends(platform):
                backend = _backend(name, platform, torch.bfloat16)
                metadata = backend.make_metadata(8)
                _, kv, _ = _inputs(1, dev1, torch.bfloat16)
                attention = eager_on_graph(backend.forward, out="out")

                def step(q):
                    out, lse = attention(q * 1, kv, metadata)  # a copy before, a copy after the break
                    return out * 1, lse * 1

                static = torch.zeros(8, HEADS, 576, dtype=torch.bfloat16, device=dev1)
                runner = GraphRunner(step, {"q": static}, metadata=metadata, buckets=[2, 8],
                                     mode=mode, platform=platform)
                backend.plan(metadata, _inputs(8, dev1, torch.bfloat16)[2])
                runner.capture()
                assert all(g.device == dev1 for g in runner.graphs.values())
                for seed, rows in enumerate((3, 8, 1)):
                    q, _, idx = _inputs(rows, dev1, torch.bfloat16, seed + 10)
                    backend.plan(metadata, idx, pad_to=runner.bucket_for(rows))
                    out, lse = runner.run(q=q)
                    assert torch.cuda.current_device() == 0
                    torch.cuda.synchronize(dev1)
                    _assert_reference(f"{name}/{rules}/{mode}", q, kv, idx, backend.sm_scale, out, lse)
                with pytest.raises(ValueError, match=r"input 'q' must be .* on cuda:1 .* got .* on cuda:0"):
                    runner.run(q=q.to("cuda:0"))
    finally:
        reset_platform_cache()


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_sanitizer_catches_a_freed_buffer_on_cuda1(on_gpu0):
    dev1 = torch.device("cuda", 1)
    x = torch.ones(1024, device=dev1)
    graph = BreakableGraph(on_gpu0, sanitize=True, device=dev1)
    graph.capture(lambda: x * 2)
    graph.replay()
    del x
    torch.cuda.empty_cache()
    with pytest.raises(FreedCaptureBufferError):
        graph.replay()


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_buffers_stay_on_their_gpu_when_the_current_one_changes():
    with torch.cuda.device(1):
        md = GraphMetadata(2, HEADS, TOPK, torch.bfloat16, "cuda", padded_heads=64)  # "cuda" = cuda:1 now
    with torch.cuda.device(0):
        md.reserve(16)  # grows before capture: must stay on cuda:1
    assert {b.tensor.device for b in md.buffers()} == {torch.device("cuda", 1)}


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("op", ["sparse_mla_mega", "sparse_mla_trtllm", "sparse_mla_flashmla"])
def test_kernel_ops_launch_on_the_tensors_device(op, on_gpu0):
    from graphattn.kernels import register_ops, split_plan

    register_ops()

    path = {"sparse_mla_mega": "mega", "sparse_mla_trtllm": "trtllm", "sparse_mla_flashmla": "flashmla"}[op]
    heads = HEADS  # every path, flashmla too, reads q unpadded
    dev1 = torch.device("cuda", 1)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(ROWS, heads, 576, generator=gen).to(dev1, torch.bfloat16)
    kv = torch.randn(POOL, 576, generator=gen).to(dev1, torch.bfloat16)
    idx = torch.randint(0, POOL, (ROWS, TOPK), generator=gen).to(dev1, torch.int32)
    md = GraphMetadata(ROWS, heads, TOPK, torch.bfloat16, dev1, **split_plan(path, heads, TOPK).metadata_kwargs())
    fn = getattr(torch.ops.graphattn, op)
    extra = {"mega": lambda: (), "flashmla": lambda: md.workspace_for(ROWS),
             "trtllm": lambda: (md.counter_for(ROWS), *md.workspace_for(ROWS))}[path]()
    out, lse = fn(q, kv, idx, 576**-0.5, *extra)
    torch.cuda.synchronize(dev1)
    assert torch.cuda.current_device() == 0
    _assert_reference(op, q, kv, idx, 576**-0.5, out, lse)


# -- the conformance suite on a device ------------------------------------------------------------
def test_suite_runs_on_the_device_it_is_given():
    proc = _run_suite("--graphattn-backend", "torch", "--graphattn-device", "cpu" if not torch.cuda.is_available()
                      else "cuda:0", "-k", "decode")
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout + proc.stderr


def test_suite_refuses_a_device_this_process_does_not_have():
    proc = _run_suite("--graphattn-backend", "torch", "--conformance-device", "cuda:7")  # the old spelling
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4 and "--graphattn-device cuda:7: " in out, out  # 4: pytest's usage error


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_suite_runs_every_backend_on_cuda1():
    proc = _run_suite("--graphattn-device", "cuda:1", "-k", "decode or prefill_chunk")
    assert proc.returncode == 0 and " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout + proc.stderr
