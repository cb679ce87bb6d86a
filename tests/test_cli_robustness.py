"""The command lines on inputs that used to pass silently, fail late or end in a traceback.

Each test is one reviewed defect (A-J), run the way a user meets it: in-process through
``main`` where that is faithful, in a subprocess where the defect lives in process start-up, in
pytest or in spawned ranks. Exit codes: 0 ok, 1 a check MISMATCH, 2 a bad input (one line,
``graphattn <command>: error: ...``), 3 a ``--tp`` rank failed, 4 out of memory, 130 interrupted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from graphattn.cli import EXIT_OUT_OF_MEMORY, EXIT_RUN_FAILED, main
from test_cli_errors import _fails

ROOT = Path(__file__).resolve().parents[1]
# One eager point of one row on one layer: the smallest bench run.
TINY = ["--heads", "4", "--topk", "8", "--pool-tokens", "64", "--batch-sizes", "1", "--layers", "1",
        "--measure-layers", "1", "--iters", "1", "--warmup", "0", "--modes", "eager"]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU refuses")

BACKENDS = '''
import torch
import torch.distributed as dist

from graphattn.backends.torch_ref import TorchBackend


class _Base(TorchBackend):
    def forward(self, q, kv, metadata, out=None):
        return TorchBackend.forward(self, q, kv, metadata)


class RefusesAll(_Base):
    """Heads in multiples of 3: every spec of the suite is refused."""
    name = "robust_refuses_all"
    head_multiple = 3


class NoFP8(_Base):
    name = "robust_no_fp8"
    supported_kv_dtypes = ("auto",)


class NanOut(_Base):
    name = "robust_nan"

    def forward(self, q, kv, metadata, out=None):
        o, lse = TorchBackend.forward(self, q, kv, metadata)
        return o * float("nan"), lse


class InfOut(_Base):
    name = "robust_inf"

    def forward(self, q, kv, metadata, out=None):
        o, lse = TorchBackend.forward(self, q, kv, metadata)
        return torch.full_like(o, float("inf")), lse


class FailRank1(_Base):
    """Raises in forward on tensor-parallel rank 1."""
    name = "robust_fail_rank1"

    def forward(self, q, kv, metadata, out=None):
        if dist.is_initialized() and dist.get_rank() == 1:
            raise RuntimeError("rank 1 backend exploded")
        return TorchBackend.forward(self, q, kv, metadata)


class KillRank1(_Base):
    """Rank 1 dies of SIGKILL in forward (as under the out-of-memory killer)."""
    name = "robust_kill_rank1"

    def forward(self, q, kv, metadata, out=None):
        if dist.is_initialized() and dist.get_rank() == 1:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return TorchBackend.forward(self, q, kv, metadata)
'''


@pytest.fixture(scope="module")
def backends_dir(tmp_path_factory) -> Path:
    """A folder holding ``robust_backends.py`` (the broken backends above)."""
    folder = tmp_path_factory.mktemp("robust")
    (folder / "robust_backends.py").write_text(textwrap.dedent(BACKENDS))
    return folder


@pytest.fixture
def in_process_backends(backends_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(backends_dir))
    yield
    sys.modules.pop("robust_backends", None)


def run_cli(*args: str, env: dict[str, str] | None = None, backends: Path | None = None,
            timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m graphattn ARGS`` in a subprocess (``backends``: also on its path)."""
    path = [str(ROOT), *([str(backends)] if backends else []), os.environ.get("PYTHONPATH", "")]
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **(env or {}))
    return subprocess.run([sys.executable, "-m", "graphattn", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    """stderr without the progress lines (``[graphattn bench ...] ...``)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("[graphattn bench")]


def strict_json(path: Path) -> dict:
    """Parse ``path`` refusing NaN / Infinity (not JSON)."""
    def refuse(constant: str):
        raise AssertionError(f"{path}: {constant} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


# -- A: a check that checked nothing ------------------------------------------------------------
@pytest.mark.parametrize("value", ["", ",", " , "])
def test_check_empty_backend_name_is_a_usage_error(value, capsys):
    line = _fails(["check", "--attn-backend", value], capsys)
    assert "--attn-backend" in line and "expected a backend name" in line


def test_plugin_refuses_an_empty_backend_name():
    from graphattn.testing.plugin import selected_backends

    with pytest.raises(pytest.UsageError, match="expected a backend name"):
        selected_backends([""])
    with pytest.raises(pytest.UsageError, match="expected a backend name"):
        selected_backends([",", " "])


@pytest.mark.parametrize("argv, backend, reason", [
    (["--attn-backend", "trtllm", "--dtype", "float32"], "trtllm", "dtype float32 not in supported"),
    (["--attn-backend", "robust_backends:NoFP8", "--kv-dtype", "fp8"], "robust_backends:NoFP8", "kv_dtype fp8"),
    (["--attn-backend", "robust_backends:RefusesAll"], "robust_backends:RefusesAll", "multiple of 3"),
], ids=["refused-dtype", "refused-kv-dtype", "refuses-every-spec"])
def test_check_of_a_backend_that_ran_no_case_fails(argv, backend, reason, backends_dir):
    proc = run_cli("check", *argv, backends=backends_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "21 skipped" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"graphattn check: error: backend '{backend}' checked nothing: all 21 selected "
                               "cases were skipped: "), lines[0]
    assert reason in lines[0]


def test_check_names_only_the_backend_that_ran_nothing(backends_dir):
    proc = run_cli("check", "--attn-backend", "torch,robust_backends:RefusesAll", "-k", "one_row",
                   backends=backends_dir)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "3 passed, 3 skipped" in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "backend 'robust_backends:RefusesAll' checked nothing: all 3 selected" in line and "'torch'" not in line


def test_case_tally_idle_rules():
    from graphattn.cli import CaseTally

    tally = CaseTally()
    tally.ran = {"torch": 3}
    tally.skipped = {"torch": ["x"], "flashmla": ["needs a GPU"] * 2}
    assert tally.idle([]) == []  # all / the default set: backends unavailable here may skip
    assert tally.idle(["torch"]) == []
    (line,) = tally.idle(["torch", "flashmla"])
    assert line == "backend 'flashmla' checked nothing: all 2 selected cases were skipped: needs a GPU"
    tally.ran = {}
    assert len(tally.idle([])) == 2  # nothing ran at all: every backend is named


# -- B: report paths ------------------------------------------------------------------------------
def test_report_paths_are_checked_before_the_run(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    line = _fails(["check", "--junitxml", str(a_file / "deeper" / "x.xml")], capsys)
    assert "--junitxml" in line and "is not a folder" in line
    line = _fails(["bench", "--json", str(a_file / "x.json")], capsys)
    assert "--json" in line and "is not a folder" in line
    for command in (["bench", "--json", ""], ["check", "--junitxml", ""], ["bench", "--json", " "]):
        line = _fails(command, capsys)
        assert "expected a file path" in line, line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_bench_json_write_failure_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", *TINY, "--json", "/dev/full"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert "us/layer" in out  # the table came first
    assert error_lines(err) == ["graphattn bench: error: argument --json: could not write '/dev/full': "
                                "No space left on device"], err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_check_junitxml_write_failure_is_one_line():
    proc = run_cli("check", "--attn-backend", "torch", "-k", "one_row and eager", "--junitxml", "/dev/full")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "graphattn check: error: argument --junitxml: could not write '/dev/full': "
        "[Errno 28] No space left on device"], proc.stderr


# -- C: NaN and infinity -------------------------------------------------------------------------
def test_nan_max_keeps_nan():
    from graphattn.bench.decode import nan_max

    assert math.isnan(nan_max(0.0, math.nan)) and math.isnan(nan_max(math.nan, 1.0))
    assert nan_max(1.0, 2.0) == 2.0 and nan_max(math.inf, 1.0) == math.inf


def test_report_json_is_strict():
    from graphattn.bench.decode import json_safe, report_json

    report = {"a": [math.nan, math.inf, -math.inf, 1.5], "b": {"c": (math.nan,)}, "d": "x", "e": 3}
    assert json_safe(report) == {"a": ["nan", "inf", "-inf", 1.5], "b": {"c": ["nan"]}, "d": "x", "e": 3}
    assert json.loads(report_json(report))["a"] == ["nan", "inf", "-inf", 1.5]


def test_bench_nan_error_is_nan_and_a_mismatch(tmp_path, capsys, in_process_backends):
    path = tmp_path / "nan.json"
    assert main(["bench", *TINY, "--attn-backend", "robust_backends:NanOut", "--json", str(path)]) == 1
    assert "MISMATCH (max abs err nan;" in capsys.readouterr().out
    report = strict_json(path)
    assert [c["max_abs_err"] for c in report["checks"]] == ["nan"] and not report["ok"]


def test_bench_infinite_error_and_roofline_are_strict_json(tmp_path, capsys, in_process_backends):
    path = tmp_path / "inf.json"
    argv = ["bench", *TINY, "--attn-backend", "robust_backends:InfOut", "--peak-bw", "1e-308", "--json", str(path)]
    assert main(argv) == 1
    report = strict_json(path)
    assert [c["max_abs_err"] for c in report["checks"]] == ["inf"]
    assert [r["roofline_fraction"] for r in report["results"]] == ["inf"]
    assert float(report["results"][0]["roofline_fraction"]) == math.inf


def test_tp_nan_error_is_nan(tmp_path, backends_dir):
    path = tmp_path / "tp.json"
    proc = run_cli("bench", "--tp", "2", *TINY, "--heads", "8", "--attn-backend", "robust_backends:NanOut",
                   "--json", str(path), env={"GRAPHATTN_PLATFORM": "cpu"}, backends=backends_dir)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = strict_json(path)["checks"]
    assert len(checks) == 2 and all(c["max_abs_err"] == "nan" and not c["ok"] for c in checks), checks
    assert all(c["projection_max_abs_err"] == "nan" for c in checks), checks


# -- D: sizes that cannot fit --------------------------------------------------------------------
@pytest.mark.parametrize("argv, names", [
    (["--pool-tokens", "100000000000"], "KV pools (--pool-tokens x --measure-layers)"),
    (["--heads", "100000000"], "q and outputs (--batch-sizes x --heads x --measure-layers)"),
    (["--batch-sizes", "1000000000"], "q and outputs"),
])
def test_bench_refuses_a_workload_beyond_memory(argv, names, capsys, cpu_platform):
    line = _fails(["bench", "--modes", "eager", "--iters", "1", *argv], capsys)
    assert "the workload needs at least" in line and names in line and "more than the host's" in line


def test_default_gpu_workload_fits_an_h200():
    from graphattn.bench.options import rank_bytes
    from graphattn.bench.workload import DecodeWorkload

    assert sum(rank_bytes(DecodeWorkload(), 1).values()) < 4 << 30


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 230400000000 bytes."),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    MemoryError(),
], ids=["cpu-allocator", "cuda", "memory-error"])
def test_out_of_memory_during_the_run_is_one_line(error, capsys, monkeypatch, cpu_platform):
    import graphattn.bench.decode as decode

    def run_bench(**kwargs):
        raise error

    monkeypatch.setattr(decode, "run_bench", run_bench)
    assert main(["bench", *TINY]) == EXIT_OUT_OF_MEMORY == 4
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("graphattn bench: error: out of memory during the run: "), line


def test_interrupted_bench_is_one_line_exit_130(capsys, monkeypatch, cpu_platform):
    import graphattn.bench.decode as decode

    def run_bench(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(decode, "run_bench", run_bench)
    assert main(["bench", *TINY]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["graphattn bench: error: interrupted by SIGINT"]


def test_other_runtime_errors_are_not_called_out_of_memory(monkeypatch, cpu_platform):
    import graphattn.bench.decode as decode

    def run_bench(**kwargs):
        raise RuntimeError("a backend bug")

    monkeypatch.setattr(decode, "run_bench", run_bench)
    with pytest.raises(RuntimeError, match="a backend bug"):
        main(["bench", *TINY])


# -- E: torchrun's WORLD_SIZE --------------------------------------------------------------------
@pytest.mark.parametrize("world", ["1", "3", "x"])
def test_tp_must_match_any_torchrun_world_size(world, capsys, cpu_platform, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", world)
    line = _fails(["bench", "--heads", "16", "--tp", "2"], capsys)
    assert f"--tp (2) must equal torchrun's WORLD_SIZE ({world})" in line


def test_tp_matching_torchrun_world_size_passes(monkeypatch, cpu_platform):
    from graphattn.bench.options import check_tp
    from graphattn.common import current_platform

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_tp(2, 16, None, current_platform())
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_tp(1, 16, None, current_platform())


# -- F, G: environment switches ------------------------------------------------------------------
@pytest.mark.parametrize("variable", ["GRAPHATTN_CHECK_INDICES", "GRAPHATTN_SANITIZE"])
def test_bad_switch_is_one_line_before_the_run(variable):
    proc = run_cli("bench", *TINY, "--modes", "full", env={variable: "maybe"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"graphattn bench: error: environment variable {variable}='maybe' is not a switch: expected one of "
        "['1', 'true', 'yes', 'on'] (on) or ['0', 'false', 'no', 'off'] (off); fix or unset it"], proc.stderr


@pytest.mark.parametrize("env, flag, expected", [
    ("1", [], True), ("0", [], False), ("", [], False), ("0", ["--sanitize"], True),
])
def test_sanitize_variable_reaches_the_runner(env, flag, expected, tmp_path, capsys, monkeypatch, cpu_platform):
    import graphattn.bench.decode as decode

    seen = []

    class Runner(decode.GraphRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.sanitize)

    monkeypatch.setattr(decode, "GraphRunner", Runner)
    monkeypatch.setenv("GRAPHATTN_SANITIZE", env)
    path = tmp_path / "bench.json"
    assert main(["bench", *TINY, "--modes", "full", *flag, "--json", str(path)]) == 0
    assert seen == [expected] and json.loads(path.read_text())["sanitize"] is expected


# -- H: graphattn check --device ------------------------------------------------------------------
@pytest.mark.parametrize("device, text", [
    pytest.param("cuda:0", "there is no GPU here", marks=NO_GPU),
    ("foo", "Expected one of cpu"),
])
def test_check_bad_device_is_one_line_exit_2(device, text, capsys):
    line = _fails(["check", "--device", device], capsys)
    assert line.startswith(f"graphattn check: error: argument --device: {device}: ") and text in line, line


# -- I: python -m graphattn.bench.host / .graphs --------------------------------------------------
def _module_fails(module_main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        module_main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, f"{argv}: exit code {exit_.value.code}, stderr {err!r}"
    (line,) = err.strip().splitlines()
    return line


@pytest.mark.parametrize("argv, text", [
    (["--calls", "-3"], "argument --calls: expected an integer >= 1"),
    (["--calls", "0"], "argument --calls: expected an integer >= 1"),
    (["--repeats", "0"], "argument --repeats: expected an integer >= 1"),
    (["--topk", "-5"], "argument --topk: expected an integer >= 1"),
    (["--topk", "100000000"], "argument --topk: must be <="),
    (["--heads", "0"], "argument --heads"),
    (["--backends", "nope"], "argument --backends: Unknown attention backend: 'nope'"),
    (["--backends", ","], "argument --backends: expected comma-separated backend names"),
    (["--backends", "robust_backends:RefusesAll"], "multiple of 3"),
])
def test_host_bench_bad_arguments(argv, text, capsys, cpu_platform, in_process_backends):
    from graphattn.bench import host

    line = _module_fails(host.main, ["--backends", "torch", "--heads", "4", "--rows", "1", *argv], capsys)
    assert line.startswith("python -m graphattn.bench.host: error: ") and text in line, line


def test_host_bench_runs_and_host_cost_refuses_no_calls(capsys, cpu_platform):
    from graphattn.bench import host

    assert host.main(["--backends", "torch", "--heads", "4", "--rows", "1", "--calls", "1", "--repeats", "1"]) == 0
    assert "| torch | 4 | 1 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="calls >= 1"):
        host.host_cost(None, None, None, 1, None, calls=0)


@pytest.mark.parametrize("argv, text", [
    (["--iters", "-1"], "argument --iters: expected an integer >= 1"),
    (["--iters", "0"], "argument --iters: expected an integer >= 1"),
    (["--rows", "100", "--max-rows", "24"], "argument --rows: must be <= --max-rows (24), got 100"),
    (["--heads", "100"], "argument --heads: must be <= 64"),
    (["--json", "/nonexistent-graphattn/x.json"], "argument --json: folder '/nonexistent-graphattn'"),
    (["--json", ""], "argument --json: expected a file path"),
])
def test_graph_bench_bad_arguments(argv, text, capsys, cpu_platform):
    from graphattn.bench import graphs

    line = _module_fails(graphs.main, argv, capsys)
    assert line.startswith("python -m graphattn.bench.graphs: error: ") and text in line, line


def test_graph_bench_default_rows_fit_a_small_max_rows(cpu_platform):
    from graphattn.bench import graphs

    assert graphs.parse_args(["--max-rows", "8"]).rows == 8
    assert graphs.parse_args([]).rows == min(64, graphs.parse_args([]).max_rows)


# -- J: a failing tensor-parallel rank -----------------------------------------------------------
@pytest.mark.parametrize("backend, line", [
    ("FailRank1", "graphattn bench: error: rank 1 failed: RuntimeError: rank 1 backend exploded"),
    ("KillRank1", "graphattn bench: error: rank 1 failed: killed by SIGKILL"),
])
def test_tp_rank_failure_is_one_line_exit_3(backend, line, tmp_path, backends_dir):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = run_cli("bench", "--tp", "2", *TINY, "--heads", "8", "--attn-backend", f"robust_backends:{backend}",
                   env={"GRAPHATTN_PLATFORM": "cpu", "TMPDIR": str(tmp)}, backends=backends_dir)
    assert proc.returncode == EXIT_RUN_FAILED == 3, proc.stdout + proc.stderr
    assert error_lines(proc.stderr) == [line], proc.stderr
    assert list(tmp.iterdir()) == []  # the rendezvous folder and torch's error files are gone


def test_rank_failed_out_of_memory():
    from graphattn.bench.tp import RankFailed

    assert RankFailed(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB").out_of_memory
    assert not RankFailed(1, "RuntimeError: rank 1 backend exploded").out_of_memory
    assert str(RankFailed(1, "killed by SIGKILL")) == "rank 1 failed: killed by SIGKILL"
