"""``graphattn bench``: the decode workload through one backend in eager, full and breakable graphs.

For each mode and batch size it times a decode step of ``measure_layers`` layers (host ``plan``
plus device work; graphs via :class:`GraphRunner`, one bucket per batch size), checks a sample of
outputs against the float64 reference, and reports time per layer and per step (scaled to
``num_layers``), tokens/s, achieved GB/s and TFLOP/s, the fraction of the roofline floor
``max(bytes / peak_bw, flops / peak_flops)``, and the memory the graphs hold. Progress goes to
stderr; the table to stdout; ``--json PATH`` writes everything. Each point is the median over
samples of back-to-back steps (:func:`default_timing`); the command line is in
:mod:`graphattn.bench.options`.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import statistics
import sys
import time
from typing import Any, Callable

import torch

from ..backends import accepts_out, resolve_backend
from ..backends.base import kv_kwargs
from ..common.platform import Platform, current_platform
from ..common.reference import sparse_mla_reference
from ..common.tolerances import tolerance
from ..graphs import GraphRunner, eager_on_graph, sanitize_enabled
from .host import default_calls, default_repeats, host_cost
from .workload import H200_BYTES_PER_S, H200_FLOP_PER_S, DecodeWorkload, make_generator

MODES = ("eager", "full", "breakable")
CPU_NOTE = (
    "NOTE: CPU NUMBERS ARE NOT DEVICE NUMBERS. There is no GPU here: kernels run as torch CPU ops "
    "or in the Triton interpreter, graphs on graphattn's emulator (each replay re-runs its ops in "
    "Python), and other processes share the cores. The times say how this CPU ran the emulation, "
    "nothing about a GPU; the roofline is this CPU's measured copy/matmul rate, and a workload "
    "that fits in its caches can pass 100%."
)
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


_PROGRESS_TAG = ["graphattn bench"]  # "graphattn bench rank N" in a tensor-parallel rank


def progress(msg: str) -> None:
    """A progress line on stderr (stdout stays the report)."""
    print(f"[{_PROGRESS_TAG[0]}] {msg}", file=sys.stderr, flush=True)


def set_progress_tag(tag: str) -> None:
    """Label this process's progress lines (``graphattn bench rank 1``: ranks share stderr)."""
    _PROGRESS_TAG[0] = tag


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
                 platform: Platform, sanitize: bool | None):
        self.mode, self.backend, self.wl, self.kv, self.platform = mode, backend, wl, kv, platform
        self.metadata = backend.make_metadata(wl.max_rows)  # one metadata per runner
        # A break only in breakable mode; replays write into the captured outputs (no copy)
        # through the backend's replay call (its checks done once, at capture).
        out = "out" if accepts_out(backend.forward) else None
        self.step = self.make_step(eager_on_graph(backend.forward, out=out, bind=getattr(backend, "bind_break", None)))
        self.runner = None
        self.memory: dict[str, int] = {"metadata_bytes": self.metadata.nbytes()}
        if mode != "eager":
            gen = make_generator(platform.device, wl.seed + 1)
            static = {f"q{i}": q for i, q in enumerate(self.make_q(wl.max_rows, gen))}
            self.runner = GraphRunner(self.step, static, metadata=self.metadata, buckets=wl.batch_sizes,
                                      mode=mode, sanitize=sanitize, platform=platform,
                                      progress=self._on_capture)

    def make_step(self, attention: Callable[..., Any]) -> Callable[..., tuple[torch.Tensor, ...]]:
        """The step a runner captures: ``step(q0=..., q1=...)`` -> each measured layer's
        attention output ``[rows, heads, 512]`` (``attention``: the backend's forward, a break
        in breakable mode)."""
        def step(**qs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(attention(qs[f"q{i}"], kv_i, self.metadata)[0] for i, kv_i in enumerate(self.kv))

        return step

    def make_q(self, rows: int, gen: torch.Generator) -> list[torch.Tensor]:
        """One ``[rows, heads, 576]`` q per measured layer, on the platform's device."""
        return self.wl.make_q(rows, self.platform.device, gen)

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
        self.backend.plan(self.metadata, indices)  # the runner pads the plan to its bucket
        live = {f"q{i}": q for i, q in enumerate(qs)}
        return self.runner.run(**live) if self.runner is not None else self.step(**live)

    def time_step(self, rows: int, iters: int, warmup: int, window: int) -> list[float]:
        """Seconds per step at ``rows``, one sample per window of ``window`` steps (``iters``
        steps in all; two alternating index sets, so plan does real copies). In the graph modes
        each layer's q is written into the runner's static tensors first, so replays copy no
        input (``GraphRunner.run``).

        A window's steps run back to back (on a GPU the host runs ahead of the device, as in
        serving) and are timed together; the caller takes the median over windows, so a
        scheduler hiccup or a neighbour's burst moves one sample, not the result.
        """
        gen = make_generator(self.platform.device, self.wl.seed + 7 + rows)
        qs = self.make_q(rows, gen)
        if self.runner is not None:
            # Each layer's q where the graph reads it, as a model's q projection inside the graph
            # would leave it: the runner copies nothing (copying them cost 15-24 µs a step on the
            # H200, more than a 1-8 row layer's attention, which is not what this measures).
            qs = [self.runner.static[f"q{i}"].narrow(0, 0, rows).copy_(q) for i, q in enumerate(qs)]
        idx = [self._indices(rows, self.wl.seed + 100 + rows + i) for i in range(2)]
        # At least `warmup` steps and WARMUP_S seconds: an idle GPU needs time to reach its
        # clocks, and the first point would otherwise be measured slow. The count is fixed
        # before the steps run (from the first `warmup` of them), so that every rank of a
        # tensor-parallel run makes the same number of collectives.
        t0 = time.perf_counter()
        for i in range(warmup):
            self.run(qs, idx[i % 2])
        more = 0
        if self.platform.has_gpu:
            self.platform.synchronize()
            elapsed = time.perf_counter() - t0
            more = int(max(WARMUP_S - elapsed, 0.0) / max(elapsed / max(warmup, 1), 1e-6))
        for i in range(warmup, warmup + self.agree_steps(more)):
            self.run(qs, idx[i % 2])
        samples, done = [], 0
        while done < iters:
            n = min(window, iters - done)
            self.platform.synchronize()
            t0 = time.perf_counter()
            for i in range(done, done + n):
                self.run(qs, idx[i % 2])
            self.platform.synchronize()
            samples.append((time.perf_counter() - t0) / n)
            done += n
        return samples

    def agree_steps(self, steps: int) -> int:
        """How many more warm-up steps to run, given this process's wish (one process: it)."""
        return steps

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
            worst = nan_max(worst, float(err.max()))
        return {"mode": self.mode, "rows": rows, "ok": ok, "max_abs_err": worst,
                "atol": tol.atol, "rtol": tol.rtol}


_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "outofmemoryerror",
             "memoryerror", "not enough memory")


