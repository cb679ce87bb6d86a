"""The shipped stress test (graphattn.testing.stress), short CPU variant: every built-in backend
in full and breakable graph modes, random bucket sequences, eager steps above the largest
bucket and above the reserved rows, cache flushes and victims, reference and bitwise checks.
The GPU run is scripts/gpu_stress.sh."""

from __future__ import annotations

import json
import random
import sys

import pytest

from graphattn.backends import builtin_backends
from graphattn.testing import stress
from graphattn.testing.stress import FAILURES, StressConfig, draw_rows, run_stress

# Every step checked against the reference, every third run twice; each kind of step drawn often.
CPU = StressConfig.small(ops=6, check_every=1, determinism_every=3, weights=(0.4, 0.3, 0.3), seed=13)


@pytest.mark.parametrize("mode", stress.MODES)
@pytest.mark.parametrize("name", builtin_backends())
def test_stress_cpu(name, mode):
    counts = run_stress(name, mode, CPU)
    label = f"backend '{name}' [{mode}]"
    assert counts.ops == CPU.ops and counts.replay + counts.eager + counts.oversized == CPU.ops, label
    assert counts.reference_checks == CPU.ops and counts.pools == 1, f"{label}: {counts}"
    found = {f: getattr(counts, f) for f in FAILURES if getattr(counts, f)}
    assert not found, f"{label}: {found}; first messages: {counts.messages}"


def test_draw_rows_covers_every_kind_within_its_range():
    cfg = StressConfig.small()
    rng = random.Random(0)
    seen = {}
    for _ in range(400):
        kind, rows = draw_rows(rng, cfg)
        seen.setdefault(kind, set()).add(rows)
    top = max(cfg.buckets)
    assert seen["replay"] == set(range(1, top + 1))
    assert seen["eager"] == set(range(top + 1, cfg.reserved + 1))
    assert seen["oversized"] == set(range(cfg.reserved + 1, cfg.reserved + cfg.oversize + 1))


def test_stress_counts_a_rebinding_backend(monkeypatch):
    # docs/design.md bug 1 written deliberately: the stress run must count it, not pass it.
    monkeypatch.syspath_prepend("tests")
    cfg = StressConfig.small(ops=4, weights=(0.5, 0.0, 0.5), seed=3)
    counts = run_stress("broken_backend:RebindingCounterBackend", "full", cfg)
    assert counts.failures > 0 and counts.messages, counts


def test_stress_command_line_writes_json_and_sums(tmp_path, capsys):
    path = tmp_path / "run.json"
    rc = stress.main(["--backends", "torch", "--modes", "full", "--ops", "3", "--seed", "5",
                      "--json", str(path)])
    assert rc == 0, capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["results"][0]["backend"] == "torch" and report["results"][0]["ops"] == 3
    assert report["config"]["seed"] == 5 and "platform" in report["platform"]
    assert stress.main(["--sum", str(path), str(path)]) == 0
    assert "| torch | full | 6 |" in capsys.readouterr().out
    assert stress.main(["--ops", "0"]) == 2 and "--ops must be >= 1" in capsys.readouterr().err
    assert sys.modules["graphattn.testing.stress"] is stress
