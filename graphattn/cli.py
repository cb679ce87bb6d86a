"""``graphattn`` command line: ``list``, ``check`` and ``bench``.

* ``graphattn list``: every registered backend, whether it can run here (and why not), and its
  capabilities on this platform.
* ``graphattn check --attn-backend NAME [--junitxml PATH]``: the conformance suite on a backend
  (``pytest --pyargs graphattn.testing`` underneath); the exit code is pytest's.
* ``graphattn bench``: the synthetic DeepSeek-like decode benchmark (``graphattn.bench.decode``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Sequence

PLUGIN = "graphattn.testing.plugin"


def _dtype(name: str):
    import torch

    if name not in ("float16", "bfloat16", "float32"):
        raise argparse.ArgumentTypeError(f"dtype must be float16, bfloat16 or float32, got {name!r}")
    return getattr(torch, name)


# -- list ---------------------------------------------------------------------------------------
def _backend_row(name: str, heads: int, topk: int, dtype, platform, kv_dtype: str = "auto") -> dict:
    from .backends import get_backend_class
    from .backends.base import kv_kwargs

    try:
        cls = get_backend_class(name)
    except Exception as exc:  # a broken third-party entry point must not hide the others
        return {"name": name, "available": False, "reasons": [f"cannot load: {type(exc).__name__}: {exc}"]}
    reasons = cls.refusal_reasons(heads, dtype, topk, platform, **kv_kwargs(kv_dtype))
    return {
        "name": name,
        "available": not reasons,
        "reasons": reasons,
        "notes": cls.notes(platform),
        "description": cls.description,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        **cls.capabilities(platform),
    }


def cmd_list(args: argparse.Namespace) -> int:
    """Print every backend with availability, reasons and capabilities on this platform."""
    from .backends import backend_names, default_dtype
    from .common.platform import current_platform

    platform = current_platform()
    dtype = args.dtype or default_dtype(platform)
    rows = [_backend_row(n, args.heads, args.topk, dtype, platform, args.kv_dtype) for n in backend_names()]
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
        out += ["--attn-backend", name]
    if args.shapes:
        out += ["--conformance-shapes", args.shapes]
    if args.dtype:
        out += ["--conformance-dtype", str(args.dtype).replace("torch.", "")]
    if getattr(args, "kv_dtype", "auto") != "auto":
        out += ["--conformance-kv-dtype", args.kv_dtype]
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

    from .backends.registry import backend_names, is_class_path

    for value in args.attn_backend or []:
        for name in filter(None, (n.strip() for n in value.split(","))):
            if name != "all" and name not in backend_names() and not is_class_path(name):
                valid = ", ".join(["all"] + backend_names())
                print(f"graphattn check: Unknown attention backend: '{name}'. Valid options are: {valid}",
                      file=sys.stderr)
                return 2
    return int(pytest.main(pytest_args(args)))


# -- bench --------------------------------------------------------------------------------------
def cmd_bench(args: argparse.Namespace) -> int:
    """Run the decode benchmark (see :mod:`graphattn.bench.decode`)."""
    from .bench.decode import run_from_args

    return run_from_args(args)


# -- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``graphattn`` argument parser (subcommands ``list``, ``check``, ``bench``)."""
    parser = argparse.ArgumentParser(
        prog="graphattn",
        description="Graph-capture-safe sparse MLA attention backends: list them, check them "
        "with the conformance suite, benchmark a decode workload.",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{list,check,bench}")

    p = sub.add_parser("list", help="backends, availability and capabilities on this platform")
    p.add_argument("--heads", type=int, default=128, help="head count to check (default 128)")
    p.add_argument("--topk", type=int, default=2048, help="top-k to check (default 2048)")
    p.add_argument("--dtype", type=_dtype, default=None, help="dtype to check (default per platform)")
    p.add_argument("--kv-dtype", choices=("auto", "fp8"), default="auto",
                   help="KV layout to check: auto (kv in q's dtype) or fp8 (656-byte FP8 tokens)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("check", help="run the conformance suite on a backend (pytest)")
    p.add_argument("--attn-backend", action="append", metavar="NAME",
                   help="backend to check (repeat or comma-separate; 'all'); default: built-ins available here")
    p.add_argument("--junitxml", metavar="PATH", help="write a JUnit XML report")
    p.add_argument("--shapes", choices=("small", "real"), help="shape set (default: real on GPU, small on CPU)")
    p.add_argument("--dtype", type=_dtype, default=None, help="q/kv dtype (default bf16 on GPU, fp16 on CPU)")
    p.add_argument("--kv-dtype", choices=("auto", "fp8"), default="auto",
                   help="KV layout: auto (kv in q's dtype) or fp8 (656-byte FP8 tokens)")
    p.add_argument("-k", metavar="EXPR", help="only cases matching this pytest -k expression")
    p.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failure")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("bench", help="synthetic DeepSeek-like decode benchmark (eager, full, breakable graphs)")
    from .bench.decode import add_bench_args

    add_bench_args(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graphattn`` console script and ``python -m graphattn``."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
