"""Where an eager bench step at 1 row spends its time (H200): per-step wall-time distribution
of the bench's eager mode, the same loop with a sync per step, the forward alone, and a torch
profiler trace (host ops and GPU kernels). Run from the
repository root on a GPU: ``PYTHONPATH=. python scripts/eager_profile.py`` (writes a chrome
trace into $OUT, default /tmp)."""
import os, statistics, sys, time
import torch
from graphattn.backends import get_backend_class
from graphattn.bench.decode import ModeBench
from graphattn.bench.workload import DecodeWorkload, make_generator
from graphattn.common.platform import current_platform

out_dir = os.environ.get("OUT", "/tmp")
platform = current_platform()
wl = DecodeWorkload(num_heads=128, topk=2048, pool_tokens=262144, batch_sizes=(1, 8), num_layers=61,
                    measure_layers=4, dtype=torch.bfloat16)
kv = wl.make_kv(platform.device, make_generator(platform.device, 0))
backend = get_backend_class("flashmla")(128, 2048, torch.bfloat16, platform=platform)
bench = ModeBench("eager", backend, wl, kv, platform, sanitize=False)

def pct(xs):
    xs = sorted(xs); n = len(xs)
    return f"min {xs[0]:.1f} p10 {xs[n//10]:.1f} med {xs[n//2]:.1f} p90 {xs[9*n//10]:.1f} max {xs[-1]:.1f}"

for rows in (1, 8):
    gen = make_generator(platform.device, 7)
    qs = wl.make_q(rows, platform.device, gen)
    idx = [wl.make_indices(rows, platform.device, make_generator(platform.device, 100 + i)) for i in range(2)]
    for i in range(300):
        bench.run(qs, idx[i % 2])
    torch.cuda.synchronize()
    # 1. the bench's way: windows of 10 steps, no sync inside
    wins = []
    for w in range(30):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for i in range(10):
            bench.run(qs, idx[i % 2])
        torch.cuda.synchronize(); wins.append((time.perf_counter() - t0) / 10 / 4 * 1e6)
    print(f"rows {rows}: bench windows us/layer: {pct(wins)}", flush=True)
    # 2. per-step host time without sync (host returns before the GPU is done)
    steps = []
    for i in range(300):
        t0 = time.perf_counter(); bench.run(qs, idx[i % 2]); steps.append((time.perf_counter() - t0) / 4 * 1e6)
    torch.cuda.synchronize()
    print(f"rows {rows}: host per step (no sync) us/layer: {pct(steps)}", flush=True)
    # 3. sync every step
    synced = []
    for i in range(100):
        torch.cuda.synchronize(); t0 = time.perf_counter(); bench.run(qs, idx[i % 2]); torch.cuda.synchronize()
        synced.append((time.perf_counter() - t0) / 4 * 1e6)
    print(f"rows {rows}: synced step us/layer: {pct(synced)}", flush=True)
    # 4. forward alone, plan once
    backend.plan(bench.metadata, idx[0])
    fw = []
    for w in range(20):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for i in range(50):
            backend.forward(qs[i % 4], kv[i % 4], bench.metadata)
        fw.append((time.perf_counter() - t0) / 50 * 1e6)
    torch.cuda.synchronize()
    print(f"rows {rows}: forward alone (windows of 50, incl. GPU) us: {pct(fw)}", flush=True)
    pl = []
    for i in range(300):
        t0 = time.perf_counter(); backend.plan(bench.metadata, idx[i % 2]); pl.append((time.perf_counter() - t0) * 1e6)
    print(f"rows {rows}: plan us: {pct(pl)}", flush=True)

# torch profiler of 20 eager steps at 1 row
from torch.profiler import profile, ProfilerActivity
gen = make_generator(platform.device, 7)
qs = wl.make_q(1, platform.device, gen)
idx = [wl.make_indices(1, platform.device, make_generator(platform.device, 100 + i)) for i in range(2)]
for i in range(50):
    bench.run(qs, idx[i % 2])
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for i in range(20):
        bench.run(qs, idx[i % 2])
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10))
prof.export_chrome_trace(os.path.join(out_dir, "eager_1row_trace.json"))
