"""Run fuzz cases so that one crash never hides the next, and the ``fuzz`` command line.

Each case goes to a worker process (``python -m graphattn.testing.fuzz_runner --worker``) over a
pipe; the worker answers with one JSON line. A worker whose device context is lost (an illegal
memory access is sticky: every later CUDA call fails) reports the case as ``crash`` and exits;
a worker that dies or hangs is killed and the case in flight is a ``crash`` with the tail of its
stderr. The next case gets a fresh worker. Under ``compute-sanitizer --target-processes all``
every worker is checked.

Usage::

    python -m graphattn.testing.fuzz_runner --cases 500 --json fuzz.json         # every backend
    python -m graphattn.testing.fuzz_runner --regression --backends flashmla     # issue 10's shapes
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterable

from .fuzz import CPU, GPU, CaseResult, FuzzCase, Summary, draw_cases, regression_cases, run_case

BUILTIN = ("dispatch", "flashmla", "trtllm", "flashmla_mega", "torch")


class _Worker:
    """One worker process: a request pipe (stdin), an answer pipe (its own fd), stderr in a file."""

    def __init__(self, env: dict[str, str] | None):
        read_fd, write_fd = os.pipe()
        self.stderr = tempfile.TemporaryFile(mode="w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "graphattn.testing.fuzz_runner", "--worker", str(write_fd)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.stderr,
            pass_fds=(write_fd,), env=env, text=True,
        )
        os.close(write_fd)
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(os.fdopen(read_fd),), daemon=True).start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.answers.put(line)
        self.answers.put(None)  # the worker is gone

    def ask(self, case: FuzzCase, timeout: float) -> dict | None:
        """The worker's answer for ``case``, or ``None`` if it died or timed out."""
        try:
            self.proc.stdin.write(json.dumps(case.to_json()) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            # The pipe closed because the worker is dying; reap it, so that the caller reads its
            # exit code (not "timed out") and all of its stderr. Under load the exit status can
            # lag the end of the pipe.
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            return None
        return json.loads(line)

    def stderr_tail(self, chars: int = 1500) -> str:
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def run_cases(
    cases: Iterable[FuzzCase],
    isolate: bool = True,
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    jobs: int = 1,
    deadline: float | None = None,
) -> Summary:
    """Run every case; returns the :class:`Summary`.

    ``deadline`` (a ``time.perf_counter()`` value): no case is started after it; the cases
    already running finish and are counted (a time-boxed sweep still reports what it did).

    ``isolate=False`` runs them in this process (the CPU interpreter cannot lose a device
    context): an exception is the case's ``error``. With ``isolate``, ``jobs`` workers run
    cases side by side (kernel compiles are CPU-bound; the GPU is shared), each replaced after
    a crash; ``on_result`` is called from one thread at a time.
    """
    summary = Summary()
    todo: queue.Queue = queue.Queue()
    for case in cases:
        todo.put(case)
    lock = threading.Lock()

    def record(result: CaseResult) -> None:
        with lock:
            summary.add(result)
            if on_result:
                on_result(result)

    if not isolate:
        while not todo.empty() and not _past(deadline):
            record(_run_here(todo.get()))
        return summary
    threads = [threading.Thread(target=_drain, args=(todo, timeout, env, record, deadline))
               for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


def _drain(todo: queue.Queue, timeout: float, env, record: Callable[[CaseResult], None],
           deadline: float | None = None) -> None:
    """One worker slot: take cases until none is left (or the deadline passed), replacing the
    worker after a crash."""
    worker = None
    try:
        while not _past(deadline):
            try:
                case = todo.get_nowait()
            except queue.Empty:
                return
            worker = worker or _Worker(env)
            t0 = time.perf_counter()
            answer = worker.ask(case, timeout)
            if answer is None:
                why = "timed out" if worker.proc.poll() is None else f"exit code {worker.proc.poll()}"
                result = CaseResult(case, "crash", f"{case.label}: worker {why}:\n{worker.stderr_tail()}",
                                    seconds=time.perf_counter() - t0)
            else:
                result = CaseResult.from_json(answer)
            if answer is None or result.status == "crash":
                worker.proc.kill()
                worker.close()
                worker = None
            record(result)
    finally:
        if worker is not None:
            worker.close()


def _run_here(case: FuzzCase) -> CaseResult:
    try:
        return run_case(case)
    except Exception as e:  # noqa: BLE001 - every failure is a result
        return CaseResult(case, _status_after(e), f"{case.label}: {type(e).__name__}: {e}")


def _status_after(e: Exception) -> str:
    """``crash`` when the device context is lost (CUDA errors are sticky), else ``error``."""
    import torch

    if not torch.cuda.is_available():
        return "error"
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return "error"
    except Exception:  # noqa: BLE001
        return "crash"


def _worker_main(answer_fd: int) -> int:
    answers = os.fdopen(answer_fd, "w")
    for line in sys.stdin:
        result = _run_here(FuzzCase.from_json(json.loads(line)))
        answers.write(json.dumps(result.to_json()) + "\n")
        answers.flush()
        if result.status == "crash":
            return 1
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m graphattn.testing.fuzz_runner",
                                description="Fuzz attention backends against the float64 reference.")
    p.add_argument("--backends", default=",".join(BUILTIN), help="comma-separated backend names")
    p.add_argument("--cases", type=int, default=100, help="random cases per backend")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--regression", action="store_true", help="issue 10's shapes instead of random ones")
    p.add_argument("--limits", choices=("gpu", "cpu"), default=None,
                   help="shape ranges (default: gpu on a GPU, cpu under the interpreter)")
    p.add_argument("--max-work", type=int, default=None, help="cap on rows x heads x topk per case")
    p.add_argument("--kv-dtype", choices=("auto", "fp8", "both"), default="auto",
                   help="KV layout of the cases: auto (q's dtype), fp8 (656-byte FP8 tokens), or both drawn")
    p.add_argument("--no-isolate", action="store_true", help="run cases in this process")
    p.add_argument("--jobs", type=int, default=1, help="worker processes side by side")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case before a crash is declared")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds after which no new case starts (the counts of those run are printed)")
    p.add_argument("--json", default=None, help="write every result, then the counts, here (JSON lines)")
    p.add_argument("--quiet", action="store_true", help="print failures only")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("cases", "timeout", "jobs"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0, got {getattr(args, name)}")
    if args.time_limit is not None and args.time_limit < 0:
        p.error(f"--time-limit must be >= 0, got {args.time_limit}")
    return args


def main(argv: list[str] | None = None) -> int:
    """The command line; exit status 0 only when no case was wrong, errored or crashed."""
    args = _parse(argv)
    if args.worker is not None:
        return _worker_main(args.worker)
    import dataclasses

    import torch

    backends = [b for b in args.backends.split(",") if b]
    limits = GPU if (args.limits or ("gpu" if torch.cuda.is_available() else "cpu")) == "gpu" else CPU
    if args.max_work:
        limits = dataclasses.replace(limits, max_work=args.max_work)
    if args.kv_dtype != "auto":
        limits = dataclasses.replace(limits, kv_dtypes=("auto", "fp8") if args.kv_dtype == "both" else ("fp8",))
    cases = regression_cases(backends, seeds=(1, 2)) if args.regression else draw_cases(backends, args.cases, args.seed, limits)
    results: list[CaseResult] = []
    t0 = time.perf_counter()
    # JSON lines, one result each as it comes (a run stopped by a time limit keeps what it did),
    # then one line with the counts.
    log = open(args.json, "w") if args.json else None

    def report(r: CaseResult) -> None:
        results.append(r)
        if log:
            log.write(json.dumps(r.to_json()) + "\n")
            log.flush()
        if r.status not in ("ok", "refused") or not args.quiet:
            print(f"[{len(results)}/{len(cases)}] {r.status:7s} {r.case.label} [{r.kernel}] "
                  f"out_err={r.out_err:.3g} {r.seconds:.2f}s" + (f"\n    {r.message}" if r.status != "ok" else ""),
                  flush=True)

    deadline = None if args.time_limit is None else t0 + args.time_limit
    summary = run_cases(cases, isolate=not args.no_isolate, timeout=args.timeout, on_result=report,
                        jobs=args.jobs, deadline=deadline)
    stopped = f" (time limit: {len(cases) - len(results)} not started)" if len(results) < len(cases) else ""
    print(f"\n{len(results)} cases in {time.perf_counter() - t0:.0f} s{stopped}\n{summary.table()}")
    if log:
        log.write(json.dumps({"counts": summary.counts, "kernels": summary.kernels}) + "\n")
        log.close()
    return 0 if summary.clean else 1


if __name__ == "__main__":
    sys.exit(main())
