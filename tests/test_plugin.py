"""The pytest plugin is inert unless asked for, and the console script resolves like ``python -m``.

Installing graphattn registers ``graphattn.testing.plugin`` for every pytest run of the
environment. A project that knows nothing of graphattn must run unchanged: its own
``--attn-backend`` option kept, no torch imported, ``TRITON_INTERPRET`` never set; a project
that runs graphattn's suite gets ``TRITON_INTERPRET`` back unset when the session ends.
Each run here is a fresh interpreter in a temporary project; ``-p graphattn.testing.plugin``
loads the plugin exactly as the entry point does, installed or not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A project with its own --attn-backend option; at the end of the session it records what the
# process looked like.
FOREIGN_CONFTEST = '''
import json, os, sys

def pytest_addoption(parser):
    parser.addoption("--attn-backend", default="mine", help="this project's own option")

def pytest_unconfigure(config):
    state = {
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "torch": "torch" in sys.modules,
        "triton": "triton" in sys.modules,
        "plugin": config.pluginmanager.hasplugin("graphattn.testing.plugin"),
        "graphattn_backends": config.getoption("graphattn_backends"),
    }
    with open(os.path.join(str(config.rootpath), "state.json"), "w") as f:
        json.dump(state, f)
'''
FOREIGN_TEST = '''
def test_own_option(request):
    assert request.config.getoption("--attn-backend") == "theirs"
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def foreign_project(tmp_path: Path) -> Path:
    (tmp_path / "conftest.py").write_text(FOREIGN_CONFTEST)
    (tmp_path / "test_foreign.py").write_text(FOREIGN_TEST)
    return tmp_path


def _pytest(project: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [sys.executable, "-m", "pytest", "-p", "graphattn.testing.plugin", "-p", "no:cacheprovider",
           "-q", "--rootdir", str(project), *args]
    proc = subprocess.run(cmd, cwd=project, env=_env(), capture_output=True, text=True, timeout=600)
    state_file = project / "state.json"
    return proc, json.loads(state_file.read_text()) if state_file.exists() else {}


def test_foreign_project_runs_unchanged(foreign_project):
    proc, state = _pytest(foreign_project, "--attn-backend", "theirs", "test_foreign.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert state["plugin"], "the graphattn plugin was not loaded: this test would prove nothing"
    assert state["TRITON_INTERPRET"] is None
    assert not state["torch"] and not state["triton"], f"the plugin imported heavy modules: {state}"
    assert state["graphattn_backends"] is None  # --attn-backend went to the project, not to graphattn


def test_foreign_project_running_the_suite_gets_its_environment_back(foreign_project):
    # The project's own test and two graphattn cases (a Triton backend: on a CPU it needs the
    # interpreter while the suite runs), through the namespaced option.
    proc, state = _pytest(foreign_project, "--attn-backend", "theirs", "--graphattn-backend", "trtllm",
                          "--graphattn-shapes", "small", "test_foreign.py", "--pyargs", "graphattn.testing",
                          "-k", "test_own_option or (one_row and eager)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout, proc.stdout
    assert state["graphattn_backends"] == ["trtllm"]
    assert state["TRITON_INTERPRET"] is None, "the suite left TRITON_INTERPRET set"


def test_old_spellings_are_aliases_where_free(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "graphattn.testing.plugin", "-p", "no:cacheprovider",
         "--pyargs", "graphattn.testing", "--collect-only", "-q", "--attn-backend", "torch",
         "--conformance-shapes", "small", "--conformance-dtype", "float32", "-k", "one_row"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line.rsplit("[", 1)[-1].rstrip("]") for line in proc.stdout.splitlines() if "[" in line]
    assert ids == ["torch-one_row-eager", "torch-one_row-full", "torch-one_row-breakable"], proc.stdout


def test_alias_is_skipped_when_taken():
    from graphattn.testing.plugin import ALIASES, add_free_aliases, pytest_addoption

    parser = pytest.Parser(_ispytest=True)
    parser.addoption("--attn-backend", default="mine")  # a conftest got there first
    pytest_addoption(parser)
    assert add_free_aliases(parser) == [a for a in ALIASES if a != "--attn-backend"]
    ns = parser.parse(["--attn-backend", "x", "--graphattn-backend", "torch"])
    assert ns.attn_backend == "x" and ns.graphattn_backends == ["torch"]


def test_import_is_cheap_and_changes_no_environment():
    code = (
        "import importlib.metadata, json, os, sys\n"
        "import graphattn, graphattn.testing.plugin\n"
        "light = not ({'torch', 'triton'} & set(sys.modules))\n"
        "from graphattn.kernels import register_ops\n"
        "register_ops()  # defines every kernel (in the interpreter on a CPU)\n"
        "print(json.dumps([light, os.environ.get('TRITON_INTERPRET'), graphattn.__version__]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    light, interpret, version = json.loads(proc.stdout.strip().splitlines()[-1])
    assert light, "import graphattn / the plugin imported torch or triton"
    assert interpret is None, f"TRITON_INTERPRET left set to {interpret!r}"
    assert version and version[0].isdigit()


def test_triton_imported_in_the_wrong_mode_is_named():
    # torch.compile imports triton; on a CPU its helpers are then compiled functions that
    # interpreted kernels cannot call. graphattn says so at import, with the fix.
    from graphattn.common.platform import kernels_interpreted

    if not kernels_interpreted():
        pytest.skip("kernels compile on this machine: triton has one mode for everyone")
    code = "import torch._dynamo\nfrom graphattn.kernels import register_ops\nregister_ops()\n"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "set TRITON_INTERPRET=1 in the environment" in proc.stderr, proc.stderr[-2000:]


TOY = '''
from graphattn.backends.torch_ref import TorchBackend


class ToyBackend(TorchBackend):
    name = "toy"
'''
CONSOLE_SCRIPT = "import sys\nfrom graphattn.cli import main\nsys.exit(main())\n"


def test_console_script_finds_module_class_in_the_current_directory(tmp_path):
    """A console script has its own folder on ``sys.path``, not the current directory (as
    ``python -m`` has); ``graphattn check --attn-backend my_attn:ToyBackend`` must work in both."""
    project, bin_dir = tmp_path / "project", tmp_path / "bin"
    project.mkdir()
    bin_dir.mkdir()
    (project / "my_attn.py").write_text(TOY)
    script = bin_dir / "graphattn"
    script.write_text(CONSOLE_SCRIPT)
    args = ["check", "--attn-backend", "my_attn:ToyBackend", "-k", "one_row and eager"]
    for cmd in ([sys.executable, str(script), *args], [sys.executable, "-m", "graphattn", *args]):
        proc = subprocess.run(cmd, cwd=project, env=_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}\n{proc.stderr}"
        assert "1 passed" in proc.stdout, proc.stdout
