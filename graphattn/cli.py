"""``graphattn`` command line: ``list``, ``check``, ``bench`` and ``env``; ``--version``.

* ``graphattn list``: every registered backend, whether it can run here (and why not), and its
  capabilities on this platform.
* ``graphattn check --attn-backend NAME [--junitxml PATH]``: the conformance suite on a backend
  (``pytest --pyargs graphattn.testing`` underneath); the exit code is pytest's, except that a
  run that checked nothing (a named backend, or every backend, with each selected case skipped)
  is one line and exit code 2.
* ``graphattn bench``: the synthetic DeepSeek-like decode benchmark (``graphattn.bench.decode``).
* ``graphattn env``: versions, device, platform and backends, for bug reports.

Every bad input (an option, ``GRAPHATTN_PLATFORM``, ``GRAPHATTN_ATTN_BACKEND``, a backend that
refuses the configuration or does not import) ends in one line on stderr,
``graphattn <command>: error: ...``, and exit code 2, as argparse does for its own errors.
``pkg.module:Class`` backends resolve against the current directory, as under ``python -m``.

``graphattn bench`` exit codes: 0 every check ok, 1 a check MISMATCH, 2 a bad input (also a
``--json`` file that cannot be written at the end), 3 a ``--tp`` rank failed (one line names
the rank and its error; ``--log-level DEBUG`` logs its traceback), 4 out of memory during the
run, 130 interrupted (SIGINT, or SIGTERM to a ``--tp`` launcher: the ranks are stopped).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
from typing import Sequence

from . import __version__
from .common.argtypes import Parser, file_path, positive_int

PLUGIN = "graphattn.testing.plugin"
EXIT_MISMATCH = 1  # bench: a sampled output differs from the reference (check: pytest's 1)
EXIT_USAGE = 2  # a bad input: one line on stderr
EXIT_RUN_FAILED = 3  # bench --tp: a rank raised or died
EXIT_OUT_OF_MEMORY = 4  # bench: an allocation failed during the run
EXIT_INTERRUPTED = 130  # bench: SIGINT (or SIGTERM to a --tp launcher)
DTYPES = ("float16", "bfloat16", "float32")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class UsageError(Exception):
    """A bad input found after parsing (environment, backend, workload): one line, exit 2."""


def _platform():
    from .common.platform import current_platform

    try:
        return current_platform()
    except ValueError as exc:  # GRAPHATTN_PLATFORM names no platform
        raise UsageError(str(exc)) from None


def _torch_dtype(name: str | None):
    import torch

    return getattr(torch, name) if name else None


def _cwd_importable() -> None:
    # `python -m graphattn` has the current directory on sys.path and the console script does
    # not; `pkg.module:Class` backends must resolve the same way under both.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _check_backend_names(values: list[str]) -> list[str]:
    """``graphattn check``'s names: ``all``, registered names, loadable ``pkg.module:Class``;
    returns them (none for the default set)."""
    from .backends.registry import backend_names, is_class_path, load_error, split_backend_names

    try:
        names = split_backend_names(values)
    except ValueError as exc:  # --attn-backend "" or ",": checking nothing is not a pass
        raise UsageError(f"argument --attn-backend: {exc}") from None
    for name in names:
        if name != "all" and name not in backend_names() and not is_class_path(name):
            valid = ", ".join(["all"] + backend_names())
            raise UsageError(f"argument --attn-backend: Unknown attention backend: '{name}'. Valid options are: {valid}")
        error = None if name == "all" else load_error(name)
        if error:
            raise UsageError(f"argument --attn-backend: {error}")
    return names


# -- list ---------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    """Print every backend with availability, reasons and capabilities on this platform."""
    from .backends import default_dtype
    from .backends.report import backend_rows

    _cwd_importable()
    platform = _platform()
    dtype = _torch_dtype(args.dtype) or default_dtype(platform)
    rows = backend_rows(args.heads, args.topk, dtype, platform, args.kv_dtype)
    if args.json:
        print(json.dumps({"platform": platform.describe(), "heads": args.heads, "topk": args.topk,
                          "dtype": str(dtype), "kv_dtype": args.kv_dtype, "backends": rows}, indent=2))
        return 0
    info = platform.describe()
    print(f"platform: {info.pop('platform')} ({', '.join(f'{k}={v}' for k, v in info.items())})")
    print(f"configuration checked: heads={args.heads} topk={args.topk} dtype={str(dtype).replace('torch.', '')} "
          f"kv_dtype={args.kv_dtype}")
    header = ("backend", "available", "graphs", "dtypes", "kv", "heads", "pads q", "counter", "workspace")
    table = [header]
    for r in rows:
        if "dtypes" not in r:
            table.append((r["name"], "no", "-", "-", "-", "-", "-", "-", "-"))
            continue
        pads = f"to x{r['pad_multiple']}" if r["pads_q"] else "no"
        table.append((r["name"], "yes" if r["available"] else "no", r["graph_support"],
                      ",".join(r["dtypes"]), ",".join(r["kv_dtypes"]), r["heads"], pads,
                      "yes" if r["uses_counter"] else "no", "yes" if r["uses_workspace"] else "no"))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    for r in rows:
        for line in [f"refused: {x}" for x in r["reasons"]] + [f"note: {x}" for x in r.get("notes", [])]:
            print(f"  {r['name']}: {line}")
    return 0


# -- check --------------------------------------------------------------------------------------
def pytest_args(args: argparse.Namespace) -> list[str]:
    """The ``pytest.main`` arguments ``graphattn check`` uses (isolated from the caller's
    project: its own rootdir, no ini file, no cache directory)."""
    testing_dir = os.path.dirname(os.path.abspath(__import__("graphattn.testing", fromlist=["x"]).__file__))
    out = ["--pyargs", "graphattn.testing", "-p", PLUGIN, "-p", "no:cacheprovider",
           "--rootdir", testing_dir, "--confcutdir", testing_dir, "-c", os.devnull,
           "-o", "python_files=test_*.py", "-o", "python_functions=test_*",
           # graphattn is imported before pytest starts, so pytest cannot rewrite the plugin's
           # package; the suite's messages do not depend on assertion rewriting.
           "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    for name in args.attn_backend or []:
        out += ["--graphattn-backend", name]
    if args.shapes:
        out += ["--graphattn-shapes", args.shapes]
    if args.dtype:
        out += ["--graphattn-dtype", args.dtype]
    if getattr(args, "kv_dtype", "auto") != "auto":
        out += ["--graphattn-kv-dtype", args.kv_dtype]
    if getattr(args, "device", None):
        out += ["--graphattn-device", args.device]
    if args.junitxml:
        out += [f"--junitxml={os.path.abspath(args.junitxml)}", "-o", "junit_suite_name=graphattn-conformance"]
    if args.k:
        out += ["-k", args.k]
    out += ["-q"] if not args.verbose else ["-v"]
    if args.exitfirst:
        out.append("-x")
    return out + list(args.pytest_args)


class CaseTally:
    """A pytest plugin object: per backend, the conformance cases that ran and the reasons of
    those skipped (``graphattn check`` fails a run that checked nothing)."""

    def __init__(self) -> None:
        self.backend_of: dict[str, str] = {}
        self.ran: dict[str, int] = {}
        self.skipped: dict[str, list[str]] = {}

    def pytest_itemcollected(self, item) -> None:
        case = getattr(getattr(item, "callspec", None), "params", {}).get("graphattn_case")
        if case is not None:
            self.backend_of[item.nodeid] = case.backend

    def pytest_runtest_logreport(self, report) -> None:
        backend = self.backend_of.get(report.nodeid)
        if backend is None:
            return
        if report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
            self.skipped.setdefault(backend, []).append(reason.removeprefix("Skipped: "))
        elif report.when == "call" or report.failed:
            self.ran[backend] = self.ran.get(backend, 0) + 1

    def idle(self, named: list[str]) -> list[str]:
        """Backends of ``named`` whose selected cases were all skipped, each with why; with
        ``named`` empty (``all``, the default set), every backend, but only when no case ran."""
        if not named:  # all / the default set: backends that cannot run here skip, unless all do
            if any(self.ran.values()):
                return []
            named = list(self.skipped)
        out = []
        for name in dict.fromkeys(named):
            if self.ran.get(name) or not self.skipped.get(name):
                continue
            reasons = list(dict.fromkeys(re.sub(r"^backend '[^']*' refuses this configuration: ", "", r)
                                         for r in self.skipped[name]))
            shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more reasons" if len(reasons) > 3 else "")
            out.append(f"backend '{name}' checked nothing: all {len(self.skipped[name])} selected cases were "
                       f"skipped: {shown}")
        return out


def cmd_check(args: argparse.Namespace) -> int:
    """Run the conformance suite on the chosen backend(s); returns pytest's exit code, or 2
    when a named backend (or every backend) had each of its selected cases skipped."""
    import pytest

    from .testing.plugin import device_platform

    _cwd_importable()
    _platform()
    named = _check_backend_names(args.attn_backend or [])
    if args.device:
        try:
            device_platform(args.device)
        except pytest.UsageError as exc:
            raise UsageError("argument --device: " + str(exc).removeprefix("--graphattn-device ")) from None
    tally = CaseTally()
    try:
        code = int(pytest.main(pytest_args(args), plugins=[tally]))
    except OSError as exc:  # pytest writes the JUnit XML at the end (a full disk, a path gone)
        if not args.junitxml:
            raise
        raise UsageError(f"argument --junitxml: could not write {args.junitxml!r}: {exc}") from None
    idle = tally.idle([] if "all" in named else named)
    if idle:
        print(f"{args.parser.prog}: error: " + "; ".join(idle), file=sys.stderr, flush=True)
        return EXIT_USAGE if code == 0 else code
    return code


# -- bench --------------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    """Run the decode benchmark (see :mod:`graphattn.bench.decode`): 0 when every sampled output
    matches the reference, 1 otherwise; 3 a ``--tp`` rank failed, 4 out of memory, 130
    interrupted (each with one line on stderr)."""
    from .bench.decode import is_out_of_memory

    try:
        return _bench(args)
    except KeyboardInterrupt:
        return _error(args, "interrupted by SIGINT", EXIT_INTERRUPTED)
    except (MemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        return _error(args, f"out of memory during the run: {_first_line(exc)}; make --pool-tokens, "
                      "--batch-sizes, --heads or --measure-layers smaller", EXIT_OUT_OF_MEMORY)


def _error(args: argparse.Namespace, message: str, code: int) -> int:
    """Print ``graphattn <command>: error: message`` (one line); return ``code``."""
    print(f"{args.parser.prog}: error: {message}", file=sys.stderr, flush=True)
    return code


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _bench(args: argparse.Namespace) -> int:
    from .backends.report import environment
    from .bench.decode import format_report, progress, run_bench, write_report
    from .bench.options import request_from_args

    _cwd_importable()
    if args.tp > 1:
        from .bench.tp import bind_local_rank

        bind_local_rank()  # under torchrun: this rank's GPU before anything touches one
    platform = _platform()
    try:
        req = request_from_args(args, platform)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    env = environment(__version__, req.workload.num_heads // req.tp, req.workload.topk, req.workload.dtype)
    if req.tp > 1:
        from .bench.tp import Interrupted, RankFailed, format_tp_report, run_tp

        try:
            report, fmt = run_tp(req), format_tp_report
        except RankFailed as exc:
            return _error(args, str(exc), EXIT_OUT_OF_MEMORY if exc.out_of_memory else EXIT_RUN_FAILED)
        except Interrupted as exc:
            return _error(args, str(exc), EXIT_INTERRUPTED)
        if report is None:  # a torchrun rank other than 0: rank 0 prints the report
            return 0
    else:
        report, fmt = run_bench(**req.run_kwargs()), format_report
    report = {"command": {"line": args.command_line, "cwd": os.getcwd()}, "env": env, **report}
    print(fmt(report))
    if req.json_path:
        try:
            write_report(req.json_path, report)
        except OSError as exc:
            raise UsageError(f"argument --json: could not write {req.json_path!r}: "
                             f"{exc.strerror or exc}") from None
        progress(f"wrote {req.json_path}")
    return 0 if report["ok"] else EXIT_MISMATCH


# -- env ----------------------------------------------------------------------------------------
def cmd_env(args: argparse.Namespace) -> int:
    """Print versions, device, platform and backends (``--json``: as JSON) for a bug report."""
    from .backends.report import environment, format_environment

    _cwd_importable()
    _platform()
    env = environment(__version__)
    print(json.dumps(env, indent=2) if args.json else format_environment(env))
    return 0


# -- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``graphattn`` argument parser (subcommands ``list``, ``check``, ``bench``, ``env``)."""
    parser = Parser(
        prog="graphattn",
        description="Graph-capture-safe sparse MLA attention backends: list them, check them "
        "with the conformance suite, benchmark a decode workload, report the environment.",
    )
    parser.add_argument("--version", action="version", version=f"graphattn {__version__}")
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS,
                        help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{list,check,bench,env}")

    p = sub.add_parser("list", help="backends, availability and capabilities on this platform")
    p.add_argument("--heads", type=positive_int, default=128, help="head count to check (default 128)")
    p.add_argument("--topk", type=positive_int, default=2048, help="top-k to check (default 2048)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="dtype to check (default per platform)")
    p.add_argument("--kv-dtype", choices=("auto", "fp8"), default="auto",
                   help="KV layout to check: auto (kv in q's dtype) or fp8 (656-byte FP8 tokens)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_list, parser=p)

    p = sub.add_parser("check", help="run the conformance suite on a backend (pytest)")
    p.add_argument("--attn-backend", action="append", metavar="NAME",
                   help="backend to check (repeat or comma-separate; 'all'; 'pkg.module:Class'); "
                   "default: built-ins available here")
    p.add_argument("--junitxml", metavar="PATH", type=file_path,
                   help="write a JUnit XML report (missing folders are created)")
    p.add_argument("--shapes", choices=("small", "real"), help="shape set (default: real on GPU, small on CPU)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="q/kv dtype (default bf16 on GPU, fp16 on CPU)")
    p.add_argument("--kv-dtype", choices=("auto", "fp8"), default="auto",
                   help="KV layout: auto (kv in q's dtype) or fp8 (656-byte FP8 tokens)")
    p.add_argument("--device", metavar="DEVICE",
                   help="run the suite on this device, e.g. cuda:1 (current or not; default: the platform's)")
    p.add_argument("-k", metavar="EXPR", help="only cases matching this pytest -k expression")
    p.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failure")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    p.set_defaults(func=cmd_check, parser=p)

    p = sub.add_parser("bench", help="synthetic DeepSeek-like decode benchmark (eager, full, breakable graphs)")
    from .bench.options import add_bench_args

    add_bench_args(p)
    p.set_defaults(func=cmd_bench, parser=p)

    p = sub.add_parser("env", help="versions, device, platform and backends, for bug reports")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_env, parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graphattn`` console script and ``python -m graphattn``.

    Returns the command's exit code; a bad input raises ``SystemExit(2)`` after one line on
    stderr (``graphattn <command>: error: ...``).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["graphattn", *argv])
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except UsageError as exc:
        args.parser.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
