"""``graphattn bench --tp 2`` interrupted: SIGINT or SIGTERM to the launcher alone (not its
process group) stops the ranks, removes the rendezvous folder and exits 130 with one line.

Before: ``mp.spawn(join=True)`` let the launcher wait on its non-daemon ranks, which ran on, and
``/tmp/graphattn-tp-*`` stayed behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cli_robustness import error_lines

ROOT = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    """Child processes of ``pid`` that are spawned ranks (not multiprocessing's resource tracker)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and "spawn_main" in cmdline:
            kids.append(int(entry.name))
    return kids


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _sigint_default() -> None:
    """In the launcher's process before exec: SIGINT at its default, as an interactive shell
    starts a command. pytest run as a background job of a non-interactive shell inherits SIGINT
    ignored, which the launcher would inherit too, and Python then installs no KeyboardInterrupt
    handler: the SIGINT case would not test the launcher."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_launcher_stops_its_ranks(signum, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    err_path = tmp_path / "stderr"
    env = dict(os.environ, GRAPHATTN_PLATFORM="cpu", TMPDIR=str(tmp),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "graphattn", "bench", "--tp", "2", "--batch-sizes", "1,2,4,8", "--iters", "400"]
    with open(err_path, "w") as err:
        # Its own session: the signal reaches the launcher only, as `kill PID` does.
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, preexec_fn=_sigint_default)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while "[graphattn bench rank" not in err_path.read_text():  # both ranks are timing
            assert proc.poll() is None, f"exited {proc.returncode} early:\n{err_path.read_text()}"
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)
        ranks = _children(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(proc.pid, signum)
        code = proc.wait(timeout=60)
        stderr = err_path.read_text()
        assert code == 130, stderr
        name = signal.Signals(signum).name
        assert error_lines(stderr) == [f"graphattn bench: error: interrupted by {name}: stopped 2 ranks"], stderr
        time.sleep(0.5)
        assert not [r for r in ranks if _running(r)], "ranks still running after the launcher exited"
        assert not [p.name for p in tmp.iterdir() if p.name.startswith("graphattn-tp-")]
    finally:
        for pid in [*ranks, proc.pid]:  # only what this test started
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
