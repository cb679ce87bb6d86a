"""The ``graphattn`` command line: list, check (through pytest), bench (tiny shapes)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
import torch

import graphattn
from graphattn.backends import builtin_backends, default_dtype, resolve_backend
from graphattn.cli import main
from graphattn.common import current_platform

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--heads", "4", "--topk", "8", "--pool-tokens", "64", "--batch-sizes", "1,3",
        "--layers", "3", "--measure-layers", "2", "--iters", "2", "--warmup", "1"]


def run_cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "graphattn", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_list_table(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("platform: ")
    for name in builtin_backends():
        assert f"\n{name} " in out
    # The CPU caveat of the Triton backends, shown exactly where they run in the interpreter.
    assert ("Triton interpreter" in out) == current_platform().uses_triton_interpreter


def test_list_json_reports_reasons(capsys):
    assert main(["list", "--json", "--dtype", "float32"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in report["backends"]}
    assert rows["torch"]["available"] and rows["torch"]["reasons"] == []
    assert not rows["flashmla"]["available"]
    assert "dtype float32 not in supported" in rows["flashmla"]["reasons"][0]
    assert not rows["flashmla"]["pads_q"] and rows["flashmla"]["uses_workspace"] and rows["trtllm"]["uses_counter"]


def test_check_runs_the_suite_and_writes_junit(tmp_path):
    xml = tmp_path / "torch.xml"
    proc = run_cli("check", "--attn-backend", "torch", "-k", "one_row or ragged", "--junitxml", str(xml))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 passed" in proc.stdout
    suite = ElementTree.parse(xml).getroot().find("testsuite")
    assert suite.get("name") == "graphattn-conformance" and suite.get("tests") == "6"
    assert all("torch-" in case.get("name") for case in suite.iter("testcase"))


def test_check_unknown_backend_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check", "--attn-backend", "nope"])
    assert exit_.value.code == 2
    assert "Unknown attention backend: 'nope'. Valid options are: all, " in capsys.readouterr().err


def test_check_failure_exit_code():
    env_tests = str(ROOT / "tests")
    proc = subprocess.run(
        [sys.executable, "-m", "graphattn", "check", "--attn-backend", "broken_backend:RebindingQPadBackend",
         "-k", "decode-full"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([env_tests, str(ROOT)])),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FreedCaptureBufferError" in proc.stdout


def test_bench_tiny_all_modes(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", *TINY, "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert "captured bucket 3 rows" in captured.err  # progress on stderr
    report = json.loads(path.read_text())
    platform = current_platform()
    auto = resolve_backend("auto", 4, default_dtype(platform), 8, platform).name  # torch on CPU
    assert report["backend"] == auto and report["requested"] == "auto" and report["ok"]
    assert [(r["mode"], r["rows"]) for r in report["results"]] == [
        (m, r) for m in ("eager", "full", "breakable") for r in (1, 3)
    ]
    for r in report["results"]:
        assert r["layer_us"] > 0 and r["step_ms"] == pytest.approx(r["layer_us"] * 3 / 1e3)
        assert 0 < r["roofline_fraction"]
        assert r["layer_us_min"] <= r["layer_us"] <= r["layer_us_max"] and r["samples"] >= 1
    assert len(report["checks"]) == 6 and "us/layer" in captured.out
    # What a bug report needs: the exact command, the iteration counts, the environment.
    assert report["command"]["line"] == shlex.join(["graphattn", "bench", *TINY, "--json", str(path)])
    assert report["timing"]["iters"] == 2 and report["timing"]["warmup"] == 1
    assert report["env"]["torch"]["version"] == torch.__version__
    assert {b["name"] for b in report["env"]["backends"]} >= set(builtin_backends())
    assert report["device_numbers"] == platform.has_gpu
    assert ("CPU NUMBERS ARE NOT DEVICE NUMBERS" in captured.out) == (not platform.has_gpu)


def test_bench_point_is_the_median_of_its_samples():
    from graphattn.bench.decode import result_row
    from graphattn.bench.workload import DecodeWorkload

    wl = DecodeWorkload(num_heads=4, topk=8, pool_tokens=64, batch_sizes=(1,), num_layers=3, measure_layers=2)
    row = result_row(wl, "eager", 1, [2e-3, 900e-3, 4e-3], (1e9, 1e12, "test"))  # one outlier
    assert row["layer_us"] == pytest.approx(4e-3 / 2 * 1e6)
    assert row["layer_us_min"] == pytest.approx(1e3) and row["layer_us_max"] == pytest.approx(450e3)
    assert row["samples"] == 3


def test_env_reports_versions_platform_and_backends(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    platform = current_platform()
    for line in (f"graphattn: {graphattn.__version__}", f"torch: {torch.__version__}", "triton: ",
                 "python: ", f"platform: {platform.name} ("):
        assert line in out, out
    for name in builtin_backends():
        assert f"\n  {name}: " in out
    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["platform"]["name"] == platform.name and env["platform"]["why"]
    assert env["torch"]["cuda"] == torch.version.cuda


def test_env_says_why_a_backend_is_unavailable():
    from graphattn.backends.report import environment

    env = environment("test", heads=16, topk=64, dtype=torch.float32)
    rows = {r["name"]: r for r in env["backends"]}
    assert rows["torch"]["available"] and not rows["flashmla"]["available"]
    assert "dtype float32 not in supported" in rows["flashmla"]["reasons"][0]


@pytest.mark.parametrize("backend", ["trtllm", "flashmla"])
def test_bench_triton_backend_in_interpreter(backend, capsys):
    assert main(["bench", "--attn-backend", backend, *TINY, "--modes", "full", "--batch-sizes", "2"]) == 0
    out = capsys.readouterr().out
    assert f"backend {backend} (requested {backend})" in out and "check [full, 2 rows]: ok" in out


def test_bench_rejects_bad_workload(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--topk", "128", "--pool-tokens", "64"])
    assert exit_.value.code == 2
    assert "--pool-tokens (64) must be >= --topk (128)" in capsys.readouterr().err


def test_python_dash_m_and_bad_backend():
    proc = run_cli("bench", "--attn-backend", "nope")
    assert proc.returncode == 2
    assert "Unknown attention backend: 'nope'. Valid options are: auto" in proc.stderr
