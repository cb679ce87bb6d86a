"""``graphattn bench --tp N``: the decode workload with its heads split over N tensor-parallel ranks.

Each rank is one process on one device (``cuda:<local rank>``, or the CPU) with its own backend
for ``heads / N`` heads, its own metadata and graphs, and the whole latent KV cache (MLA has one
KV head, so tensor-parallel ranks replicate it). Every measured layer is attention, then the
row-parallel output projection of this rank's heads (``out [rows, heads/N * 512] @ W_o`` rows of
those heads, into ``hidden`` columns: DeepSeek's o_proj) and an all-reduce (sum) of it over the
ranks, as in a tensor-parallel decode step:

* full mode: attention, projections and all-reduces are captured in one graph per bucket;
* breakable mode: attention is the eager break; each projection and all-reduce is captured in
  the segment after it.

Collectives in captured graphs (NCCL/RCCL's graph-safe usage): the process group is made and
warmed up by an eager all-reduce before any capture (NCCL creates its communicator on the first
collective, which must not happen inside a capture); every bucket is warmed up eagerly on the
capture stream before it is captured (:class:`GraphRunner` does); every rank captures and replays
the same collectives in the same order; the device of each rank is set before the group is made.
On the CPU the collectives run on gloo and the graph emulator replays them in order, waiting for
each one's ``Work`` as the captured caller did.

Ranks are spawned by the command (``torch.multiprocessing``, a ``file://`` rendezvous in a
temporary folder, no ports) or are the processes of a ``torchrun`` launch (``env://``;
``LOCAL_RANK`` picks the GPU). Rank 0 gathers every rank's report: the table shows the slowest
rank per point (what a tensor-parallel step costs), then each rank's time. Each rank checks its
attention output and the all-reduced projection against the float64 reference, and the
projection against a single-process run of all the heads (one backend with every head, on that
rank's device).

Teardown: every rank meets the others at a barrier after its last collective, then destroys its
group, on success and on error alike, and checks that the group is gone (:func:`destroy_group`):
its backend's threads and sockets must end there, while the interpreter is whole, not in the
destructors that run at its exit (gloo then aborted rank 0 with "terminate called without an
active exception" after the report was complete: 2 of 40 CPU runs on two loaded cores).
``torch.distributed.nn.functional`` is imported before the group is made (:func:`init_group`):
it binds ``group.WORLD`` as a default argument of its functions when it is first imported, and
``torch._dynamo`` imports it on the first ``TorchDispatchMode`` (the CPU graph emulator's first
capture), which kept the default group alive past ``destroy_process_group()``.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib
import json
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..backends import resolve_backend
from ..backends.base import kv_kwargs
from ..common.metadata import D_V
from ..common.platform import Platform, current_platform
from ..common.reference import sparse_mla_reference
from ..common.tolerances import Tolerance, tolerance
from ..graphs import sanitize_enabled
from .decode import CHECK_ROWS, ModeBench, format_report, is_out_of_memory, nan_max, new_report, platform_peaks
from .decode import run_modes, set_progress_tag
from .options import BenchRequest
from .workload import DecodeWorkload, make_generator

HIDDEN_GPU = 7168  # DeepSeek-V3's hidden size: the all-reduce moves [rows, 7168] per layer
HIDDEN_CPU = 64  # small enough for the interpreter and gloo


def hidden_size(platform: Platform) -> int:
    """Columns of the output projection that is all-reduced (realistic on a GPU, small on the CPU)."""
    return HIDDEN_GPU if platform.has_gpu else HIDDEN_CPU


def dist_backend(platform: Platform) -> str:
    """``nccl`` on GPUs (ROCm's torch runs RCCL under that name), ``gloo`` on the CPU."""
    return "nccl" if platform.has_gpu else "gloo"


def under_torchrun() -> bool:
    """True when this process is one rank of a ``torchrun`` launch (``RANK``, ``WORLD_SIZE`` set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def bind_local_rank() -> None:
    """Under torchrun, make ``cuda:LOCAL_RANK`` current before anything touches a GPU, so that
    no rank opens a context on ``cuda:0`` for nothing."""
    if under_torchrun() and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))


def projection(wl: DecodeWorkload, layer: int, device: torch.device, hidden: int) -> torch.Tensor:
    """The whole ``W_o`` of measured layer ``layer``: ``[num_heads * 512, hidden]`` in the
    workload's dtype, std ``1/sqrt(num_heads * 512)`` (projected values are of the size of the
    attention output); seeded, so every rank and the single-process check make the same one."""
    k = wl.num_heads * D_V
    gen = make_generator(device, wl.seed + 5000 + layer)
    return (torch.randn(k, hidden, generator=gen, device=device) * k**-0.5).to(wl.dtype)


class TPModeBench(ModeBench):
    """One mode on one rank: its heads' attention, the projection of its heads and an all-reduce
    per layer. ``wl`` is the rank's workload (``heads / tp`` heads), ``full_wl`` the model's."""

    def __init__(self, mode: str, *, backend, wl: DecodeWorkload, kv: list[torch.Tensor], platform: Platform,
                 sanitize: bool | None, rank: int, full_wl: DecodeWorkload, weights: list[torch.Tensor], hidden: int):
        # Set before ModeBench builds the step and the static inputs from them.
        self.rank, self.full_wl, self.weights, self.hidden = rank, full_wl, weights, hidden
        self.head0 = rank * wl.num_heads  # this rank's first head
        super().__init__(mode, backend, wl, kv, platform, sanitize)

    def make_q(self, rows: int, gen: torch.Generator) -> list[torch.Tensor]:
        """This rank's heads of the model's q (the same seed on every rank), contiguous."""
        return [self._heads(q) for q in self.full_wl.make_q(rows, self.platform.device, gen)]

    def _heads(self, q: torch.Tensor) -> torch.Tensor:
        return q[:, self.head0:self.head0 + self.wl.num_heads].contiguous()

    def make_step(self, attention: Callable[..., Any]) -> Callable[..., tuple[torch.Tensor, ...]]:
        """Per layer: attention ``[rows, heads/tp, 512]``, then ``y [rows, hidden]``, this rank's
        share of the projection summed over the ranks. Returns ``(out0, y0, out1, y1, ...)``."""
        def step(**qs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            outs: list[torch.Tensor] = []
            for i, kv_i in enumerate(self.kv):
                out = attention(qs[f"q{i}"], kv_i, self.metadata)[0]  # [rows, heads/tp, 512]
                y = out.reshape(out.shape[0], -1) @ self.weights[i]  # [rows, hidden] partial sum
                dist.all_reduce(y)  # captured: in the graph (full), in the segment after the break
                outs += [out, y]
            return tuple(outs)

        return step

    def time_step(self, rows: int, iters: int, warmup: int, window: int) -> list[float]:
        """:meth:`ModeBench.time_step`, with every rank starting the point together."""
        dist.barrier()
        return super().time_step(rows, iters, warmup, window)

    def agree_steps(self, steps: int) -> int:
        """The most warm-up steps any rank wants: every rank runs that many, so that their
        collectives stay paired (a time-based count differs between ranks and hangs NCCL)."""
        n = torch.tensor([steps], dtype=torch.int64, device=self.platform.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        return int(n.item())

    def check(self, rows: int) -> dict[str, Any]:
        """This rank's attention and all-reduced projection (first and last measured layers,
        first rows) against the float64 reference, and the projection against one backend
        running every head in this process."""
        dev = self.platform.device
        q_full = self.full_wl.make_q(rows, dev, make_generator(dev, self.wl.seed + 1000 + rows))
        indices = self._indices(rows, self.wl.seed + 2000 + rows)
        outs = self.run([self._heads(q) for q in q_full], indices)
        tol, n = tolerance(self.wl.dtype, self.wl.kv_dtype), min(rows, CHECK_ROWS)
        layers = sorted({0, len(self.kv) - 1})
        single = self._single_process(q_full, indices, layers)
        worst = {"attention": 0.0, "projection": 0.0, "single_process": 0.0}
        ok = True
        for layer in layers:
            ref, _ = sparse_mla_reference(q_full[layer][:n], self.kv[layer], indices[:n], self.backend.sm_scale,
                                          fp8_dtype=self.platform.fp8_dtype)  # [n, heads, 512] f64
            y_ref = ref.reshape(n, -1) @ projection(self.full_wl, layer, dev, self.hidden).double()
            y_tol = projection_tolerance(tol, ref)
            lo, hi = self.head0, self.head0 + self.wl.num_heads
            for name, got, want, (atol, rtol) in (
                ("attention", outs[2 * layer][:n], ref[:, lo:hi], (tol.atol, tol.rtol)),
                ("projection", outs[2 * layer + 1][:n], y_ref, y_tol),
                ("single_process", outs[2 * layer + 1][:n], single[layer][:n].double(), y_tol),
            ):
                err = (got.double() - want).abs()
                ok &= bool((err <= atol + rtol * want.abs()).all())
                worst[name] = nan_max(worst[name], float(err.max()))
        return {"mode": self.mode, "rows": rows, "rank": self.rank, "ok": ok, "max_abs_err": worst["attention"],
                "atol": tol.atol, "rtol": tol.rtol, "projection_max_abs_err": worst["projection"],
                "single_process_max_abs_err": worst["single_process"]}

    def _single_process(self, q_full: list[torch.Tensor], indices: torch.Tensor,
                        layers: list[int]) -> dict[int, torch.Tensor]:
        """``{layer: y [rows, hidden]}`` from one backend with every head, eagerly, here."""
        heads, wl = self.full_wl.num_heads, self.full_wl
        cls = type(self.backend)
        if cls.refusal_reasons(heads, wl.dtype, wl.topk, self.platform, **kv_kwargs(wl.kv_dtype)):
            cls = resolve_backend("auto", heads, wl.dtype, wl.topk, self.platform, wl.kv_dtype)
        backend = cls(heads, wl.topk, wl.dtype, platform=self.platform, **kv_kwargs(wl.kv_dtype))
        metadata = backend.make_metadata(indices.shape[0])
        backend.plan(metadata, indices)
        ys = {}
        for layer in layers:
            out = backend.forward(q_full[layer], self.kv[layer], metadata)[0]
            ys[layer] = out.reshape(out.shape[0], -1) @ projection(wl, layer, self.platform.device, self.hidden)
        return ys


def projection_tolerance(tol: Tolerance, ref_out: torch.Tensor) -> tuple[float, float]:
    """``(atol, rtol)`` of a projected, all-reduced value: the projection mixes every head's
    output error into each value at unit gain (the weights' std is ``1/sqrt(inputs)``), so the
    attention tolerance at the largest output's size; twice the rtol for the rounding of each
    rank's partial sum before the all-reduce."""
    return tol.atol + tol.rtol * float(ref_out.abs().max()), 2 * tol.rtol


# -- one rank -------------------------------------------------------------------------------------
def run_rank(req: BenchRequest, platform: Platform, rank: int, tp: int) -> dict[str, Any]:
    """This rank's report (as :func:`graphattn.bench.decode.run_bench`'s, for ``heads / tp``
    heads, plus ``rank`` and ``device``); the process group is already made."""
    wl = req.workload
    heads = wl.num_heads // tp
    wl_rank = dataclasses.replace(wl, num_heads=heads)
    cls = resolve_backend(req.backend, heads, wl.dtype, wl.topk, platform, wl.kv_dtype)
    backend = cls(heads, wl.topk, wl.dtype, platform=platform, **kv_kwargs(wl.kv_dtype))
    peaks = req.peaks or platform_peaks(platform, wl.dtype)
    window = min(req.window, req.iters)
    report = new_report(cls, req.backend, platform, wl_rank, req.iters, req.warmup, window, peaks)
    report.update(rank=rank, device=str(platform.device), sanitize=sanitize_enabled(req.sanitize))
    dev, hidden = platform.device, hidden_size(platform)
    kv = wl.make_kv(dev, make_generator(dev, wl.seed))  # the same seed: every rank holds the whole cache
    weights = [projection(wl, i, dev, hidden).narrow(0, rank * heads * D_V, heads * D_V).contiguous()
               for i in range(wl.measure_layers)]  # [heads/tp * 512, hidden]: this rank's rows of W_o
    new_bench = functools.partial(TPModeBench, backend=backend, wl=wl_rank, kv=kv, platform=platform,
                                  sanitize=req.sanitize, rank=rank, full_wl=wl, weights=weights, hidden=hidden)
    run_modes(report, new_bench, wl_rank, req.modes, req.iters, req.warmup, window, peaks, req.check)
    report["ok"] = all(c["ok"] for c in report["checks"])
    return report


def run_rank_process(rank: int, local_rank: int, world: int, init: str, req: BenchRequest,
                     launcher: str, failure_note: str | None = None) -> dict[str, Any] | None:
    """Make the process group, run this rank, gather every rank's report; returns the combined
    report on rank 0, ``None`` elsewhere. ``failure_note``: a file where an exception's time and
    traceback are written before the group is torn down (the launcher names the rank that
    failed first: the others fail after it, their collectives cut)."""
    set_progress_tag(f"graphattn bench rank {rank}")
    platform, device = current_platform(), None
    if platform.has_gpu:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # NCCL binds its communicator (and all_gather_object) to it
        platform = platform.on_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the ranks share the cores
    backend = dist_backend(platform)
    init_group(backend, init, rank, world, device)
    done = False
    try:
        # The first collective creates NCCL's communicator: never inside a capture.
        dist.all_reduce(torch.zeros(1, device=platform.device))
        platform.synchronize()
        report = run_rank(req, platform, rank, world)
        reports: list[Any] = [None] * world
        dist.all_gather_object(reports, report)
        # Every rank past its last collective before any rank tears its group down (a peer's
        # closed sockets must not meet a collective still in flight here).
        dist.barrier()
        done = True
    except Exception:
        if failure_note:
            _write_failure_note(failure_note)
        raise
    finally:
        # After an error the exception's frames hold the group: no warning about that then.
        destroy_group(rank, warn=done)
    if rank != 0:
        return None
    return combine_reports(reports, req, {"world_size": world, "dist_backend": backend, "launcher": launcher})


# Modules that bind ``group.WORLD`` (the default group, or ``None`` before there is one) as a
# default argument when they are first imported: imported after ``init_process_group`` they hold
# the group for good. ``torch._dynamo`` imports this one lazily (through torch.distributed._shard),
# on the first ``TorchDispatchMode`` of the process: the CPU graph emulator's first capture.
GROUP_DEFAULT_MODULES = ("torch.distributed.nn.functional",)


def init_group(backend: str, init: str, rank: int, world: int, device: torch.device | None) -> None:
    """``dist.init_process_group``, after importing :data:`GROUP_DEFAULT_MODULES` (so that their
    defaults bind ``None``, not the group that :func:`destroy_group` must free)."""
    for name in GROUP_DEFAULT_MODULES:
        importlib.import_module(name)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, device_id=device)


