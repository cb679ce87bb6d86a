"""``graphattn`` command line: ``list``, ``check``, ``bench`` and ``env``; ``--version``.

* ``graphattn list``: every registered backend, whether it can run here (and why not), and its
  capabilities on this platform.
* ``graphattn check --attn-backend NAME [--junitxml PATH]``: the conformance suite on a backend
  (``pytest --pyargs graphattn.testing`` underneath); the exit code is pytest's.
* ``graphattn bench``: the synthetic DeepSeek-like decode benchmark (``graphattn.bench.decode``).
* ``graphattn env``: versions, device, platform and backends, for bug reports.

Every bad input (an option, ``GRAPHATTN_PLATFORM``, ``GRAPHATTN_ATTN_BACKEND``, a backend that
refuses the configuration or does not import) ends in one line on stderr,
``graphattn <command>: error: ...``, and exit code 2, as argparse does for its own errors.
``pkg.module:Class`` backends resolve against the current directory, as under ``python -m``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from typing import NoReturn, Sequence

from . import __version__
from .common.argtypes import file_path, positive_int

PLUGIN = "graphattn.testing.plugin"
DTYPES = ("float16", "bfloat16", "float32")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class UsageError(Exception):
    """A bad input found after parsing (environment, backend, workload): one line, exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``prog: error: message``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: message`` (one line) and exit with code 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


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


def _check_backend_names(values: list[str]) -> None:
    """``graphattn check``'s names: ``all``, registered names, loadable ``pkg.module:Class``."""
    from .backends.registry import backend_names, is_class_path, load_error

    for name in filter(None, (n.strip() for v in values for n in v.split(","))):
        if name != "all" and name not in backend_names() and not is_class_path(name):
            valid = ", ".join(["all"] + backend_names())
            raise UsageError(f"argument --attn-backend: Unknown attention backend: '{name}'. Valid options are: {valid}")
        error = None if name == "all" else load_error(name)
        if error:
            raise UsageError(f"argument --attn-backend: {error}")


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


def cmd_check(args: argparse.Namespace) -> int:
    """Run the conformance suite on the chosen backend(s); returns pytest's exit code."""
    import pytest

    _cwd_importable()
    _platform()
    _check_backend_names(args.attn_backend or [])
    return int(pytest.main(pytest_args(args)))


# -- bench --------------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    """Run the decode benchmark (see :mod:`graphattn.bench.decode`): 0 when every sampled output
    matches the reference, 1 otherwise."""
    from .backends.report import environment
    from .bench.decode import format_report, progress, run_bench
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
        from .bench.tp import format_tp_report, run_tp

        report, fmt = run_tp(req), format_tp_report
        if report is None:  # a torchrun rank other than 0: rank 0 prints the report
            return 0
    else:
        report, fmt = run_bench(**req.run_kwargs()), format_report
    report = {"command": {"line": args.command_line, "cwd": os.getcwd()}, "env": env, **report}
    print(fmt(report))
    if req.json_path:
        with open(req.json_path, "w") as f:
            json.dump(report, f, indent=2)
        progress(f"wrote {req.json_path}")
    return 0 if report["ok"] else 1


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
