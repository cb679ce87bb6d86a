"""Graph-mode conformance: capture buckets with GraphRunner, then shrink, grow, flush and replay.

A step is ``copy -> attention -> copy``: the copies stand in for the projections around
attention in a model layer, so in ``breakable`` mode the attention break sits between two
captured segments and its output must be written back where the second segment reads it.
"""

from __future__ import annotations

import torch

from ..common.metadata import D_QK, GraphMetadata
from ..graphs import GraphRunner, eager_on_graph
from .case import SENTINEL, CaseContext, assert_matches_reference, check_counter_clean


def run_graph_case(ctx: CaseContext, sanitize: bool = True) -> None:
    """Capture every bucket, then run the spec's steps (replays, and eager calls past the
    largest bucket) with a cache flush, victims and the sanitizer around every replay."""
    backend, spec, platform = ctx.backend, ctx.spec, ctx.platform
    max_bucket = max(ctx.shape.buckets)
    # Reserve in query rows for the largest bucket AND the largest eager chunk, before capture.
    metadata = backend.make_metadata(max(max_bucket, spec.max_rows))
    kv = ctx.kv_cache()  # [pool, 576] or [pool, 656] uint8 FP8 tokens
    attention = eager_on_graph(backend.forward)  # a break in breakable mode, inline in full

    def step(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_in = q.clone()  # [bucket, H, 576]: written by the segment before the break
        out, lse = attention(q_in, kv, metadata)
        return out.clone(), lse.clone()  # read by the segment after the break

    static_q = torch.zeros(max_bucket, spec.num_heads, D_QK, dtype=backend.dtype, device=platform.device)
    runner = GraphRunner(
        step, {"q": static_q}, {"q": 0.0}, metadata=metadata,
        buckets=list(ctx.shape.buckets), mode=ctx.mode, sanitize=sanitize,
    )
    ctx.plan(metadata, ctx.indices(max_bucket))
    runner.capture()
    assert metadata.captured, f"{ctx.label}: GraphRunner.capture() did not mark the metadata"
    check_shared_pool(runner, ctx.label)
    held = _held_tensor_sizes(backend, metadata)
    addresses = _buffer_addresses(metadata)
    for i, rows in enumerate(spec.steps):
        q = ctx.query(rows)
        indices = ctx.indices(rows)
        ctx.plan(metadata, indices)  # host side, outside the graph; the runner pads it
        platform.empty_cache()  # hand freed blocks back, so a stale address gets reused
        victims = [torch.full((n,), SENTINEL, dtype=torch.uint8, device=platform.device) for n in held]
        out, lse = runner.run(q=q)
        platform.synchronize()
        assert_matches_reference(ctx, i, q, kv, indices, out, lse)
        _check_victims(ctx, i, victims)
        check_counter_clean(ctx, metadata, i)
        _check_not_moved(ctx, i, metadata, addresses)


def check_shared_pool(runner: GraphRunner, label: str) -> None:
    """Assert every captured segment of every bucket shares one memory pool: a runner that gives
    each bucket its own pool works, but its graph memory grows with the number of buckets."""
    pools = runner.pools()
    distinct = [p for i, p in enumerate(pools) if all(p is not q for q in pools[:i])]
    assert len(distinct) == 1, (
        f"{label}: {len(runner.graphs)} bucket graphs captured into {len(distinct)} memory pools "
        f"(expected one shared pool: pass the first graph's pool to every later capture)"
    )


def _held_tensor_sizes(backend, metadata: GraphMetadata) -> list[int]:
    """Byte sizes of every tensor the backend object and the metadata hold at capture time.

    A backend that later rebinds one of them frees a block of exactly this size; a victim of
    the same size then receives it from the caching allocator (as reproduced on the H200).
    """
    sizes = {b.nbytes() for b in metadata.buffers()}
    for value in vars(backend).values():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for t in items:
            if isinstance(t, torch.Tensor):
                sizes.add(t.numel() * t.element_size())
    return sorted(n for n in sizes if n > 0)


def _buffer_addresses(metadata: GraphMetadata) -> dict[str, int]:
    return {b.name: b.data_ptr() for b in metadata.buffers()}


def _check_victims(ctx: CaseContext, step: int, victims: list[torch.Tensor]) -> None:
    for v in victims:
        bad = int((v != SENTINEL).sum())
        assert bad == 0, (
            f"{ctx.label} step {step}: a replay wrote {bad} bytes into a {v.numel()}-byte victim "
            f"tensor allocated after capture: the graph wrote through a freed buffer's address"
        )


def _check_not_moved(ctx: CaseContext, step: int, metadata: GraphMetadata, addresses: dict[str, int]) -> None:
    now = _buffer_addresses(metadata)
    moved = [name for name, ptr in addresses.items() if now.get(name) != ptr]
    assert not moved, (
        f"{ctx.label} step {step}: captured metadata buffers {moved} were replaced after capture "
        f"(a graph holds their old address)"
    )
    if metadata.q_pad is not None:
        assert metadata.q_pad_captured, (
            f"{ctx.label} step {step}: the q_pad_captured mark was lost after refresh/replay"
        )
