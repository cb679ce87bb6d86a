"""Where a flashmla call's time goes between its kernels: the kernel table's graph of calls
(``graphattn.bench.kernels``: cycling cold input copies) replayed under ``torch.profiler``, and
per call the split kernel's and the combine's durations (a combine launched as a programmatic
dependent launch starts before the split kernel ends and waits inside), the time from the split
kernel's end to the combine's, and the gap from a call's last kernel to the next call's first,
as medians over the calls. Diagnostic only.

Run from the repository root on a GPU:
``PYTHONPATH=. python scripts/call_timeline.py 128x1x2048 128x8x2048 [--kv-fp8]``."""
from __future__ import annotations

import argparse
import statistics


def per_call(kernels: list[tuple[str, float, float]], first: str) -> list[dict[str, float]]:
    """``kernels``: ``(name, start, end)`` of every kernel of the replays, in µs. A call starts at
    each kernel whose name starts with ``first`` (the split kernel) and holds the kernels up to
    the next such one. Per call: ``split`` (its first kernel's duration), ``combine`` (the
    second's, 0 without one), ``to_combine`` (the combine's end minus the split kernel's end),
    ``span`` (the call's first start to its last end) and ``to_next`` (its last end to the next
    call's first start; the last call has none and is dropped)."""
    kernels = sorted(kernels, key=lambda k: k[1])
    starts = [i for i, k in enumerate(kernels) if k[0].startswith(first)]
    calls = []
    for a, b in zip(starts, starts[1:]):
        mine = kernels[a:b]
        split, rest = mine[0], mine[1:]
        end = max(k[2] for k in mine)
        calls.append({
            "split": split[2] - split[1],
            "combine": rest[0][2] - rest[0][1] if rest else 0.0,
            "to_combine": rest[0][2] - split[2] if rest else 0.0,
            "span": end - split[1],
            "to_next": kernels[b][1] - end,
        })
    return calls


def medians(calls: list[dict[str, float]]) -> dict[str, float]:
    """The median of each field over ``calls``."""
    return {key: statistics.median(c[key] for c in calls) for key in calls[0]}


def main(specs: list[str], kv_fp8: bool) -> None:
    import torch

    from graphattn.bench.kernels import capture_calls, cold_copies, make_copies, path_fn
    from graphattn.kernels import flashmla, split_plan

    for spec in specs:
        h, r, t = (int(x) for x in spec.split("x"))
        plan = flashmla.plan_flashmla(r, h, t, split_plan("flashmla", h, t).num_splits, kv_fp8=kv_fp8)
        copies = cold_copies(r, t, kv_fp8)
        sets = make_copies(r, h, t, copies, kv_fp8=kv_fp8)
        fn = path_fn("flashmla", r, h, t)
        graph = capture_calls(fn, sets, max(copies, 64))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
        kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith("_flashmla")]
        calls = per_call(kernels, plan.main.name)
        if not calls:
            print(f"== {spec}: no kernels seen in the profile of the graph's replays")
            continue
        m = medians(calls)
        print(f"== {spec} ({'FP8' if kv_fp8 else 'bf16'}): {plan.kernel}, {plan.main.grid[0]} programs, "
              f"{plan.splits} split(s), combine {'none' if plan.combine is None else plan.combine.grid[0]}; "
              f"{len(calls)} calls")
        print("   median us: " + ", ".join(f"{k} {v:.2f}" for k, v in m.items())
              + f"; period {m['span'] + m['to_next']:.2f}")
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+", help="HEADSxROWSxTOPK")
    ap.add_argument("--kv-fp8", action="store_true", help="656-byte FP8 KV tokens")
    args = ap.parse_args()
    main(args.shapes, args.kv_fp8)
