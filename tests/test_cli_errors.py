"""Every bad command-line input is one line on stderr naming what was wrong, and exit code 2.

Before: ``--iters -1`` printed negative times, ``--heads 0`` and friends silently became the
defaults, and a refused dtype, a bad ``GRAPHATTN_PLATFORM``, an unimportable ``module:Class``
and ``--json`` into a missing folder ended in tracebacks (issue 13).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphattn.cli import main
from graphattn.common.platform import reset_platform_cache

ROOT = Path(__file__).resolve().parents[1]

# (argv, the text the message must contain: the option or variable it names)
BAD_ARGS = [
    (["bench", "--iters", "-1"], "--iters"),
    (["bench", "--iters", "0"], "--iters"),
    (["bench", "--iters", "many"], "--iters"),
    (["bench", "--warmup", "-1"], "--warmup"),
    (["bench", "--heads", "0"], "--heads"),
    (["bench", "--topk", "0"], "--topk"),
    (["bench", "--pool-tokens", "0"], "--pool-tokens"),
    (["bench", "--layers", "0"], "--layers"),
    (["bench", "--measure-layers", "0"], "--measure-layers"),
    (["bench", "--batch-sizes", "0,1"], "--batch-sizes"),
    (["bench", "--batch-sizes", "2,2"], "--batch-sizes"),
    (["bench", "--batch-sizes", ","], "--batch-sizes"),
    (["bench", "--modes", "eager,nope"], "--modes"),
    (["bench", "--peak-bw", "0"], "--peak-bw"),
    (["bench", "--peak-flops", "nan"], "--peak-flops"),
    (["bench", "--seed", "-1"], "--seed"),
    (["bench", "--dtype", "int8"], "--dtype"),
    (["bench", "--layers", "3", "--measure-layers", "4"], "--measure-layers (4) must be <= --layers (3)"),
    (["bench", "--topk", "128", "--pool-tokens", "64"], "--pool-tokens (64) must be >= --topk (128)"),
    (["bench", "--attn-backend", "nope"], "--attn-backend"),
    (["bench", "--attn-backend", "flashmla", "--dtype", "float32"], "dtype float32 not in supported"),
    (["bench", "--attn-backend", "no_such_module_xyz:Backend"], "No module named 'no_such_module_xyz'"),
    (["bench", "--attn-backend", "graphattn.backends:NoSuchBackend"], "NoSuchBackend"),
    (["bench", "--attn-backend", "graphattn.backends:register_backend"], "expected a subclass"),
    (["list", "--heads", "0"], "--heads"),
    (["list", "--topk", "-3"], "--topk"),
    (["list", "--dtype", "int8"], "--dtype"),
    (["check", "--attn-backend", "nope"], "--attn-backend"),
    (["check", "--attn-backend", "no_such_module_xyz:Backend"], "No module named 'no_such_module_xyz'"),
    (["check", "--shapes", "huge"], "--shapes"),
    (["check", "--dtype", "int8"], "--dtype"),
    (["--log-level", "loud", "list"], "--log-level"),
    (["nope"], "invalid choice"),
    ([], "required"),
]


def _fails(argv: list[str], capsys) -> str:
    """Run the command line in-process; return its one stderr line after asserting exit code 2."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, f"{argv}: exit code {exit_.value.code}, stderr {err!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{argv}: expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("graphattn") and ": error: " in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv, names", BAD_ARGS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_argument_is_one_line_exit_2(argv, names, capsys):
    assert names in _fails(argv, capsys)


def test_json_into_a_missing_folder_or_onto_a_folder(tmp_path, capsys):
    missing = tmp_path / "missing" / "bench.json"
    line = _fails(["bench", "--json", str(missing)], capsys)
    assert "--json" in line and "does not exist" in line
    line = _fails(["bench", "--json", str(tmp_path)], capsys)
    assert "--json" in line and "is a folder" in line
    line = _fails(["check", "--junitxml", str(tmp_path)], capsys)  # pytest creates missing folders
    assert "--junitxml" in line and "is a folder" in line


@pytest.mark.parametrize("command", [["list"], ["check"], ["bench"], ["env"]], ids=lambda c: c[0])
def test_bad_platform_variable(command, monkeypatch, capsys):
    monkeypatch.setenv("GRAPHATTN_PLATFORM", "foo")
    reset_platform_cache()
    try:
        line = _fails(command, capsys)
    finally:
        monkeypatch.undo()
        reset_platform_cache()
    assert "GRAPHATTN_PLATFORM='foo' is not a platform" in line


@pytest.mark.parametrize("value", ["nope", "no_such_module_xyz:Backend"])
def test_bad_backend_variable_is_named(value, monkeypatch, capsys):
    monkeypatch.setenv("GRAPHATTN_ATTN_BACKEND", value)
    line = _fails(["bench"], capsys)
    assert "--attn-backend" in line and "GRAPHATTN_ATTN_BACKEND" in line


def test_empty_backend_variable_means_auto(monkeypatch):
    from graphattn.bench.options import add_bench_args
    from graphattn.cli import Parser

    monkeypatch.setenv("GRAPHATTN_ATTN_BACKEND", " ")
    parser = Parser()
    add_bench_args(parser)
    assert parser.parse_args([]).attn_backend == "auto"


def test_zero_is_not_replaced_by_a_default():
    """The old ``args.x or default`` pattern: 0 parsed, then silently became the default."""
    from graphattn.bench.options import add_bench_args, workload_from_args
    from graphattn.cli import Parser
    from graphattn.common import current_platform

    parser = Parser()
    add_bench_args(parser)
    args = parser.parse_args(["--heads", "3", "--seed", "0", "--warmup", "0"])
    wl = workload_from_args(args, current_platform())
    assert wl.num_heads == 3 and args.warmup == 0


def test_import_time_errors_are_one_line_too():
    """Through ``python -m graphattn``: nothing may fail before ``main`` can report it."""
    env = dict(os.environ, GRAPHATTN_PLATFORM="foo",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "graphattn", "list"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "graphattn list: error: GRAPHATTN_PLATFORM='foo' is not a platform; expected one of "
        "['cpu', 'cuda', 'hip'] (or leave it unset to detect the hardware)"
    ], proc.stderr
