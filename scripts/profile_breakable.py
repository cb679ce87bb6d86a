"""Where a breakable-graph layer's host time goes (GPU only).

flashmla, 128 heads, top-k 2048, 4 measured layers: per-layer time of the full, breakable and
eager modes at 1 and 8 rows (the best of 5 samples of 200 steps), a cProfile of 200 breakable
steps at 1 row (functions by own time), and which breakable segments captured nothing (those
are not launched on replay)::

    python scripts/profile_breakable.py
"""

from __future__ import annotations

import cProfile
import io
import pstats

import torch

from graphattn.backends import get_backend_class
from graphattn.bench.decode import ModeBench
from graphattn.bench.workload import DecodeWorkload, make_generator
from graphattn.common.platform import current_platform


def main() -> None:
    platform = current_platform()
    if not platform.has_gpu:
        raise SystemExit("profile_breakable.py times GPU launches; this machine has no GPU")
    wl = DecodeWorkload(num_heads=128, topk=2048, pool_tokens=262144, batch_sizes=(1, 8),
                        num_layers=61, measure_layers=4, dtype=torch.bfloat16)
    kv = wl.make_kv(platform.device, make_generator(platform.device, 0))
    backend = get_backend_class("flashmla")(128, 2048, torch.bfloat16, platform=platform)
    for mode in ("full", "breakable", "eager"):
        bench = ModeBench(mode, backend, wl, kv, platform, sanitize=False)
        bench.capture()
        for rows in (1, 8):
            best = min(bench.time_step(rows, 1000, 20, 200))
            print(f"{mode} rows={rows}: {best / wl.measure_layers * 1e6:.1f} us/layer", flush=True)
        if mode == "breakable":
            gen = make_generator(platform.device, 3)
            qs, idx = wl.make_q(1, platform.device, gen), wl.make_indices(1, platform.device, gen)
            for _ in range(20):
                bench.run(qs, idx)
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                bench.run(qs, idx)
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(35)
            print(text.getvalue())
            segments = bench.runner.graphs[1].segments
            print(f"segments {len(segments)}, empty {[getattr(s, 'empty', None) for s in segments]}")
        del bench


if __name__ == "__main__":
    main()
