"""Graph-mode conformance: capture buckets with GraphRunner, then shrink, grow, flush and replay.

A step is ``copy -> attention -> copy``: the copies stand in for the projections around
attention in a model layer, so in ``breakable`` mode the attention break sits between two
captured segments and its output must be written back where the second segment reads it.
Breaks are wired as README and ``graphattn bench`` wire them:
``eager_on_graph(forward, out="out", bind=backend.bind_break)`` where ``forward`` takes ``out``.
In ``breakable`` mode a spec with ``second_call`` then calls attention a second time, on
``-q[:1]`` (the next layer, one row): two breaks, each with its own out= pair and replay call,
and the first break's outputs must survive the second (not in an oversized step, whose plan
serves its own row count only, and not in ``full`` mode, where a second call of another row
count would let a backend that reallocates per row count free its buffer inside the capture,
out of sight). The step returns its copy of q as the calls left it: they must not write it.
"""

from __future__ import annotations

import torch

from ..backends.base import accepts_out
from ..common.metadata import D_QK, GraphMetadata
from ..graphs import GraphRunner, eager_on_graph
from .case import SENTINEL, CaseContext, Untouched, assert_matches_reference, check_counter_clean

BREAK_WIRING = ("breakable mode: attention is eager_on_graph(forward, out='out', bind=backend.bind_break) "
                "(without out= where forward does not take it), as README and graphattn bench wire it: "
                "every replay passes the captured (out, lse) through out= and runs bind_break's replay "
                "call; an out= pair left unwritten or a replay call returning the capture's results "
                "shows up here")
TWO_CALLS = ("the step calls attention twice (the second call, one row, stands for the next layer): "
             "the first break's outputs must not change when the second runs")


def run_graph_case(ctx: CaseContext, sanitize: bool = True) -> None:
    """Capture every bucket, then run the spec's steps (replays, and eager calls past the
    largest bucket and past the reserved rows) with a cache flush, victims and the sanitizer
    around every replay, kv and q checked bit for bit after each."""
    backend, spec, platform = ctx.backend, ctx.spec, ctx.platform
    max_bucket = max(ctx.shape.buckets)
    # Reserve in query rows for the largest bucket and the spec's reserve (the largest eager
    # chunk, unless the spec has steps past it: oversized), before capture.
    metadata = backend.make_metadata(max(max_bucket, spec.reserved_rows))
    kv = ctx.kv_cache()  # [pool, 576] or [pool, 656] uint8 FP8 tokens (a view if strided)
    kv_guard = Untouched("kv", "token", kv)
    out_kw = "out" if accepts_out(backend.forward) else None
    # A break in breakable mode, inline in full (and in eager steps).
    attention = eager_on_graph(backend.forward, out=out_kw, bind=getattr(backend, "bind_break", None))
    # Two breaks, each with its own out= pair and replay call (a spec's second_call).
    two_calls = ctx.mode == "breakable" and spec.second_call

    def step(q: torch.Tensor) -> tuple:
        # [bucket, H, 576] (a strided view of [bucket, H + 2, row] for a strided spec): written
        # by the segment before the first break.
        q_copy = q.clone()
        q_in = ctx.q_view(q_copy) if ctx.strided else q_copy
        out, lse = attention(q_in, kv, metadata)
        # q_copy is returned as it is after the calls: they must have left it alone.
        if not two_calls or metadata.oversized:  # oversized: a plan for exactly these rows
            return out.clone(), lse.clone(), q_copy  # read by the segment after the break
        rows = q_in.shape[0]
        out2, lse2 = attention(torch.neg(q_in[:1]), kv, metadata)  # the "next layer", one row
        # The one-row results expanded to the rows the runner slices its outputs to.
        return (out.clone(), lse.clone(), q_copy, out2.clone().expand(rows, -1, -1),
                lse2.clone().expand(rows, -1))

    if ctx.strided:
        static_q = ctx.q_storage(max_bucket).zero_()
    else:
        static_q = torch.zeros(max_bucket, spec.num_heads, D_QK, dtype=backend.dtype, device=platform.device)
    runner = GraphRunner(
        step, {"q": static_q}, {"q": 0.0}, metadata=metadata,
        buckets=list(ctx.shape.buckets), mode=ctx.mode, sanitize=sanitize,
    )
    ctx.plan(metadata, ctx.indices(max_bucket))
    runner.capture()
    assert metadata.captured, f"{ctx.label}: GraphRunner.capture() did not mark the metadata"
    kv_guard.check(ctx, "capture", "forward while capturing")
    check_shared_pool(runner, ctx.label)
    held = _held_tensor_sizes(backend, metadata)
    addresses = _buffer_addresses(metadata)
    for i, rows in enumerate(spec.steps):
        q = ctx.query(rows)
        indices = ctx.indices(rows)
        ctx.plan(metadata, indices)  # host side, outside the graph; the runner pads it
        platform.empty_cache()  # hand freed blocks back, so a stale address gets reused
        victims = [torch.full((n,), SENTINEL, dtype=torch.uint8, device=platform.device) for n in held]
        live = ctx.widen_q(q) if ctx.strided else q
        q_guard = Untouched("q", "row", live)
        res = runner.run(q=live)
        (out, lse, q_seen), (out2, lse2) = res[:3], (res[3:] or (None, None))
        platform.synchronize()
        eager = runner.bucket_for(rows) is None
        by = "forward (an eager step)" if eager else "a replay"
        kv_guard.check(ctx, i, by)
        q_guard.check_copy(ctx, i, by, q_seen)
        wiring = BREAK_WIRING if ctx.mode == "breakable" and not eager else ""
        note = "\n".join(n for n in (wiring, TWO_CALLS if out2 is not None else "") if n)
        assert_matches_reference(ctx, i, q, kv, indices, out, lse, note=note)
        if out2 is not None:
            assert_matches_reference(ctx, i, torch.neg(q[:1]), kv, indices[:1], out2[:1], lse2[:1],
                                     call="second call", note=wiring)
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
