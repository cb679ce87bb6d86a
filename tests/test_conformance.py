"""The conformance suite on every built-in backend this machine supports, and proof that it bites.

On the CPU the Triton backends run in the interpreter at the ``small`` shape set (4 backends x
5 batch specs x 3 modes, less the Triton graph cases of the index-pattern specs; see
``_project_cases``). The broken
backends in ``broken_backend.py`` rebind a captured buffer; the suite must fail them with
FreedCaptureBufferError, both when its check functions are called directly and through the
pytest plugin (``--graphattn-backend module:Class``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graphattn.common import FreedCaptureBufferError
from graphattn.testing.checks import check_case
from graphattn.testing.plugin import conformance_params, selected_backends
from graphattn.testing.specs import REAL, SHAPES, SMALL

from broken_backend import RebindingCounterBackend, RebindingQPadBackend

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _project_cases() -> list:
    """The full small matrix, except that the index-pattern specs (ragged, duplicates) run only
    eagerly for the Triton backends: patterns do not interact with capture, and graph cases of
    interpreted kernels dominate the CPU run. `graphattn check` runs the full matrix."""
    from graphattn.backends import get_backend_class

    def keep(param) -> bool:
        case = param.values[0]
        if case.mode == "eager" or case.spec.pattern == "random":
            return True
        return not get_backend_class(case.backend).uses_triton

    return [p for p in conformance_params(selected_backends(None), "small") if keep(p)]


# `case`, not `graphattn_case`: the plugin parametrizes that name itself when it is loaded.
@pytest.mark.parametrize("case", _project_cases())
def test_builtin_backend_conformance(case):
    case.run()


def test_default_selection_is_every_builtin_on_cpu():
    assert selected_backends(None) == ["dispatch", "flashmla", "trtllm", "flashmla_mega", "torch"]


@pytest.mark.parametrize(
    "cls, spec",
    [(RebindingCounterBackend, "prefill_chunk"), (RebindingQPadBackend, "decode"),
     (RebindingQPadBackend, "prefill_chunk")],
)
def test_suite_catches_rebinding_backends(cls, spec):
    # The counter bug trips only when an eager chunk larger than every bucket runs between
    # replays (prefill_chunk); the q-pad bug trips on any bucket change.
    with pytest.raises(FreedCaptureBufferError) as err:
        check_case(cls, SMALL.spec(spec), "full", SMALL)
    assert f"{cls.__name__}." in str(err.value)  # the sanitizer names the rebound attribute
    notes = "".join(getattr(err.value, "__notes__", []))
    assert sys.version_info < (3, 11) or f"backend '{cls.name}'" in notes


def test_breakable_graph_runs_the_broken_backend_eagerly():
    # As a break, attention runs eagerly on every replay: no captured address to go stale.
    check_case(RebindingCounterBackend, SMALL.spec("prefill_chunk"), "breakable", SMALL)


def _run_suite(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "graphattn.testing", "-p", "graphattn.testing.plugin",
           "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(cmd, cwd=TESTS, env=env, capture_output=True, text=True, timeout=600)


def test_plugin_fails_broken_backend_with_freed_buffer_error():
    proc = _run_suite("--graphattn-backend", "broken_backend:RebindingCounterBackend", "-k", "prefill_chunk")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "FreedCaptureBufferError" in out and "backend 'broken_counter'" in out, out
    assert "1 failed, 2 passed" in out, out  # eager and breakable pass; the full graph fails


def test_plugin_passes_torch_backend():
    proc = _run_suite("--graphattn-backend", "torch", "-k", "decode or duplicates")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 passed" in proc.stdout, proc.stdout


def test_plugin_rejects_unknown_backend():
    proc = _run_suite("--graphattn-backend", "nope")
    assert proc.returncode != 0
    assert "Unknown attention backend: 'nope'. Valid options are:" in proc.stdout + proc.stderr


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=lambda s: s.name)
def test_shape_sets_exercise_what_they_claim(shape):
    specs = {s.name: s for s in shape.specs}
    assert list(specs) == ["one_row", "decode", "prefill_chunk", "ragged", "duplicates",
                           "nan_unselected_kv", "nan_q"]
    top = max(shape.buckets)
    assert specs["prefill_chunk"].max_rows > top, "the prefill chunk must miss every bucket"
    steps = specs["decode"].steps
    assert max(steps) <= top and any(b < a for a, b in zip(steps, steps[1:])) and any(
        b > a for a, b in zip(steps, steps[1:])), "decode must shrink and grow within the buckets"
    assert all(s.topk <= shape.pool_tokens for s in shape.specs)
    assert {s.pattern for s in shape.specs} == {"random", "ragged", "duplicates"}


def test_real_shapes_run_eagerly_on_the_torch_backend():
    # The GPU shape set's data generation and reference at real sizes (one row: cheap on a CPU).
    from graphattn.backends.torch_ref import TorchBackend

    check_case(TorchBackend, REAL.spec("one_row"), "eager", REAL, dtype=torch.float32)
