"""``python -m graphattn.bench.graphs``: what the graph layer costs on top of a raw graph.

The work is a small decode-like step in plain torch ops (q-pad copy through
:class:`GraphMetadata`, a matmul, a multi-CTA counter add + reset), so the numbers measure the
graph machinery, not a kernel. Reported, per replay unless stated:

* ``raw``: a raw ``torch.cuda.CUDAGraph`` replay of the step (on the CPU: one emulated segment),
* ``graph``: :meth:`BreakableGraph.replay` of the same step (no breaks, sanitizer off),
* ``runner``: :meth:`GraphRunner.run` (copy live inputs, pad, replay, slice),
* ``break``: the extra cost of one ``eager_on_graph`` break (an extra segment + eager op + copy),
* ``sanitizer``: the extra cost of the capture sanitizer's check before each replay,
* ``capture``: seconds to capture the default bucket list (warm-up included).

On the CPU the graphs are emulated and sizes are small, so the run takes seconds; use it to
check the benchmark, not to read numbers. ``--json PATH`` writes the results.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import torch

from ..common.argtypes import new_file, positive_int
from ..common.metadata import GraphMetadata
from ..common.platform import Platform, current_platform
from ..graphs import BreakableGraph, GraphRunner, default_buckets, eager_on_graph


def progress(msg: str) -> None:
    """A progress line on stderr (stdout stays the report)."""
    print(msg, file=sys.stderr, flush=True)


class Step:
    """The benchmarked step: ``q [rows, H, D]`` -> ``[rows, H, E]`` in ``dtype``.

    q is padded to ``PH`` heads through the metadata's grow-only q-pad buffer, multiplied by a
    ``[D, E]`` weight, scaled by a counter that is incremented and reset (a multi-CTA kernel's
    bookkeeping), and sliced back to ``H`` heads.
    """

    def __init__(self, max_rows: int, heads: int, dim: int, out_dim: int, dtype, device):
        self.meta = GraphMetadata(
            max_rows, heads, 1, dtype, device, padded_heads=64, counter_cols=4, d_qk=dim, d_v=out_dim
        )
        self.w = torch.randn(dim, out_dim, dtype=dtype, device=device)
        self.heads = heads

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        rows = q.shape[0]
        counter = self.meta.counter_for(rows)
        counter.add_(1)
        out = self.meta.zero_padded_q(q) @ self.w  # [rows, 64, E]
        out = out[:, : self.heads] * (counter[:, :1] > 0).to(out.dtype).unsqueeze(-1)
        counter.zero_()
        return out


@eager_on_graph
def eager_identity(t: torch.Tensor) -> torch.Tensor:
    """The cheapest useful break: an eager copy of its input."""
    return t.clone()


def time_per_call(fn: Callable[[], Any], platform: Platform, iters: int, repeats: int = 3) -> float:
    """Seconds per ``fn()``, device work included: the best of ``repeats`` means over ``iters``
    calls (the minimum filters out scheduler noise, which only ever adds time)."""
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        platform.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        platform.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def raw_replay(step: Step, q: torch.Tensor, platform: Platform) -> Callable[[], Any]:
    """A replay callable of the step captured without graphattn's layer."""
    if platform.has_gpu:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(q)  # warm-up on a side stream, as torch's docs do
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(q)
        return graph.replay
    from ..graphs.emulated import EmulatedGraphSegment

    seg = EmulatedGraphSegment()
    seg.capture_begin()
    step(q)
    seg.capture_end()
    return seg.replay