def is_out_of_memory(error: BaseException | str) -> bool:
    """True for an allocation failure: ``torch.OutOfMemoryError``, ``MemoryError``, or an
    allocator's ``RuntimeError`` (``DefaultCPUAllocator: can't allocate memory``, ``CUDA out of
    memory``, HIP's); a string is an exception's text (a spawned rank's last line)."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(error) if isinstance(error, RuntimeError) else error if isinstance(error, str) else ""
    text = text.lower()
    return any(t in text for t in _OOM_TEXT)


def nan_max(a: float, b: float) -> float:
    """``max(a, b)`` where a NaN wins: Python's ``max(0.0, nan)`` is ``0.0``, which reported a
    NaN-returning backend's error as 0 (its check still failed: NaN is never within tolerance)."""
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


# -- the whole run --------------------------------------------------------------------------------
def result_row(wl: DecodeWorkload, mode: str, rows: int, samples: list[float], peaks: tuple) -> dict[str, Any]:
    """Derived figures of one point from the median of ``samples`` (seconds per step of
    ``measure_layers`` layers); the spread of the samples is kept beside it."""
    layer_s = statistics.median(samples) / wl.measure_layers
    nbytes, flops = wl.bytes_per_layer(rows), wl.flops_per_layer(rows)
    floor = max(nbytes / peaks[0], flops / peaks[1])
    return {
        "mode": mode, "rows": rows, "layer_us": layer_s * 1e6,
        "layer_us_min": min(samples) / wl.measure_layers * 1e6,
        "layer_us_max": max(samples) / wl.measure_layers * 1e6, "samples": len(samples),
        "step_ms": layer_s * wl.num_layers * 1e3,
        "tokens_per_s": rows / (layer_s * wl.num_layers),
        "gb_per_s": nbytes / layer_s / 1e9, "tflop_per_s": flops / layer_s / 1e12,
        "roofline_fraction": floor / layer_s,
    }


