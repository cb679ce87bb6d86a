"""Real CUDA graphs (and HIP's rules forced onto them): buckets, flushes, victims, sanitizer.

Every test runs twice: with ``GRAPHATTN_PLATFORM=cuda`` (CudaGraphSegment) and with
``GRAPHATTN_PLATFORM=hip`` (HipGraphSegment on NVIDIA hardware). The "kernels" are torch ops:
a q-pad copy + matmul, a counter add + reset, and an index gather with −1 padding.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

from graphattn.common import FreedCaptureBufferError, GraphMetadata
from graphattn.common.platform import current_platform, reset_platform_cache
from graphattn.graphs import BreakableGraph, GraphRunner, default_buckets, eager_on_graph

pytestmark = pytest.mark.gpu

H, PH, D, E, K, POOL, COLS = 3, 64, 64, 32, 8, 256, 4
MAX_BUCKET, META_ROWS = 64, 96
SENTINEL = 12345.0
TOL = dict(atol=1e-4, rtol=1e-4)  # fp32; bucket shapes may pick other GEMM tiles than eager


@pytest.fixture(params=["cuda", "hip"])
def platform_name(request, monkeypatch):
    """Real CUDA graph segments, and HIP's segment rules forced onto NVIDIA hardware."""
    monkeypatch.setenv("GRAPHATTN_PLATFORM", request.param)
    reset_platform_cache()
    assert current_platform().has_gpu
    yield request.param
    monkeypatch.undo()
    reset_platform_cache()


def _meta(rows: int = META_ROWS) -> GraphMetadata:
    return GraphMetadata(
        rows, H, K, torch.float32, "cuda", padded_heads=PH, counter_cols=COLS, d_qk=D, d_v=E
    )


@eager_on_graph
def renorm(o: torch.Tensor) -> torch.Tensor:
    """A break (breakable mode) or inline op (full mode)."""
    return o / (o.abs().amax(dim=(1, 2), keepdim=True) + 1)