def captured(fn: Callable, q: torch.Tensor, platform: Platform, sanitize: bool) -> BreakableGraph:
    """A BreakableGraph of ``fn(q)`` after one warm-up."""
    graph = BreakableGraph(platform, sanitize=sanitize)
    graph.warmup(fn, q)
    graph.capture(fn, q)
    return graph


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure everything; returns the results (seconds, or microseconds where named ``_us``)."""
    platform = current_platform()
    device = platform.device
    dtype = torch.bfloat16 if platform.has_gpu else torch.float32
    step = Step(args.max_rows, args.heads, args.dim, args.out_dim, dtype, device)
    rows = args.rows
    if rows > args.max_rows:
        raise ValueError(f"rows ({rows}) must be <= max_rows ({args.max_rows})")
    q = torch.randn(rows, args.heads, args.dim, dtype=dtype, device=device)
    us = 1e6
    res: dict[str, Any] = {"platform": platform.describe(), "rows": rows, "iters": args.iters}

    progress(f"raw replay ({rows} rows)")
    res["raw_us"] = time_per_call(raw_replay(step, q, platform), platform, args.iters) * us
    progress("BreakableGraph replay, without and with the sanitizer")
    plain = captured(step, q, platform, sanitize=False)
    res["graph_us"] = time_per_call(plain.replay, platform, args.iters) * us
    checked = captured(step, q, platform, sanitize=True)
    res["graph_sanitized_us"] = time_per_call(checked.replay, platform, args.iters) * us
    # The replay itself is asynchronous, so the difference of the two replay times is noise;
    # the sanitizer's cost is host time spent in its check, timed on its own.
    res["sanitizer_us"] = time_per_call(checked.check, platform, args.iters) * us
    res["sanitizer_storages"] = len(checked.held_storages())

    progress("one break")
    broken = captured(lambda t: eager_identity(step(t)) * 1, q, platform, sanitize=False)
    unbroken = BreakableGraph(platform, sanitize=False, breaks=False)
    unbroken.warmup(lambda t: eager_identity(step(t)) * 1, q)
    unbroken.capture(lambda t: eager_identity(step(t)) * 1, q)
    res["one_break_us"] = (
        time_per_call(broken.replay, platform, args.iters)
        - time_per_call(unbroken.replay, platform, args.iters)
    ) * us

    res.update(runner_costs(step, q, platform, args))
    return res


def runner_costs(step: Step, q: torch.Tensor, platform: Platform, args) -> dict[str, Any]:
    """GraphRunner: capture time for the default bucket list, then the cost of ``run``."""
    static = {"q": torch.randn(args.max_rows, *q.shape[1:], dtype=q.dtype, device=q.device)}
    buckets = default_buckets(args.max_rows)
    runner = GraphRunner(
        step, static, metadata=step.meta, buckets=buckets, sanitize=False,
        progress=lambda done, total, b, s: progress(f"  captured {done}/{total} (bucket {b}, {s:.3f} s)")
        if done % 8 == 0 or done == total else None,
    )
    progress(f"capture {len(buckets)} buckets")
    platform.synchronize()
    t0 = time.perf_counter()
    runner.capture()
    platform.synchronize()
    capture_s = time.perf_counter() - t0
    run_s = time_per_call(lambda: runner.run(q=q), platform, args.iters)
    return {
        "buckets": len(buckets),
        "capture_s": capture_s,
        "capture_per_bucket_ms": capture_s / len(buckets) * 1e3,
        "runner_us": run_s * 1e6,
    }


def report(res: dict[str, Any]) -> str:
    """A Markdown table of the results."""
    rows = [
        ("raw graph replay", f"{res['raw_us']:.1f} µs"),
        ("BreakableGraph.replay (no breaks)", f"{res['graph_us']:.1f} µs"),
        ("GraphRunner.run (copy + pad + replay)", f"{res['runner_us']:.1f} µs"),
        ("cost of one break", f"{res['one_break_us']:.1f} µs"),
        (f"sanitizer check ({res['sanitizer_storages']} storages)", f"{res['sanitizer_us']:.1f} µs"),
        (f"capture {res['buckets']} default buckets", f"{res['capture_s']:.2f} s "
         f"({res['capture_per_bucket_ms']:.1f} ms/bucket)"),
    ]
    head = f"graph layer on {res['platform']['platform']} ({res['rows']} rows, {res['iters']} iters)\n\n"
    lines = ["| measure | per replay |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    return head + "\n".join(lines)


PROG = "python -m graphattn.bench.graphs"
PADDED_HEADS = 64  # Step pads q to this many heads


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before anything runs (a bad value: one line, exit code 2)."""
    from ..common.argtypes import Parser  # errors on one line, exit code 2

    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    try:
        gpu = current_platform().has_gpu
    except ValueError as exc:  # GRAPHATTN_PLATFORM names no platform
        p.error(str(exc))
    p.add_argument("--rows", type=positive_int, default=None,
                   help="rows of the replayed step, <= --max-rows (default: 64, or --max-rows if smaller)")
    p.add_argument("--max-rows", type=positive_int, default=256 if gpu else 24, help="largest bucket")
    p.add_argument("--heads", type=positive_int, default=16 if gpu else 4, help=f"query heads (<= {PADDED_HEADS})")
    p.add_argument("--dim", type=positive_int, default=576 if gpu else 32, help="q/kv width")
    p.add_argument("--out-dim", type=positive_int, default=512 if gpu else 16)
    p.add_argument("--iters", type=positive_int, default=200 if gpu else 20)
    p.add_argument("--json", metavar="PATH", type=new_file, help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.rows is None:
        args.rows = min(64, args.max_rows)
    elif args.rows > args.max_rows:
        p.error(f"argument --rows: must be <= --max-rows ({args.max_rows}), got {args.rows}")
    if args.heads > PADDED_HEADS:
        p.error(f"argument --heads: must be <= {PADDED_HEADS} (the step pads q to {PADDED_HEADS} heads), "
                f"got {args.heads}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        res = run(args)
    except (MemoryError, RuntimeError) as exc:
        from .decode import is_out_of_memory

        if not is_out_of_memory(exc):
            raise
        print(f"{PROG}: error: out of memory: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 4
    print(report(res))
    if args.json:
        from .decode import write_report

        try:
            write_report(args.json, res)
        except OSError as exc:
            print(f"{PROG}: error: argument --json: could not write {args.json!r}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
