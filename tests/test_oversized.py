"""Issue 13: oversized eager steps after capture, the runner padding its own plan, the
``q_pad_captured`` mark, a backend's own ``platform=`` and one memory pool for all buckets.

Every numeric check is against the float64 reference with the dtype's tolerance, on outputs
poisoned with NaN first; every failure message names the backend.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from graphattn.backends import builtin_backends, get_backend_class
from graphattn.backends.torch_ref import TorchBackend
from graphattn.common import CaptureCapacityError, GraphMetadata, sparse_mla_reference
from graphattn.common.capture import capture_scope
from graphattn.common.platform import current_platform
from graphattn.common.tolerances import tolerance
from graphattn.graphs import GraphRunner
from graphattn.hip.launch import AmdLaunchTable
from graphattn.hip.platform import HipPlatform
from graphattn.kernels.plan import split_plan
from graphattn.testing.graph_checks import check_shared_pool

DTYPE = torch.float16  # the Triton interpreter's dtype on the CPU
HEADS, TOPK, POOL = 8, 24, 64
RESERVED, BUCKETS = 3, (1, 2)


@functools.lru_cache(maxsize=None)
def kv_pool() -> torch.Tensor:
    """``[POOL, 576]`` shared KV pool (fixed seed: independent of test order)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(POOL, 576, generator=gen).to(current_platform().device, DTYPE)


