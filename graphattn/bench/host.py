"""Host cost of one attention call: what eager and breakable-graph modes pay on the CPU side.

``host_cost`` times ``calls`` back-to-back ``backend.plan`` calls and then ``backend.forward``
calls on one planned metadata, without waiting for the GPU in between: with the device busy
for less time than the host needs per call, the wall time per call is the host cost (the
launch queue never fills). ``forward_wall_us`` waits for the device at the end, so where it is
well above ``forward_host_us`` the GPU, not the host, set the pace.

Command line (a markdown table)::

    python -m graphattn.bench.host --backends flashmla,trtllm,flashmla_mega,torch --heads 16,128 --rows 1,8

``--profile DIR`` also writes a cProfile of each point's timed ``forward`` calls
(``DIR/<backend>_h<heads>_r<rows>.txt``, functions by own time) to see where host time goes.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from ..backends import get_backend_class
from ..common.argtypes import folder_path, positive_int, positive_int_list
from ..common.platform import Platform, current_platform
from .workload import DecodeWorkload, make_generator


def host_cost(backend, wl: DecodeWorkload, kv: torch.Tensor, rows: int, platform: Platform,
              calls: int, profile: str | None = None, repeats: int = 1) -> dict[str, Any]:
    """Host µs per ``plan`` and per ``forward`` of ``backend`` at ``rows`` rows (see module doc):
    the best of ``repeats`` timings of ``calls`` back-to-back calls each (a host shared with
    other work gives the same point up to 1.5x apart between repeats; the best is the cost).

    Raises:
        ValueError: ``calls`` or ``repeats`` below 1 (no timing: a negative or missing cost).
    """
    if calls < 1 or repeats < 1:
        raise ValueError(f"host_cost needs calls >= 1 and repeats >= 1, got calls={calls}, repeats={repeats}")
    md = backend.make_metadata(rows)
    gen = make_generator(platform.device, wl.seed + 31 + rows)
    q = wl.make_q(rows, platform.device, gen)[0]
    idx = wl.make_indices(rows, platform.device, gen)
    backend.plan(md, idx)
    for _ in range(min(calls, 10)):  # compile, memoise the plan, warm the allocator
        backend.forward(q, kv, md)
    plan_s = host_s = wall_s = float("inf")
    for _ in range(repeats):
        platform.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            backend.plan(md, idx)
        plan_s = min(plan_s, (time.perf_counter() - t0) / calls)
        platform.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            backend.forward(q, kv, md)
        host_s = min(host_s, (time.perf_counter() - t0) / calls)
        platform.synchronize()
        wall_s = min(wall_s, (time.perf_counter() - t0) / calls)
    if profile:
        _profile_forward(backend, q, kv, md, calls, platform, profile)
    return {"backend": backend.name, "heads": backend.num_heads, "rows": rows, "calls": calls,
            "repeats": repeats, "plan_us": plan_s * 1e6, "forward_host_us": host_s * 1e6,
            "forward_wall_us": wall_s * 1e6}


def _profile_forward(backend, q, kv, md, calls: int, platform: Platform, folder: str) -> None:
    import cProfile
    import io
    import os
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        backend.forward(q, kv, md)
    prof.disable()
    platform.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    os.makedirs(folder, exist_ok=True)
    name = f"{backend.name}_h{backend.num_heads}_r{q.shape[0]}.txt"
    with open(os.path.join(folder, name), "w") as f:
        f.write(f"{calls} calls\n{text.getvalue()}")


def default_calls(platform: Platform) -> int:
    """200 on a GPU; 2 under the Triton interpreter (each call there takes a second or more)."""
    return 200 if platform.has_gpu else 2


def default_repeats(platform: Platform) -> int:
    """Timings per point, the best kept: 5 on a GPU, 1 under the interpreter."""
    return 5 if platform.has_gpu else 1


def markdown(rows: list[dict[str, Any]]) -> str:
    """A markdown table of :func:`host_cost` results."""
    lines = ["| backend | heads | rows | plan µs | forward µs (host) | forward µs (with GPU) |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['backend']} | {r['heads']} | {r['rows']} | {r['plan_us']:.1f} | "
              f"{r['forward_host_us']:.1f} | {r['forward_wall_us']:.1f} |" for r in rows]
    return "\n".join(lines)


def _backend_names(text: str) -> list[str]:
    """``--backends``: comma-separated registered names or ``pkg.module:Class`` paths that load."""
    from ..backends.registry import load_error, split_backend_names

    try:
        names = list(dict.fromkeys(split_backend_names([text])))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated backend names, got {text!r}") from None
    for name in names:
        error = load_error(name)
        if error:
            raise argparse.ArgumentTypeError(error)
    return names


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Platform, DecodeWorkload]:
    """The command line, checked against each other and this platform before anything runs:
    ``(args, platform, base workload)``; a bad value exits with one line and code 2."""
    from ..common.argtypes import Parser  # errors on one line, exit code 2

    p = Parser(prog="python -m graphattn.bench.host", description=__doc__.split("\n")[0])
    p.add_argument("--backends", type=_backend_names, default=["flashmla", "trtllm", "flashmla_mega", "torch"],
                   help="comma-separated backends (default: flashmla,trtllm,flashmla_mega,torch)")
    p.add_argument("--heads", type=positive_int_list, default=(16, 128))
    p.add_argument("--rows", type=positive_int_list, default=(1, 8))
    p.add_argument("--topk", type=positive_int, default=None, help="default: the platform's workload top-k")
    p.add_argument("--calls", type=positive_int, default=None, help="calls per timing (default: 200 on a GPU)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timings per point, best kept (default: 5 on a GPU)")
    p.add_argument("--profile", metavar="DIR", type=folder_path, default=None,
                   help="also write a cProfile of each point's forward calls into DIR")
    args = p.parse_args(argv)
    try:
        platform = current_platform()
    except ValueError as exc:  # GRAPHATTN_PLATFORM names no platform
        p.error(str(exc))
    base = DecodeWorkload.default_for(platform)
    topk = args.topk or base.topk
    if topk > base.pool_tokens:
        p.error(f"argument --topk: must be <= {base.pool_tokens}, the pool's tokens, got {topk}")
    from ..backends.registry import refusal_reasons

    for name in args.backends:
        for heads in args.heads:
            reasons = refusal_reasons(name, heads, base.dtype, topk, platform)
            if reasons:
                p.error(f"argument --backends: {name} at --heads {heads}: {'; '.join(reasons)}")
    return args, platform, base


def main(argv: list[str] | None = None) -> int:
    args, platform, base = parse_args(argv)
    calls = args.calls or default_calls(platform)
    results = []
    for heads in args.heads:
        wl = DecodeWorkload(num_heads=heads, topk=args.topk or base.topk, pool_tokens=base.pool_tokens,
                            batch_sizes=tuple(args.rows), num_layers=1, measure_layers=1, dtype=base.dtype)
        kv = wl.make_kv(platform.device, make_generator(platform.device, wl.seed))[0]
        for name in args.backends:
            backend = get_backend_class(name)(heads, wl.topk, wl.dtype, platform=platform)
            for rows in args.rows:
                results.append(host_cost(backend, wl, kv, rows, platform, calls, args.profile,
                                         args.repeats or default_repeats(platform)))
                print(f"[host] {results[-1]}", file=sys.stderr, flush=True)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
