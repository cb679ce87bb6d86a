"""``graphattn bench``: the decode workload through one backend in eager, full and breakable graphs.

For each mode and batch size it times a decode step of ``measure_layers`` layers (host ``plan``
plus device work; graphs via :class:`GraphRunner`, one bucket per batch size), checks a sample of
outputs against the float64 reference, and reports time per layer and per step (scaled to
``num_layers``), tokens/s, achieved GB/s and TFLOP/s, the fraction of the roofline floor
``max(bytes / peak_bw, flops / peak_flops)``, and the memory the graphs hold. Progress goes to
stderr; the table to stdout; ``--json PATH`` writes everything.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any, Callable

import torch

from ..backends import accepts_out, add_attn_backend_arg, resolve_backend
from ..backends.base import kv_kwargs
from ..common.kv_layout import resolve_kv_dtype
from ..common.platform import Platform, current_platform
from ..common.reference import sparse_mla_reference
from ..common.tolerances import tolerance
from ..graphs import GraphRunner, eager_on_graph
from .host import default_calls, default_repeats, host_cost
from .workload import H200_BYTES_PER_S, H200_FLOP_PER_S, DecodeWorkload, make_generator

MODES = ("eager", "full", "breakable")
CHECK_ROWS = 8  # rows of each sampled output compared with the float64 reference
WARMUP_S = 0.25  # seconds of untimed steps per point on a GPU
# (device-name substring, bytes/s, flop/s, source). H200 figures are measured (docs/design.md,
# "Measured hardware facts").
_GPU_PEAKS = (
    ("H200", H200_BYTES_PER_S, H200_FLOP_PER_S, "measured on H200: d2d copy 4.2 TB/s, bf16 matmul 790 TFLOP/s"),
    ("H100", 3.35e12, 989e12, "H100 SXM datasheet"),
    ("MI355", 8.0e12, 2500e12, "MI355X datasheet"),
    ("MI300", 5.3e12, 1307e12, "MI300X datasheet"),
)


def progress(msg: str) -> None:
    """A progress line on stderr (stdout stays the report)."""
    print(f"[graphattn bench] {msg}", file=sys.stderr, flush=True)


# -- peaks ----------------------------------------------------------------------------------------
def platform_peaks(platform: Platform, dtype: torch.dtype) -> tuple[float, float, str]:
    """``(bytes/s, flop/s, source)`` of the roofline: a known GPU's figures, else measured here."""
    if platform.has_gpu:
        name = torch.cuda.get_device_name()
        for key, bw, flops, source in _GPU_PEAKS:
            if key in name:
                return bw, flops, source
    return _measure_peaks(platform, dtype)