def destroy_group(rank: int, warn: bool = True) -> bool:
    """``dist.destroy_process_group()``, then check that it freed the default group (its backend
    joins its threads and closes its sockets then, while the interpreter is whole). A group that
    something still holds lives on until the interpreter's exit tears it down, which gloo survives
    only by luck (an abort, "terminate called without an active exception"): that is said on
    stderr (unless ``warn`` is False: a rank failing, whose traceback holds the group). Returns
    True when the group is gone."""
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    gc.collect()
    if group() is None:
        return True
    if not warn:
        return False
    print(f"graphattn bench rank {rank}: warning: the process group outlived destroy_process_group() "
          f"(still held by {_holders(group())}); its threads and sockets end only at interpreter exit",
          file=sys.stderr, flush=True)
    return False


def _holders(obj: Any) -> str:
    """What refers to ``obj``: the gc-tracked referrers' types and its reference count (function
    defaults hold it in tuples the gc does not track)."""
    kinds = sorted({type(r).__name__ for r in gc.get_referrers(obj)} - {"frame"})
    n = sys.getrefcount(obj) - 2  # less getrefcount's argument and the caller's
    return f"{n} reference{'s' * (n != 1)}; tracked referrers: {', '.join(kinds) or 'none'}"


def _write_failure_note(path: str) -> None:
    import traceback

    try:
        with open(path, "w") as f:
            json.dump({"time_ns": time.time_ns(), "traceback": traceback.format_exc()}, f)
    except OSError:
        pass  # the launcher falls back to what torch reports