def make_step(meta: GraphMetadata, kv: torch.Tensor, w: torch.Tensor):
    def step(q: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        # q [rows, H, D] f32; indices [rows, K] int32 into kv [POOL, D], −1 = skip.
        rows = q.shape[0]
        qp = meta.zero_padded_q(q)  # [rows, PH, D], padding heads zero
        counter = meta.counter_for(rows)  # [rows, COLS] int32 zeros
        counter.add_(1)
        valid = (indices >= 0).unsqueeze(-1)
        ctx = (kv[indices.clamp(min=0).long()] * valid).sum(1)  # [rows, D]
        out = (qp + ctx.unsqueeze(1)) @ w  # [rows, PH, E]
        out = out * (counter.sum(1) / COLS).view(rows, 1, 1)
        counter.zero_()
        out = renorm(out[:, :H])
        return out * valid.any(1).view(rows, 1, 1)  # padded rows are exactly 0

    return step


def random_live(rows: int) -> dict[str, torch.Tensor]:
    indices = torch.randint(0, POOL, (rows, K), dtype=torch.int32, device="cuda")
    indices[torch.rand(rows, K, device="cuda") < 0.2] = -1
    return {"q": torch.randn(rows, H, D, device="cuda"), "indices": indices}


def make_runner(mode: str, sanitize: bool = False, meta: GraphMetadata | None = None):
    meta = meta if meta is not None else _meta()
    kv, w = torch.randn(POOL, D, device="cuda"), torch.randn(D, E, device="cuda")
    static = {
        "q": torch.randn(MAX_BUCKET, H, D, device="cuda"),
        "indices": torch.zeros(MAX_BUCKET, K, dtype=torch.int32, device="cuda"),
    }
    step = make_step(meta, kv, w)
    runner = GraphRunner(step, static, {"indices": -1}, meta, mode=mode, sanitize=sanitize)
    return runner, step, meta


@pytest.mark.parametrize("mode", ["full", "breakable"])
def test_random_batches_with_flushes_and_victims(platform_name, mode):
    runner, step, meta = make_runner(mode)
    runner.capture()
    assert meta.captured and sorted(runner.graphs) == default_buckets(MAX_BUCKET)
    seg = runner.graphs[MAX_BUCKET].segments[0]
    assert type(seg).__name__ == ("HipGraphSegment" if platform_name == "hip" else "CudaGraphSegment")
    rng = random.Random(1234)
    sizes = [64, 1, 33, 2, 64, 17, 80, 9, 40, 3] + [rng.randint(1, MAX_BUCKET) for _ in range(20)]
    victims: list[torch.Tensor] = []
    for rows in sizes:  # shrinks and grows; 80 runs eagerly (above the largest bucket)
        live = random_live(rows)
        out = runner.run(**live).clone()
        torch.cuda.synchronize()
        expected = step(**live)
        torch.testing.assert_close(out, expected, **TOL, msg=f"{platform_name}/{mode} rows={rows}")
        bucket = runner.bucket_for(rows)
        if bucket is not None:
            padded = runner.graphs[bucket].out[rows:bucket]
            assert torch.count_nonzero(padded) == 0, f"padding rows not inert at rows={rows}"
        for v in victims:
            assert bool((v == SENTINEL).all()), f"victim overwritten (rows={rows}): stale graph write"
        torch.cuda.empty_cache()  # flush: freed blocks go back to the driver
        victims += [torch.full((n,), SENTINEL, device="cuda") for n in (meta.q_pad.nbytes() // 4, rows * E)]
    assert int(meta.counter.tensor.abs().sum()) == 0, "counter not reset to zero"


def test_breakable_graph_two_breaks_on_real_graphs(platform_name):
    @eager_on_graph
    def scale_by_max(y):
        return y / y.abs().max().item()  # host read-back: only legal in a break

    @eager_on_graph
    def sort_rows(z):
        return torch.sort(z, dim=1).values

    def fn(x, w):
        return sort_rows(torch.tanh(scale_by_max(x @ w))) * 2

    x, w = torch.randn(16, 32, device="cuda"), torch.randn(32, 8, device="cuda")
    graph = BreakableGraph()
    graph.warmup(fn, x, w)  # as engines do: library handles and workspaces exist before capture
    out = graph.capture(fn, x, w)
    assert (graph.num_segments, graph.num_breaks) == (3, 2)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        w.copy_(torch.randn_like(w))
        out.fill_(float("nan"))
        torch.cuda.empty_cache()
        torch.testing.assert_close(graph.replay(), fn(x, w), **TOL)


class RebindingCounterBackend:
    """docs/design.md bug 1: rebinds the captured counter when an eager call needs more rows."""

    def __init__(self, rows: int):
        self.multi_cta_counter = torch.zeros(rows, COLS, dtype=torch.int32, device="cuda")

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.multi_cta_counter.shape[0]:
            self.multi_cta_counter = torch.zeros(x.shape[0], COLS, dtype=torch.int32, device="cuda")
        c = self.multi_cta_counter[: x.shape[0]]
        c.add_(1)
        out = (x @ w) * (c.sum(1, keepdim=True) / COLS)
        c.zero_()
        return out


class StepMetadata:
    q_pad_buffer: torch.Tensor | None = None


def replacing_qpad_forward(q: torch.Tensor, w: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
    """docs/design.md bug 2: a new q-pad buffer whenever the row count changes."""
    if meta.q_pad_buffer is None or meta.q_pad_buffer.shape[0] != q.shape[0]:
        meta.q_pad_buffer = torch.zeros(q.shape[0], PH, D, device="cuda")
    meta.q_pad_buffer[:, :H].copy_(q)
    return (meta.q_pad_buffer @ w)[:, :H]


def test_sanitizer_catches_wrong_objects_before_replay(platform_name):
    backend, w = RebindingCounterBackend(8), torch.randn(D, E, device="cuda")
    x = torch.randn(8, D, device="cuda")
    graph = BreakableGraph(sanitize=True)
    graph.warmup(backend.forward, x, w)
    out = graph.capture(backend.forward, x, w)
    torch.testing.assert_close(graph.replay(), x @ w, **TOL)
    backend.forward(torch.randn(200, D, device="cuda"), w)  # eager, bigger: rebinds
    gc.collect()
    torch.cuda.empty_cache()
    out.fill_(float("nan"))
    with pytest.raises(FreedCaptureBufferError, match="multi_cta_counter"):
        graph.replay()
    torch.cuda.synchronize()
    assert bool(out.isnan().all()), "the graph ran although the sanitizer refused the replay"

    meta = StepMetadata()
    runner = GraphRunner(
        lambda q: replacing_qpad_forward(q, w, meta),
        {"q": torch.randn(8, H, D, device="cuda")},
        buckets=[2, 4, 8],
        sanitize=True,
    )
    runner.capture()
    gc.collect()
    torch.cuda.empty_cache()
    with pytest.raises(FreedCaptureBufferError, match="q_pad"):
        runner.run(q=torch.randn(7, H, D, device="cuda"))


def test_sanitizer_is_off_by_default_in_production(platform_name, monkeypatch):
    monkeypatch.delenv("GRAPHATTN_SANITIZE", raising=False)
    graph = BreakableGraph()
    assert not graph.tracking, "real graphs must not pay for the sanitizer unless asked"


def test_one_qpad_buffer_for_all_buckets(platform_name):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    meta = _meta(MAX_BUCKET)
    meta_bytes = torch.cuda.memory_allocated() - before
    runner, *_ = make_runner("full", sanitize=True, meta=meta)
    before = torch.cuda.memory_allocated()
    runner.capture()
    torch.cuda.synchronize()
    graph_bytes = torch.cuda.memory_allocated() - before
    qpads = [s for s in runner.held_storages() if s.name == "q_pad"]
    largest = MAX_BUCKET * PH * D * 4
    per_bucket = sum(b * PH * D * 4 for b in runner.buckets)
    print(
        f"\n[{platform_name}] q-pad held by {len(runner.buckets)} bucket graphs: "
        f"{sum(s.nbytes for s in qpads)} bytes in {len(qpads)} buffer(s); one largest-bucket "
        f"buffer = {largest} bytes; a buffer per bucket would hold {per_bucket} bytes. "
        f"Metadata allocation {meta_bytes} bytes; graph pools (outputs, intermediates) "
        f"{graph_bytes} bytes"
    )
    assert len(qpads) == 1, [s.name for s in runner.held_storages()]
    assert qpads[0].nbytes == largest == meta.q_pad.nbytes()
    assert qpads[0].data_ptr == meta.q_pad.data_ptr()
    assert meta_bytes >= meta.nbytes()



def free_one_runner_replay_another(share_stream: bool) -> tuple[bool, float]:
    """Two runners whose step is a split-K-shaped cuBLAS matmul (``x [8, 32768] @ w [32768, 64]``
    bf16: small M and N, long K, the shape that takes cuBLAS's workspace); free the first
    (its graphs die), fill the memory freed with victims holding a sentinel, replay the
    second. Returns ``(victims untouched, max error of the replays)``. ``share_stream``: both
    runners capture on one stream, as every runner did before each got its own (the setting of
    pytorch/pytorch#193402: a graph's death frees its capture stream's cuBLAS workspaces)."""
    gen = torch.Generator("cuda").manual_seed(7)
    w = torch.randn(32768, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    make = lambda: GraphRunner(lambda x: x @ w, {"x": torch.zeros(8, 32768, device="cuda", dtype=torch.bfloat16)},
                               buckets=(8,), mode="full")
    a, b = make(), make()
    if share_stream:
        b._segment_class = a._segment_class
    a.capture()
    b.capture()
    x = torch.randn(8, 32768, device="cuda", dtype=torch.bfloat16, generator=gen)
    a.run(x=x)
    del a
    gc.collect()
    torch.cuda.synchronize()
    # Victims of the sizes a cuBLAS workspace takes (torch's default on Hopper, 32 MiB, and
    # smaller ones), enough to take back the blocks the dead runner's graph freed.
    victims = [torch.full((n // 4,), SENTINEL, device="cuda") for n in [32 << 20] * 2 + [4 << 20] * 8 + [1 << 20] * 16]
    err = 0.0
    for _ in range(20):
        x = torch.randn(8, 32768, device="cuda", dtype=torch.bfloat16, generator=gen)
        got = b.run(x=x).float()
        err = max(err, float((got - (x.float() @ w.float())).abs().max() / (x.float() @ w.float()).abs().max()))
    torch.cuda.synchronize()
    return all(bool((v == SENTINEL).all()) for v in victims), err


def test_freeing_one_runner_leaves_anothers_graphs_intact(platform_name):
    """Each runner captures on streams of its own, so freeing one cannot free a cuBLAS
    workspace another runner's graphs replay into: after the first dies, the second's replays
    stay right and memory handed out since is never written."""
    untouched, err = free_one_runner_replay_another(share_stream=False)
    assert untouched, f"{platform_name}: a replay wrote into memory a dead runner's graph had freed"
    assert err < 2e-2, f"{platform_name}: replays after the other runner died are off by {err:.3g}"
