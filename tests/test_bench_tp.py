"""``graphattn bench --tp N``: heads split over ranks, all-reduce inside the captured step.

On the CPU two spawned processes run over gloo (the emulator replays each all-reduce in order);
on a machine with two GPUs the same command runs over NCCL. Every rank checks its attention
output and the all-reduced projection against the float64 reference and against one process
running every head.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_errors import _fails

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--heads", "16", "--topk", "32", "--pool-tokens", "128", "--batch-sizes", "1,4",
        "--layers", "2", "--measure-layers", "2", "--iters", "2", "--warmup", "1"]


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _bench_tp(tmp_path: Path, env: dict[str, str], *args: str) -> dict:
    path = tmp_path / "tp.json"
    proc = _run(["-m", "graphattn", "bench", "--tp", "2", *TINY, *args, "--json", str(path)], env)
    assert proc.returncode == 0, f"graphattn bench --tp 2 exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "tensor parallel: 2 ranks" in proc.stdout and "us/layer per rank:" in proc.stdout
    # Every rank freed its group before exiting (else gloo's threads end in the exit's
    # destructors, which aborted rank 0 now and then: see destroy_group).
    assert "outlived destroy_process_group" not in proc.stderr, proc.stderr
    return json.loads(path.read_text())


def _assert_tp_report(report: dict, backend: str, dist_backend: str) -> None:
    assert report["ok"] and report["backend"] == backend, report["checks"]
    assert report["tp"]["world_size"] == 2 and report["tp"]["dist_backend"] == dist_backend
    assert report["tp"]["heads_per_rank"] == 8 and report["workload"]["num_heads"] == 16
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    points = {(r["mode"], r["rows"]) for r in report["results"]}
    assert points == {(m, n) for m in ("eager", "full", "breakable") for n in (1, 4)}
    assert all(r["rank"] in (0, 1) for r in report["results"])  # the slowest rank of each point
    for rank in report["ranks"]:
        assert {(c["mode"], c["rows"]) for c in rank["checks"]} == points, f"backend '{backend}' rank {rank['rank']}"
        for c in rank["checks"]:  # ok already covers the bounds; a missing all-reduce is O(1) off
            assert c["ok"] and c["projection_max_abs_err"] < 0.05 and c["single_process_max_abs_err"] < 0.05, (
                f"backend '{backend}' rank {rank['rank']} [{c['mode']}, {c['rows']} rows]: {c}")


def test_tp2_on_cpu_processes_with_gloo(tmp_path):
    report = _bench_tp(tmp_path, {"GRAPHATTN_PLATFORM": "cpu"}, "--attn-backend", "torch")
    _assert_tp_report(report, "torch", "gloo")
    assert [r["device"] for r in report["ranks"]] == ["cpu", "cpu"]


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("backend", ["trtllm", "flashmla"])
def test_tp2_on_two_gpus_with_nccl(tmp_path, backend):
    report = _bench_tp(tmp_path, {}, "--attn-backend", backend, "--dtype", "bfloat16")
    _assert_tp_report(report, backend, "nccl")
    assert [r["device"] for r in report["ranks"]] == ["cuda:0", "cuda:1"]


# One rank (a world of one, gloo) in a fresh interpreter: torch._dynamo not imported yet, as in a
# spawned rank. The first TorchDispatchMode imports it, and with it torch.distributed.nn.functional,
# whose defaults bind group.WORLD; destroy_group must still free the group.
_TEARDOWN = """
import json, sys, torch, torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from graphattn.bench.tp import destroy_group, init_group

class Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

tmp, freed = sys.argv[1], {}
assert "torch._dynamo" not in sys.modules, "imported before any group: nothing left to test"
init_group("gloo", f"file://{tmp}/a", 0, 1, None)
with Mode():  # what the CPU graph emulator's capture does
    dist.all_reduce(torch.ones(2))
freed["after_dispatch_mode"] = destroy_group(0)
freed["dynamo_imported"] = "torch._dynamo" in sys.modules
init_group("gloo", f"file://{tmp}/b", 0, 1, None)
held = [dist.group.WORLD]  # something that keeps the group: destroy_group must say so
freed["held"] = destroy_group(0)
print(json.dumps(freed))
"""


def test_destroy_group_frees_the_group_after_a_dispatch_mode(tmp_path):
    proc = _run(["-c", _TEARDOWN, str(tmp_path)], {})
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    freed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert freed == {"after_dispatch_mode": True, "dynamo_imported": True, "held": False}, proc.stderr
    assert proc.stderr.count("outlived destroy_process_group") == 1, proc.stderr  # the held group only


@pytest.mark.parametrize("argv, message", [
    (["bench", "--heads", "16", "--tp", "3"], "--heads (16) must be a multiple of --tp (3)"),
    (["bench", "--tp", "0"], "--tp"),
])
def test_bad_tp_is_one_line_exit_2(argv, message, capsys, cpu_platform):
    assert message in _fails(argv, capsys)


def test_tp_must_match_torchrun_world_size(capsys, cpu_platform, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert "--tp (2) must equal torchrun's WORLD_SIZE (4)" in _fails(["bench", "--heads", "16", "--tp", "2"], capsys)