def _failure_note(result_path: str, rank: int) -> str:
    return os.path.join(os.path.dirname(result_path), f"failed-rank{rank}.json")


def _spawned(rank: int, req: BenchRequest, init: str, result_path: str) -> None:
    report = run_rank_process(rank, rank, req.tp, init, req, "spawn", _failure_note(result_path, rank))
    if report is not None:
        with open(result_path, "w") as f:
            json.dump(report, f)


class RankFailed(RuntimeError):
    """A spawned rank raised (``summary``: its exception's last line; ``details``: its
    traceback) or died (``summary``: its signal or exit code)."""

    def __init__(self, rank: int, summary: str, details: str = ""):
        super().__init__(f"rank {rank} failed: {summary}")
        self.rank, self.summary, self.details = rank, summary, details

    @property
    def out_of_memory(self) -> bool:
        """True when the rank ran out of (device or host) memory."""
        return is_out_of_memory(self.summary)


class Interrupted(Exception):
    """The launcher got SIGINT or SIGTERM; the ranks were stopped (``signal_name``)."""

    def __init__(self, signal_name: str, ranks: int):
        super().__init__(f"interrupted by {signal_name}: stopped {ranks} rank{'s' * (ranks != 1)}")
        self.signal_name = signal_name


STOP_GRACE_S = 5.0  # after SIGTERM, how long the ranks get before SIGKILL
_log = logging.getLogger(__name__)