def step_inputs(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [rows, HEADS, 576]`` and ``indices [rows, TOPK]`` int32 with some −1 entries."""
    dev = current_platform().device
    q = (torch.randn(rows, HEADS, 576) * 3).to(dev, DTYPE)
    idx = torch.stack([torch.randperm(POOL)[:TOPK] for _ in range(rows)]).to(torch.int32)
    idx[:, ::5] = -1
    return q, idx.to(dev)


def check_reference(name: str, what: str, q, idx, out, lse, sm_scale: float) -> None:
    ref_out, ref_lse = sparse_mla_reference(q, kv_pool(), idx, sm_scale)
    tol = tolerance(DTYPE)
    torch.testing.assert_close(out.double(), ref_out, atol=tol.atol, rtol=tol.rtol,
                               msg=lambda m: f"backend '{name}' {what}: out {m}")
    torch.testing.assert_close(lse.double(), ref_lse, atol=tol.lse_atol, rtol=tol.lse_rtol,
                               msg=lambda m: f"backend '{name}' {what}: lse {m}")


def captured_runner(name: str, platform=None):
    """A backend, its metadata for RESERVED rows, and a full-graph runner over BUCKETS."""
    backend = get_backend_class(name)(HEADS, TOPK, DTYPE, platform=platform)
    md = backend.make_metadata(RESERVED)
    dev = backend.platform.device
    static = torch.zeros(max(BUCKETS), HEADS, 576, dtype=DTYPE, device=dev)
    runner = GraphRunner(lambda q: backend.forward(q, kv_pool(), md), {"q": static}, metadata=md,
                         buckets=list(BUCKETS), platform=platform)
    runner.capture()
    return backend, md, runner


def snapshot(md: GraphMetadata) -> dict[str, tuple[int, torch.Tensor]]:
    """Address and contents of every row-sized captured buffer (the workspace is scratch)."""
    bufs = [b for b in (md.q_pad, md.counter, md.indices) if b is not None]
    return {b.name: (b.data_ptr(), b.tensor.clone()) for b in bufs}


@pytest.mark.parametrize("name", builtin_backends())
def test_oversized_eager_step_runs_on_temporaries(name, caplog):
    backend, md, runner = captured_runner(name)
    before = snapshot(md)
    with caplog.at_level(logging.INFO, logger="graphattn.common.metadata"):
        for rows in (RESERVED + 2, RESERVED + 1, RESERVED + 2):
            q, idx = step_inputs(rows)
            backend.plan(md, idx)
            assert md.oversized and md.num_planned_rows == rows > md.capacity, name
            out, lse = runner.run(q=q)  # above every bucket: eager
            check_reference(name, f"oversized eager step of {rows} rows", q, idx, out, lse, backend.sm_scale)
            if md.counter is not None:
                assert int(md.counter.tensor.abs().sum()) == 0, f"backend '{name}': counter not reset"
    logged = [r for r in caplog.records if "exceeds the" in r.getMessage()]
    assert len(logged) == 1, f"backend '{name}': expected one log line per metadata, got {len(logged)}"
    for buf_name, (ptr, data) in snapshot(md).items():
        assert ptr == before[buf_name][0], f"backend '{name}': '{buf_name}' replaced by an oversized step"
        assert torch.equal(data, before[buf_name][1]), f"backend '{name}': '{buf_name}' written by an oversized step"
    assert all(key[1] <= md.capacity for key in md._bound.current()), (
        f"backend '{name}': a bound launch call was kept for rows beyond the capacity: {list(md._bound.current())}")
    for rows in (2, 1, RESERVED):  # replays and a within-capacity eager step still work
        q, idx = step_inputs(rows)
        backend.plan(md, idx)
        assert not md.oversized
        out, lse = runner.run(q=q)
        check_reference(name, f"step of {rows} rows after oversized steps", q, idx, out, lse, backend.sm_scale)


@pytest.mark.parametrize("name", builtin_backends())
def test_oversized_step_inside_a_capture_raises(name):
    backend, md, _ = captured_runner(name)
    q, idx = step_inputs(RESERVED + 1)
    with capture_scope(), pytest.raises(CaptureCapacityError, match="'indices'"):
        backend.plan(md, idx)
    backend.plan(md, idx)  # eager: planned on a temporary table
    with capture_scope(), pytest.raises(CaptureCapacityError):
        backend.forward(q, kv_pool(), md)


def test_oversized_step_refuses_another_row_count():
    backend, md, runner = captured_runner("torch")
    q, idx = step_inputs(RESERVED + 2)
    backend.plan(md, idx)
    with pytest.raises(ValueError, match=r"planned step has 5 rows .* a call came with 4 rows"):
        backend.forward(q[:4], kv_pool(), md)
    with pytest.raises(ValueError, match="planned step has 5 rows"):
        runner.run(q=q[:2])  # a bucket would replay on the captured table's stale rows


def test_q_pad_captured_is_false_without_a_q_pad_buffer():
    md = GraphMetadata(4, 8, 16, DTYPE, "cpu", counter_cols=1)
    md.mark_captured()
    assert md.captured and not md.q_pad_captured
    md = GraphMetadata(4, 8, 16, DTYPE, "cpu", padded_heads=64)
    assert not md.q_pad_captured
    md.mark_captured()
    assert md.q_pad_captured


@pytest.mark.parametrize("name", builtin_backends())
def test_runner_pads_the_plan_to_its_bucket(name):
    # Engines plan the live rows only: run() makes the bucket's padding rows inert itself.
    backend, md, runner = captured_runner(name)
    for rows in (2, 1, 2, 1):
        q, idx = step_inputs(rows)
        backend.plan(md, idx)  # no pad_to
        out, lse = runner.run(q=q)
        bucket = runner.bucket_for(rows)
        assert md.num_planned_rows == bucket, f"backend '{name}': plan not padded to bucket {bucket}"
        assert torch.all(md.indices.tensor[rows:bucket] == -1), f"backend '{name}': padding rows not inert"
        check_reference(name, f"replay of {rows} rows planned without pad_to", q, idx, out, lse, backend.sm_scale)
    q, idx = step_inputs(1)
    backend.plan(md, idx, pad_to=2)  # the old call keeps working
    check_reference(name, "replay planned with pad_to", q, idx, *runner.run(q=q), backend.sm_scale)


def test_extend_plan_fills_only_rows_a_larger_step_wrote():
    md = GraphMetadata(8, 4, 4, DTYPE, "cpu")
    md.refresh_(torch.arange(24, dtype=torch.int32).view(6, 4))
    md.refresh_(torch.zeros(2, 4, dtype=torch.int32))
    md.extend_plan_(4)
    assert md.num_planned_rows == 4 and torch.all(md.indices.tensor[2:4] == -1)
    assert torch.all(md.indices.tensor[4:6] >= 0), "rows past the bucket need no fill yet"
    md.extend_plan_(8)
    assert torch.all(md.indices.tensor[2:] == -1)
    md.extend_plan_(3)  # already planned for more rows: nothing to do
    assert md.num_planned_rows == 8


def hip_platform() -> HipPlatform:
    """HIP's rules with AMD's gfx942 launch table, on this machine (no environment variable)."""
    return HipPlatform(launch_table=AmdLaunchTable("gfx942"))


@pytest.mark.parametrize("name", ["flashmla", "trtllm", "flashmla_mega"])
def test_backend_honours_its_platform_object(name):
    hip = hip_platform()
    assert current_platform() is not hip
    backend, md, runner = captured_runner(name, platform=hip)
    heads = HEADS  # every Triton kernel reads q unpadded
    assert backend.padded_heads is None and md.q_pad is None, f"backend '{name}': q padded"
    plan = backend.launch_plan(md, 2)
    amd_cfg = hip.kernel_config(backend.kernel_spec.name, rows=2, heads=heads, topk=TOPK)
    assert "waves_per_eu" in plan.main.kwargs, f"backend '{name}': not HIP's launch settings: {plan.main.kwargs}"
    assert plan.main.kwargs["BLOCK_H"] == amd_cfg["BLOCK_H"], f"backend '{name}': {plan.main.kwargs}"
    want = split_plan(backend.kernel_spec.name, heads, TOPK, hip)
    if want.max_partials:
        assert md.workspace_out.capacity == want.max_partials, f"backend '{name}': workspace not sized for HIP"
    seg = runner.graphs[max(BUCKETS)].segments[0]
    assert type(seg).platform is hip, f"backend '{name}': the graph segment ignored the platform object"
    for rows in (2, 1, RESERVED + 1):
        q, idx = step_inputs(rows)
        backend.plan(md, idx)
        check_reference(name, f"HIP platform object, {rows} rows", q, idx, *runner.run(q=q), backend.sm_scale)


class PaddingTorch(TorchBackend):
    """A backend that declares ``pads_q`` (none of the built-in ones does any more)."""

    name = "padding_torch"
    pads_q = True


def test_padded_heads_follow_the_platform_object():
    class WidePad(HipPlatform):
        head_pad_multiple = 128

    backend = PaddingTorch(HEADS, TOPK, DTYPE, platform=WidePad())
    assert backend.padded_heads == 128 and backend.make_metadata(2).q_pad.tensor.shape[1] == 128
    assert backend.capabilities(WidePad())["pad_multiple"] == 128
    flashmla = get_backend_class("flashmla")(HEADS, TOPK, DTYPE, platform=WidePad())
    assert flashmla.padded_heads is None and flashmla.make_metadata(2).q_pad is None, "flashmla pads q"


class PoolPerBucketRunner(GraphRunner):
    """A runner that gives every bucket its own pool (works, but graph memory grows with the
    number of buckets): the shared-pool check must fail it."""

    def _capture_bucket(self, bucket: int) -> tuple[float, int]:
        self.pool = None
        return super()._capture_bucket(bucket)


def test_buckets_share_one_pool_and_a_pool_per_bucket_fails():
    _, md, runner = captured_runner("torch")
    check_shared_pool(runner, "backend 'torch'")
    backend = get_backend_class("torch")(HEADS, TOPK, DTYPE)
    md = backend.make_metadata(RESERVED)
    static = torch.zeros(max(BUCKETS), HEADS, 576, dtype=DTYPE, device=backend.platform.device)
    bad = PoolPerBucketRunner(lambda q: backend.forward(q, kv_pool(), md), {"q": static},
                              metadata=md, buckets=list(BUCKETS))
    bad.capture()
    with pytest.raises(AssertionError, match="2 memory pools"):
        check_shared_pool(bad, "backend 'torch'")
