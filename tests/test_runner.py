"""GraphRunner on the CPU emulator (and under HIP rules): buckets, padding, eager fallback."""

from __future__ import annotations

import logging

import pytest
import torch

from graphattn.common import CapturedBufferGrowthError, GraphMetadata
from graphattn.graphs import GraphRunner, default_buckets, eager_on_graph

D, K, POOL, MAX_ROWS = 8, 4, 32, 24
SENTINEL = 12345.0


pytestmark = pytest.mark.usefixtures("cpu_platform")


@eager_on_graph
def normalize(o: torch.Tensor) -> torch.Tensor:
    """A break in breakable mode; captured inline in full mode."""
    return o / (o.norm(dim=1, keepdim=True) + 1)


def make_step(kv: torch.Tensor, meta: GraphMetadata):
    """Sparse gather-attend stand-in: rows with only −1 indices give exactly 0."""

    def step(q: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        # q [rows, D] f32, indices [rows, K] int32 into kv [POOL, D], −1 = skip -> [rows, D]
        counter = meta.counter_for(q.shape[0])
        counter.add_(1)
        valid = (indices >= 0).unsqueeze(-1)
        gathered = kv[indices.clamp(min=0).long()] * valid  # [rows, K, D]
        out = normalize(gathered.sum(1) * q) * counter[:, :1].to(q.dtype)
        counter.zero_()
        return out

    return step


def random_step(rows: int) -> dict[str, torch.Tensor]:
    indices = torch.randint(0, POOL, (rows, K), dtype=torch.int32)
    indices[torch.rand(rows, K) < 0.25] = -1
    return {"q": torch.randn(rows, D), "indices": indices}


def make_runner(mode: str, buckets=None, **kw):
    kv = torch.randn(POOL, D)
    meta = GraphMetadata(MAX_ROWS, 1, K, torch.float32, "cpu", counter_cols=2, d_qk=D, d_v=D)
    static = {"q": torch.randn(MAX_ROWS, D), "indices": torch.zeros(MAX_ROWS, K, dtype=torch.int32)}
    step = make_step(kv, meta)
    runner = GraphRunner(step, static, {"indices": -1}, meta, buckets, mode, **kw)
    return runner, step, meta


def test_default_buckets_follow_serving_engines():
    assert default_buckets(1) == [1]
    assert default_buckets(3) == [1, 2, 3]
    assert default_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert default_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    with pytest.raises(ValueError):
        default_buckets(0)


@pytest.mark.parametrize("mode", ["full", "breakable"])
def test_shrinking_and_growing_batches_match_eager(platform_name, mode):
    runner, step, meta = make_runner(mode)
    runner.capture()
    assert sorted(runner.graphs) == default_buckets(MAX_ROWS)
    assert meta.captured
    breaks = {b: g.num_breaks for b, g in runner.graphs.items()}
    assert set(breaks.values()) == {1 if mode == "breakable" else 0}, breaks
    victims: list[torch.Tensor] = []
    for rows in [24, 3, 17, 1, 9, 24, 2, 16, 5]:
        live = random_step(rows)
        bucket = runner.bucket_for(rows)
        out = runner.run(**live).clone()
        torch.testing.assert_close(out, step(**live), msg=f"{mode} rows={rows} bucket={bucket}")
        full = runner.graphs[bucket].out  # padding rows [rows:bucket] are inert: exactly 0
        assert torch.count_nonzero(full[rows:bucket]) == 0, f"padding rows written, rows={rows}"
        assert bool((runner.static["indices"][rows:bucket] == -1).all())
        for v in victims:
            assert bool((v == SENTINEL).all()), "a victim allocated after a replay was overwritten"
        victims.append(torch.full((rows, D), SENTINEL))


@pytest.mark.parametrize("mode", ["full", "breakable"])
def test_inputs_written_into_the_static_tensors_are_not_copied(platform_name, mode, monkeypatch):
    runner, step, meta = make_runner(mode)
    runner.capture()
    copied: list[int] = []
    real_copy = torch._foreach_copy_

    def recording_copy(dst, src, *args, **kwargs):
        copied.append(len(dst))
        return real_copy(dst, src, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", recording_copy)
    for rows, in_place in [(5, ("q", "indices")), (24, ("q",)), (3, ("indices",)), (9, ())]:
        live = random_step(rows)
        expected = step(**live)
        args = {}
        for name, t in live.items():  # an engine writing its inputs where the graph reads them
            args[name] = runner.static[name][:rows].copy_(t) if name in in_place else t
        copied.clear()
        torch.testing.assert_close(runner.run(**args), expected, msg=f"{mode} rows={rows} in place {in_place}")
        assert copied == ([2 - len(in_place)] if len(in_place) < 2 else []), (mode, rows, in_place, copied)


def test_rows_above_the_largest_bucket_run_eagerly(platform_name):
    runner, step, meta = make_runner("full", buckets=[1, 2, 4, 8])
    runner.capture()
    assert runner.bucket_for(9) is None and runner.bucket_for(8) == 8
    live = random_step(MAX_ROWS + 6)  # above the metadata too: a temporary counter is used
    torch.testing.assert_close(runner.run(**live), step(**live))
    live = random_step(5)
    torch.testing.assert_close(runner.run(**live), step(**live))


def test_capture_is_largest_first_with_progress_and_logs(platform_name, caplog):
    seen = []
    runner, _, meta = make_runner(
        "full", progress=lambda done, total, b, s: seen.append((done, total, b)), log_every=2
    )
    with caplog.at_level(logging.INFO, logger="graphattn.graphs.runner"):
        runner.capture()
    buckets = default_buckets(MAX_ROWS)
    assert [b for _, _, b in seen] == sorted(buckets, reverse=True)
    assert seen[-1][:2] == (len(buckets), len(buckets))
    lines = [r.getMessage() for r in caplog.records if "graph capture" in r.getMessage()]
    assert len(lines) == (len(buckets) + 1) // 2, lines
    with pytest.raises(CapturedBufferGrowthError, match="multi_cta_counter"):
        meta.reserve(MAX_ROWS * 2)  # the first capture marked the metadata


def test_runner_validates_its_arguments():
    static = {"q": torch.randn(8, D), "indices": torch.zeros(4, K, dtype=torch.int32)}
    with pytest.raises(ValueError, match="dim 0"):
        GraphRunner(lambda **kw: kw["q"], static)
    with pytest.raises(ValueError, match="mode"):
        GraphRunner(lambda q: q, {"q": torch.randn(4, D)}, mode="partial")
    with pytest.raises(ValueError, match="buckets"):
        GraphRunner(lambda q: q, {"q": torch.randn(4, D)}, buckets=[2, 8])
    with pytest.raises(ValueError, match="pad_values"):
        GraphRunner(lambda q: q, {"q": torch.randn(4, D)}, {"k": 0})
    runner = GraphRunner(lambda q: q * 2, {"q": torch.randn(4, D)})
    with pytest.raises(ValueError, match="expects inputs"):
        runner.run(x=torch.randn(2, D))
    with pytest.raises(RuntimeError, match="before capture"):
        runner.run(q=torch.randn(2, D))