def run_tp(req: BenchRequest) -> dict[str, Any] | None:
    """Run ``req`` on ``req.tp`` ranks: spawned here, or this process's rank under torchrun.

    Returns the combined report (:func:`combine_reports`) where rank 0 runs or was spawned;
    ``None`` in the other torchrun ranks.

    Raises:
        RankFailed: a spawned rank raised or died (the others are stopped).
        Interrupted: SIGINT or SIGTERM reached this process: the spawned ranks are terminated
            (then killed after :data:`STOP_GRACE_S`) and the temporary folder removed.
    """
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return run_rank_process(rank, int(os.environ.get("LOCAL_RANK", rank)), world, "env://", req, "torchrun")
    child = dataclasses.replace(req, platform=None)  # each process resolves its own platform
    with tempfile.TemporaryDirectory(prefix="graphattn-tp-") as tmp:
        result = os.path.join(tmp, "report.json")
        notes = [_failure_note(result, r) for r in range(req.tp)]
        _spawn_and_join(req.tp, (child, f"file://{os.path.join(tmp, 'rendezvous')}", result), notes)
        with open(result) as f:
            return json.load(f)


def _spawn_and_join(nprocs: int, args: tuple, notes: list[str]) -> None:
    """Start the ranks and wait for them (see :func:`run_tp`'s exceptions): ``mp.spawn`` with
    ``join=True`` left its non-daemon ranks running when the launcher alone was interrupted."""
    def on_sigterm(signum: int, frame: Any) -> None:
        raise Interrupted("SIGTERM", 0)

    main_thread = threading.current_thread() is threading.main_thread()  # signal.signal works there only
    old_handlers = {}
    if main_thread:
        old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        signal.signal(signal.SIGTERM, on_sigterm)
    # torch logs "Terminating process N via signal SIGTERM" for each rank it stops after a
    # failure: the one line of RankFailed says what happened.
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    old_level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)
    context = None
    try:
        context = mp.start_processes(_spawned, args=args, nprocs=nprocs, join=False, start_method="spawn")
        while not context.join(timeout=1.0):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        raise _rank_failure(context, exc, notes) from None
    except (KeyboardInterrupt, Interrupted) as exc:
        name = exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"
        procs = context.processes if context is not None else multiprocessing.active_children()
        if main_thread:  # a second signal must not cut the stopping short
            for sig in old_handlers:
                signal.signal(sig, signal.SIG_IGN)
        _stop(procs)
        raise Interrupted(name, len(procs)) from None
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        spawn_log.setLevel(old_level)
        for path in (context.error_files if context is not None else []):
            if os.path.exists(path):
                os.unlink(path)