def _measure_peaks(platform: Platform, dtype: torch.dtype) -> tuple[float, float, str]:
    # Unknown device: a large copy (read + write counted) and a square matmul, best of three.
    dev = platform.device
    mm_dtype = dtype if platform.has_gpu else torch.float32  # CPU half matmul is not representative
    src = torch.empty(32 << 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    n = 4096 if platform.has_gpu else 512
    a = torch.randn(n, n, device=dev).to(mm_dtype)
    copy_s = _best_time(lambda: dst.copy_(src), platform)
    mm_s = _best_time(lambda: a @ a, platform)
    return 2 * src.numel() / copy_s, 2.0 * n**3 / mm_s, f"measured here (copy, {mm_dtype} matmul)"


def _best_time(fn: Callable[[], Any], platform: Platform, reps: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        platform.synchronize()
        t0 = time.perf_counter()
        fn()
        platform.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


# -- one mode -------------------------------------------------------------------------------------
class ModeBench:
    """One mode's setup: backend, its own metadata, the KV pools, the step function."""

    def __init__(self, mode: str, backend, wl: DecodeWorkload, kv: list[torch.Tensor],
                 platform: Platform, sanitize: bool):
        self.mode, self.backend, self.wl, self.kv, self.platform = mode, backend, wl, kv, platform
        self.metadata = backend.make_metadata(wl.max_rows)  # one metadata per runner
        # A break only in breakable mode; replays write into the captured outputs (no copy).
        attention = eager_on_graph(backend.forward, out="out" if accepts_out(backend.forward) else None)

        def step(**qs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(attention(qs[f"q{i}"], kv_i, self.metadata)[0] for i, kv_i in enumerate(kv))

        self.step = step
        self.runner = None
        self.memory: dict[str, int] = {"metadata_bytes": self.metadata.nbytes()}
        if mode != "eager":
            gen = make_generator(platform.device, wl.seed + 1)
            static = {f"q{i}": q for i, q in enumerate(wl.make_q(wl.max_rows, platform.device, gen))}
            self.runner = GraphRunner(step, static, metadata=self.metadata, buckets=wl.batch_sizes,
                                      mode=mode, sanitize=sanitize, platform=platform,
                                      progress=self._on_capture)

    def _on_capture(self, done: int, total: int, bucket: int, seconds: float) -> None:
        progress(f"{self.mode}: captured bucket {bucket} rows ({done}/{total}) in {seconds:.2f} s")

    def capture(self) -> None:
        """Capture every bucket (graph modes); records the device memory the graphs hold."""
        if self.runner is None:
            return
        gpu = self.platform.has_gpu
        gc.collect()  # objects of an earlier mode (reference cycles) must not be freed mid-capture
        self.platform.synchronize()
        before = torch.cuda.memory_allocated() if gpu else 0
        t0 = time.perf_counter()
        self.backend.plan(self.metadata, self._indices(self.wl.max_rows, 0))
        self.runner.capture()
        self.platform.synchronize()
        self.memory["graph_pool_bytes"] = (torch.cuda.memory_allocated() - before) if gpu else None
        self.memory["capture_s"] = round(time.perf_counter() - t0, 3)
        self.memory["static_input_bytes"] = sum(t.numel() * t.element_size() for t in self.runner.static.values())

    def _indices(self, rows: int, salt: int) -> torch.Tensor:
        return self.wl.make_indices(rows, self.platform.device, make_generator(self.platform.device, salt))

    def run(self, qs: list[torch.Tensor], indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One decode step: plan on the host, then every measured layer (eager or replay)."""
        rows = indices.shape[0]
        bucket = self.runner.bucket_for(rows) if self.runner is not None else None
        self.backend.plan(self.metadata, indices, pad_to=bucket)
        live = {f"q{i}": q for i, q in enumerate(qs)}
        return self.runner.run(**live) if self.runner is not None else self.step(**live)

    def time_step(self, rows: int, iters: int, warmup: int) -> float:
        """Seconds per step at ``rows`` (two alternating index sets, so plan does real copies)."""
        gen = make_generator(self.platform.device, self.wl.seed + 7 + rows)
        qs = self.wl.make_q(rows, self.platform.device, gen)
        idx = [self._indices(rows, self.wl.seed + 100 + rows + i) for i in range(2)]
        # At least `warmup` steps and WARMUP_S seconds: an idle GPU needs time to reach its
        # clocks, and the first point would otherwise be measured slow.
        i, t_end = 0, time.perf_counter() + (WARMUP_S if self.platform.has_gpu else 0.0)
        while i < warmup or time.perf_counter() < t_end:
            self.run(qs, idx[i % 2])
            i += 1
        self.platform.synchronize()
        t0 = time.perf_counter()
        for i in range(iters):
            self.run(qs, idx[i % 2])
        self.platform.synchronize()
        return (time.perf_counter() - t0) / iters

    def check(self, rows: int) -> dict[str, Any]:
        """Compare the first and last measured layers' output (first rows) with the reference."""
        gen = make_generator(self.platform.device, self.wl.seed + 1000 + rows)
        qs = self.wl.make_q(rows, self.platform.device, gen)
        indices = self._indices(rows, self.wl.seed + 2000 + rows)
        outs = self.run(qs, indices)
        tol, n, worst = tolerance(self.wl.dtype, self.wl.kv_dtype), min(rows, CHECK_ROWS), 0.0
        ok = True
        for layer in sorted({0, len(qs) - 1}):
            ref, _ = sparse_mla_reference(qs[layer][:n], self.kv[layer], indices[:n], self.backend.sm_scale,
                                          fp8_dtype=self.platform.fp8_dtype)  # FP8: the dequantised cache
            got = outs[layer][:n].double()
            err = (got - ref).abs()
            ok &= bool((err <= tol.atol + tol.rtol * ref.abs()).all())
            worst = max(worst, float(err.max()))
        return {"mode": self.mode, "rows": rows, "ok": ok, "max_abs_err": worst,
                "atol": tol.atol, "rtol": tol.rtol}


# -- the whole run --------------------------------------------------------------------------------
def result_row(wl: DecodeWorkload, mode: str, rows: int, step_s: float, peaks: tuple) -> dict[str, Any]:
    """Derived figures of one measurement (``step_s`` covers ``measure_layers`` layers)."""
    layer_s = step_s / wl.measure_layers
    nbytes, flops = wl.bytes_per_layer(rows), wl.flops_per_layer(rows)
    floor = max(nbytes / peaks[0], flops / peaks[1])
    return {
        "mode": mode, "rows": rows, "layer_us": layer_s * 1e6,
        "step_ms": layer_s * wl.num_layers * 1e3,
        "tokens_per_s": rows / (layer_s * wl.num_layers),
        "gb_per_s": nbytes / layer_s / 1e9, "tflop_per_s": flops / layer_s / 1e12,
        "roofline_fraction": floor / layer_s,
    }


def run_bench(wl: DecodeWorkload, backend_name: str, modes: tuple[str, ...], iters: int, warmup: int,
              sanitize: bool = False, check: bool = True, peaks: tuple | None = None,
              platform: Platform | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (see ``--json``)."""
    platform = platform or current_platform()
    cls = resolve_backend(backend_name, wl.num_heads, wl.dtype, wl.topk, platform, wl.kv_dtype)
    backend = cls(wl.num_heads, wl.topk, wl.dtype, platform=platform, **kv_kwargs(wl.kv_dtype))
    peaks = peaks or platform_peaks(platform, wl.dtype)
    progress(f"backend {cls.name} on {platform.name}; {wl.as_dict()}")
    for note in cls.notes(platform):
        progress(f"note: {note}")
    kv = wl.make_kv(platform.device, make_generator(platform.device, wl.seed))
    report: dict[str, Any] = {"backend": cls.name, "requested": backend_name, "platform": platform.describe(),
                              "workload": wl.as_dict(), "capabilities": cls.capabilities(platform),
                              "peaks": {"bytes_per_s": peaks[0], "flop_per_s": peaks[1], "source": peaks[2]},
                              "results": [], "checks": [], "memory": {}, "host": []}
    for mode in modes:
        bench = ModeBench(mode, backend, wl, kv, platform, sanitize)
        if mode != "eager":
            progress(f"{mode}: capturing {len(wl.batch_sizes)} buckets x {wl.measure_layers} layers")
        bench.capture()
        report["memory"][mode] = bench.memory
        for rows in wl.batch_sizes:
            step_s = bench.time_step(rows, iters, warmup)
            report["results"].append(result_row(wl, mode, rows, step_s, peaks))
            progress(f"{mode}: {rows} rows: {step_s / wl.measure_layers * 1e6:.1f} us/layer")
        if check:
            for rows in sorted({min(wl.batch_sizes), max(wl.batch_sizes)}):
                report["checks"].append(bench.check(rows))
        if mode == "eager":
            for rows in wl.batch_sizes:
                report["host"].append(host_cost(backend, wl, kv[0], rows, platform, default_calls(platform),
                                                    repeats=default_repeats(platform)))
        del bench
        gc.collect()  # the runner's progress callback makes a cycle; free its graphs now
        platform.empty_cache()
    report["ok"] = all(c["ok"] for c in report["checks"])
    return report


# -- report and command line ----------------------------------------------------------------------
def format_report(report: dict[str, Any]) -> str:
    """The human-readable table of a :func:`run_bench` report."""
    wl, peaks = report["workload"], report["peaks"]
    lines = [
        f"backend {report['backend']} (requested {report['requested']}) on {report['platform']['platform']}; "
        f"heads={wl['num_heads']} topk={wl['topk']} pool={wl['pool_tokens']} dtype={wl['dtype']} "
        f"kv_dtype={wl.get('kv_dtype', 'auto')} "
        f"layers={wl['num_layers']} (measured {wl['measure_layers']}, per step = per layer x {wl['num_layers']})",
        f"roofline floor = max(bytes / {peaks['bytes_per_s']:.3g} B/s, flops / {peaks['flop_per_s']:.3g} "
        f"flop/s) [{peaks['source']}]",
    ]
    header = ("mode", "rows", "us/layer", "ms/step", "tokens/s", "GB/s", "TFLOP/s", "roofline")
    table = [header] + [
        (r["mode"], str(r["rows"]), f"{r['layer_us']:.1f}", f"{r['step_ms']:.3f}",
         f"{r['tokens_per_s']:.1f}", f"{r['gb_per_s']:.1f}", f"{r['tflop_per_s']:.3f}",
         f"{100 * r['roofline_fraction']:.1f}%")
        for r in report["results"]
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
    if report.get("host"):
        lines.append("host cost per attention call (µs; back-to-back calls, GPU not waited on; GPU time: "
                     "the full-graph us/layer):")
        lines += [f"  {h['rows']:>4} rows: plan {h['plan_us']:.1f}, forward {h['forward_host_us']:.1f} host / "
                  f"{h['forward_wall_us']:.1f} with GPU" for h in report["host"]]
    for mode, mem in report["memory"].items():
        pool = mem.get("graph_pool_bytes")
        pool_s = "n/a (emulated graphs)" if pool is None and mode != "eager" else (
            "-" if pool is None else _human_bytes(pool))
        lines.append(f"memory [{mode}]: metadata {_human_bytes(mem['metadata_bytes'])}, graph pool {pool_s}"
                     + (f", capture {mem['capture_s']} s" if "capture_s" in mem else ""))
    if not report["platform"].get("device", "").startswith("cuda"):
        lines.append("note: no GPU here: graphs are emulated (each replay re-runs its ops in Python), "
                     "so graph-mode times show emulator overhead, not device behaviour")
    for c in report["checks"]:
        lines.append(f"check [{c['mode']}, {c['rows']} rows]: {'ok' if c['ok'] else 'MISMATCH'} "
                     f"(max abs err {c['max_abs_err']:.2e}; atol {c['atol']}, rtol {c['rtol']})")
    return "\n".join(lines)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes must be a comma-separated subset of {MODES}, got {text!r}")
    return modes


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """The ``graphattn bench`` options (unset shape options take the platform's defaults)."""
    add_attn_backend_arg(parser)
    g = parser.add_argument_group("workload (defaults: realistic on a GPU, small on the CPU)")
    g.add_argument("--heads", type=int, help="query heads per row (GPU default 128)")
    g.add_argument("--topk", type=int, help="indices per row (GPU default 2048)")
    g.add_argument("--pool-tokens", type=int, help="KV pool tokens per layer (GPU default 262144)")
    g.add_argument("--batch-sizes", type=_int_list, help="rows per step, e.g. 1,2,4,8 (GPU default 1..128)")
    g.add_argument("--layers", type=int, help="model layers (GPU default 61)")
    g.add_argument("--measure-layers", type=int, help="layers materialised and timed (GPU default 4)")
    g.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="q/kv dtype")
    g.add_argument("--kv-dtype", choices=("auto", "bf16", "fp16", "fp8"), default="auto",
                   help="KV cache: auto or bf16/fp16 (q's dtype, [pool, 576]) or fp8 (656-byte FP8 "
                   "tokens; bytes counted at 656 per token)")
    g.add_argument("--seed", type=int, default=0, help="RNG seed")
    r = parser.add_argument_group("run")
    r.add_argument("--modes", type=_modes, default=MODES, help="comma-separated subset of eager,full,breakable")
    r.add_argument("--iters", type=int, help="timed steps per point (GPU default 20, CPU 3)")
    r.add_argument("--warmup", type=int, help="untimed steps per point (GPU default 3, CPU 1)")
    r.add_argument("--sanitize", action="store_true", help="check captured buffers before each replay")
    r.add_argument("--no-check", action="store_true", help="skip the comparison with the reference")
    r.add_argument("--peak-bw", type=float, help="roofline bytes/s (default: per device)")
    r.add_argument("--peak-flops", type=float, help="roofline flop/s (default: per device)")
    r.add_argument("--json", metavar="PATH", help="also write the report as JSON")


def workload_from_args(args: argparse.Namespace, platform: Platform) -> DecodeWorkload:
    """The default workload of ``platform`` with the options given on the command line."""
    base = DecodeWorkload.default_for(platform)
    layers = args.layers or base.num_layers
    measure = args.measure_layers or min(base.measure_layers, layers)
    kv_arg = getattr(args, "kv_dtype", "auto")
    # --kv-dtype bf16/fp16 names the model dtype (a plain cache is in q's dtype): it sets q's
    # dtype unless --dtype does (then they must agree).
    dtype_name = args.dtype or {"bf16": "bfloat16", "fp16": "float16"}.get(kv_arg)
    dtype = getattr(torch, dtype_name) if dtype_name else base.dtype
    return DecodeWorkload(
        num_heads=args.heads or base.num_heads, topk=args.topk or base.topk,
        pool_tokens=args.pool_tokens or max(base.pool_tokens, args.topk or 0),
        batch_sizes=args.batch_sizes or base.batch_sizes, num_layers=layers, measure_layers=measure,
        dtype=dtype, seed=args.seed, kv_dtype=resolve_kv_dtype(kv_arg, dtype),
    )


def run_from_args(args: argparse.Namespace) -> int:
    """``graphattn bench``: 0 when every sampled output matches the reference, else 1."""
    platform = current_platform()
    try:
        wl = workload_from_args(args, platform)
    except ValueError as exc:
        print(f"graphattn bench: {exc}", file=sys.stderr)
        return 2
    gpu = platform.has_gpu
    iters = args.iters or (20 if gpu else 3)
    warmup = args.warmup if args.warmup is not None else (3 if gpu else 1)
    peaks = None
    if args.peak_bw or args.peak_flops:
        bw, fl, _ = platform_peaks(platform, wl.dtype)
        peaks = (args.peak_bw or bw, args.peak_flops or fl, "command line")
    report = run_bench(wl, args.attn_backend, args.modes, iters, warmup, sanitize=args.sanitize,
                       check=not args.no_check, peaks=peaks, platform=platform)
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        progress(f"wrote {args.json}")
    return 0 if report["ok"] else 1