def default_timing(platform: Platform) -> dict[str, int]:
    """``iters`` (timed steps per point), ``warmup`` and ``window`` (steps per sample) here.

    A GPU times windows of 10 back-to-back steps (5 samples); the CPU times every step on its
    own (15 samples), where one step takes milliseconds and its neighbours' load varies.
    """
    if platform.has_gpu:
        return {"iters": 50, "warmup": 3, "window": 10}
    return {"iters": 15, "warmup": 2, "window": 1}


def run_bench(wl: DecodeWorkload, backend_name: str, modes: tuple[str, ...], iters: int, warmup: int,
              sanitize: bool | None = None, check: bool = True, peaks: tuple | None = None,
              platform: Platform | None = None, window: int | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (see ``--json``).

    Each point is the median over samples of ``window`` steps (``iters`` steps in all; the
    platform's default window when ``None``). ``sanitize``: check the graphs' borrowed buffers
    before each replay; ``None`` leaves it to ``GRAPHATTN_SANITIZE`` (off when unset).
    """
    platform = platform or current_platform()
    cls = resolve_backend(backend_name, wl.num_heads, wl.dtype, wl.topk, platform, wl.kv_dtype)
    backend = cls(wl.num_heads, wl.topk, wl.dtype, platform=platform, **kv_kwargs(wl.kv_dtype))
    peaks = peaks or platform_peaks(platform, wl.dtype)
    progress(f"backend {cls.name} on {platform.name}; {wl.as_dict()}")
    for note in cls.notes(platform):
        progress(f"note: {note}")
    kv = wl.make_kv(platform.device, make_generator(platform.device, wl.seed))
    window = min(window or default_timing(platform)["window"], iters)
    report = new_report(cls, backend_name, platform, wl, iters, warmup, window, peaks)
    report["sanitize"] = sanitize_enabled(sanitize)  # --sanitize or GRAPHATTN_SANITIZE
    new_bench = functools.partial(ModeBench, backend=backend, wl=wl, kv=kv, platform=platform, sanitize=sanitize)
    host = functools.partial(_host_costs, backend, wl, kv[0], platform)
    run_modes(report, new_bench, wl, modes, iters, warmup, window, peaks, check, host)
    report["ok"] = all(c["ok"] for c in report["checks"])
    return report


def new_report(cls: type, backend_name: str, platform: Platform, wl: DecodeWorkload, iters: int, warmup: int,
               window: int, peaks: tuple) -> dict[str, Any]:
    """A report with its header filled in and empty ``results``, ``checks``, ``memory``, ``host``."""
    return {"backend": cls.name, "requested": backend_name, "platform": platform.describe(),
            "device_numbers": platform.has_gpu,
            "timing": {"iters": iters, "warmup": warmup, "window": window,
                       "samples": -(-iters // window), "statistic": "median over samples"},
            "workload": wl.as_dict(), "capabilities": cls.capabilities(platform),
            "peaks": {"bytes_per_s": peaks[0], "flop_per_s": peaks[1], "source": peaks[2]},
            "results": [], "checks": [], "memory": {}, "host": []}


def run_modes(report: dict[str, Any], new_bench: Callable[[str], ModeBench], wl: DecodeWorkload,
              modes: tuple[str, ...], iters: int, warmup: int, window: int, peaks: tuple, check: bool,
              host: Callable[[], list[dict[str, Any]]] | None = None) -> None:
    """Capture, time and check each mode (``new_bench(mode)``), appending to ``report``'s
    ``results``, ``checks``, ``memory`` and (eager, when ``host`` is given) ``host``."""
    for mode in modes:
        bench = new_bench(mode)
        platform = bench.platform
        if mode != "eager":
            progress(f"{mode}: capturing {len(wl.batch_sizes)} buckets x {wl.measure_layers} layers")
        bench.capture()
        report["memory"][mode] = bench.memory
        for rows in wl.batch_sizes:
            row = result_row(bench.wl, mode, rows, bench.time_step(rows, iters, warmup, window), peaks)
            report["results"].append(row)
            progress(f"{mode}: {rows} rows: {row['layer_us']:.1f} us/layer (median of {row['samples']})")
        if check:
            for rows in sorted({min(wl.batch_sizes), max(wl.batch_sizes)}):
                report["checks"].append(bench.check(rows))
        if mode == "eager" and host is not None:
            report["host"].extend(host())
        del bench
        gc.collect()  # the runner's progress callback makes a cycle; free its graphs now
        platform.empty_cache()


def _host_costs(backend, wl: DecodeWorkload, kv: torch.Tensor, platform: Platform) -> list[dict[str, Any]]:
    return [host_cost(backend, wl, kv, rows, platform, default_calls(platform), repeats=default_repeats(platform))
            for rows in wl.batch_sizes]


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
    timing = report.get("timing")
    if timing:
        lines.append(f"each point: median of {timing['samples']} samples of {timing['window']} step(s) "
                     f"({timing['iters']} timed steps after {timing['warmup']} warm-up steps)")
    if not report.get("device_numbers", True):
        lines.append(CPU_NOTE)
    header = ("mode", "rows", "us/layer", "min..max", "ms/step", "tokens/s", "GB/s", "TFLOP/s", "roofline")
    table = [header] + [
        (r["mode"], str(r["rows"]), f"{r['layer_us']:.1f}",
         f"{r.get('layer_us_min', r['layer_us']):.0f}..{r.get('layer_us_max', r['layer_us']):.0f}",
         f"{r['step_ms']:.3f}",
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
            "-" if pool is None else human_bytes(pool))
        lines.append(f"memory [{mode}]: metadata {human_bytes(mem['metadata_bytes'])}, graph pool {pool_s}"
                     + (f", capture {mem['capture_s']} s" if "capture_s" in mem else ""))
    for c in report["checks"]:
        where = f"rank {c['rank']}, " if "rank" in c else ""
        tp = (f"; projection {c['projection_max_abs_err']:.2e} vs float64, "
              f"{c['single_process_max_abs_err']:.2e} vs one process" if "projection_max_abs_err" in c else "")
        lines.append(f"check [{where}{c['mode']}, {c['rows']} rows]: {'ok' if c['ok'] else 'MISMATCH'} "
                     f"(max abs err {c['max_abs_err']:.2e}; atol {c['atol']}, rtol {c['rtol']}{tp})")
    return "\n".join(lines)


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by the string ``"nan"``, ``"inf"`` or
    ``"-inf"`` (JSON has no NaN or Infinity; ``float()`` reads the strings back)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def report_json(report: Any) -> str:
    """``report`` as strict JSON text (non-finite floats as strings: :func:`json_safe`)."""
    return json.dumps(json_safe(report), indent=2, allow_nan=False, default=str)


def write_report(path: str, report: Any) -> None:
    """Write :func:`report_json` of ``report`` to ``path`` (serialised first, so that a report
    that cannot be serialised leaves no partial file).

    Raises:
        OSError: the file cannot be written (a full disk, a path that went away).
    """
    text = report_json(report)
    with open(path, "w") as f:
        f.write(text)
        f.write("\n")


def human_bytes(n: float) -> str:
    """``n`` bytes for a person: ``512 B``, ``2.0 KiB``, ``35.0 MiB``, ``1.25 GiB``, ``2.00 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            break
        n /= 1024
    else:
        unit = "TiB"
    digits = 0 if unit == "B" else 1 if unit in ("KiB", "MiB") else 2
    return f"{n:.{digits}f} {unit}"