def _stop(procs: list) -> None:
    """SIGTERM every live process, SIGKILL those still alive after :data:`STOP_GRACE_S`."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def _rank_failure(context: Any, exc: Exception, notes: list[str]) -> RankFailed:
    """The rank that failed first: a rank that died without an exception (its signal or exit
    code: killed, or the out-of-memory killer), else the earliest of the failure notes the ranks
    wrote (a rank's peers fail after it, their collectives cut), else of torch's error files."""
    if isinstance(exc, mp.ProcessExitedException) and not os.path.exists(notes[exc.error_index]):
        how = f"killed by {exc.signal_name}" if exc.signal_name else f"exited with code {exc.exit_code}"
        return RankFailed(exc.error_index, how)
    written = []
    for rank, path in enumerate(notes):
        try:
            with open(path) as f:
                note = json.load(f)
            written.append((note["time_ns"], rank, note["traceback"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for rank, path in enumerate(context.error_files if context is not None and not written else []):
        try:
            with open(path, "rb") as fh:
                written.append((os.stat(path).st_mtime_ns, rank, pickle.load(fh)))
        except (OSError, EOFError, pickle.UnpicklingError):
            continue
    if written:
        _, rank, trace = min(written)
        lines = [line for line in str(trace).splitlines() if line.strip()]
        _log.debug("rank %d failed:\n%s", rank, trace)
        return RankFailed(rank, lines[-1].strip() if lines else "an exception", str(trace))
    if isinstance(exc, mp.ProcessExitedException):
        how = f"killed by {exc.signal_name}" if exc.signal_name else f"exited with code {exc.exit_code}"
        return RankFailed(exc.error_index, how)
    return RankFailed(getattr(exc, "error_index", -1), str(exc).strip().splitlines()[-1])


# -- the combined report --------------------------------------------------------------------------
def combine_reports(reports: list[dict[str, Any]], req: BenchRequest, tp: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's report with ``tp`` (world size, backends), ``ranks`` (every rank's report),
    ``results`` of the slowest rank per point (with its ``rank``) and every rank's checks."""
    first = reports[0]
    slowest = []
    for j, row in enumerate(first["results"]):
        rank = max(range(len(reports)), key=lambda r: reports[r]["results"][j]["layer_us"])
        slowest.append({**reports[rank]["results"][j], "rank": rank})
    per_rank = [{k: r[k] for k in ("rank", "device", "backend", "results", "checks", "memory", "ok")}
                for r in reports]
    return {**first, "workload": req.workload.as_dict(),
            "tp": {**tp, "heads_per_rank": req.workload.num_heads // len(reports),
                   "hidden": hidden_size_of(first)},
            "ranks": per_rank, "results": slowest, "checks": [c for r in reports for c in r["checks"]],
            "ok": all(r["ok"] for r in reports)}


def hidden_size_of(report: dict[str, Any]) -> int:
    """The projection width a rank's report was made with (from its device)."""
    return HIDDEN_GPU if report["device_numbers"] else HIDDEN_CPU


def format_tp_report(report: dict[str, Any]) -> str:
    """:func:`format_report` of the slowest rank per point, then each rank's time per layer."""
    tp = report["tp"]
    lines = [format_report(report),
             f"tensor parallel: {tp['world_size']} ranks ({tp['dist_backend']}, {tp['launcher']}), "
             f"{tp['heads_per_rank']} heads per rank; each layer: attention, o_proj of the rank's heads "
             f"into {tp['hidden']} columns, all-reduce. The table above is the slowest rank per point "
             "(its GB/s and roofline count one rank's heads). Checks: attention of the rank's heads, and the "
             "all-reduced projection against float64 and against one process running every head.",
             "us/layer per rank:"]
    ranks = report["ranks"]
    header = ("mode", "rows", *(f"rank {r['rank']} ({r['device']})" for r in ranks), "slowest")
    table = [header] + [
        (row["mode"], str(row["rows"]), *(f"{r['results'][j]['layer_us']:.1f}" for r in ranks),
         f"rank {row['rank']}")
        for j, row in enumerate(report["results"])
    ]
    widths = [max(len(t[i]) for t in table) for i in range(len(header))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(t, widths)) for t in table]
    return "\n".join(lines)
