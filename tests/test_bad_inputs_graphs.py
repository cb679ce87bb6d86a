"""The bad-input matrix, graph and process side: GraphRunner (full and breakable mode),
BreakableGraph, the registry and the environment variables (the backend side, with the
helpers, is test_bad_inputs.py). Each case asserts the exception type and that the message
names the argument.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from graphattn.backends import get_backend_class, resolve_backend
from graphattn.backends.registry import (available_backends, backend_names, register_backend,
                                         unregister_backend)
from graphattn.backends.registry import refusal_reasons as registry_refusal_reasons
from graphattn.common import current_platform, reset_platform_cache
from graphattn.common import validation
from graphattn.graphs import BreakableGraph, GraphRunner, eager_on_graph

from test_bad_inputs import DTYPE, HEADS, TOPK, expect, indices, kv_pool, make, q_rows


# -- GraphRunner: constructor and run, in both graph modes ------------------------------------
def _runner(name: str, mode: str, buckets=(1, 4)):
    backend = make(name)
    md = backend.make_metadata(4)
    kv = kv_pool()
    step = eager_on_graph(backend.forward)  # a break in breakable mode
    runner = GraphRunner(lambda q: step(q, kv, md), {"q": q_rows(4)}, metadata=md, buckets=list(buckets), mode=mode)
    backend.plan(md, indices(4))
    runner.capture()
    return backend, md, runner


RUN_CASES = {
    "q one head (would broadcast)": (lambda: {"q": q_rows(2, heads=1)}, ValueError, ["'q'", f"[rows, {HEADS}, 576]"]),
    "q 2-D (would broadcast)": (lambda: {"q": q_rows(2)[:, 0]}, ValueError, ["'q'", f"[rows, {HEADS}, 576]"]),
    "q float32 (would cast)": (lambda: {"q": q_rows(2, dtype=torch.float32)}, ValueError, ["'q'", "float16", "float32"]),
    "q int8 (would cast)": (lambda: {"q": q_rows(2).to(torch.int8)}, ValueError, ["'q'", "int8"]),
    "q head dim 512": (lambda: {"q": q_rows(2)[..., :512]}, ValueError, ["'q'", "576"]),
    "q on meta": (lambda: {"q": q_rows(2).to("meta")}, ValueError, ["'q'", "meta"]),
    "q a list": (lambda: {"q": [[1.0]]}, TypeError, ["'q'", "tensor"]),
    "unknown input": (lambda: {"x": q_rows(2)}, ValueError, ["['q']", "['x']"]),
    "zero rows": (lambda: {"q": q_rows(0)}, ValueError, ["at least one row"]),
    "more rows than planned": (lambda: {"q": q_rows(1)}, ValueError, ["live inputs have 1 rows", "plan("]),
}


@pytest.mark.parametrize("mode", ["full", "breakable"])
@pytest.mark.parametrize("case", list(RUN_CASES))
def test_runner_run(case, mode):
    make_live, exc, words = RUN_CASES[case]
    for name in ("torch", "flashmla_mega"):  # a non-Triton and a Triton forward
        backend, md, runner = _runner(name, mode)
        backend.plan(md, indices(0 if case == "more rows than planned" else 2), pad_to=4)
        with expect(exc, *words, who=f"{name}, {mode}"):
            runner.run(**make_live())


@pytest.mark.parametrize("mode", ["full", "breakable"])
def test_runner_pads_the_plan_to_its_bucket(mode):
    backend, md, runner = _runner("torch", mode)
    backend.plan(md, indices(4))
    backend.plan(md, indices(2))  # no pad_to: the runner pads rows 2:4 of bucket 4 itself
    runner.run(q=q_rows(2))
    assert md.num_planned_rows == 4, f"torch, {mode}"
    assert (md.indices.tensor[2:4] == -1).all(), f"torch, {mode}: padding rows hold another step's indices"


@pytest.mark.parametrize("mode", ["full", "breakable"])
def test_runner_refuses_to_replay_after_a_refused_plan(mode):
    backend, md, runner = _runner("torch", mode)
    backend.plan(md, indices(2))
    runner.run(q=q_rows(2))
    bad = indices(2)
    bad[1, 3] = -9
    with expect(IndexError, "row 1", "-9", who=f"torch, {mode}"):
        backend.plan(md, bad, check_indices=True)
    with expect(ValueError, "refused its indices", who=f"torch, {mode}"):
        runner.run(q=q_rows(2))  # the table still holds the previous step's indices


@pytest.mark.parametrize("mode", ["full", "breakable"])
def test_runner_captures_without_a_plan_but_replays_refuse_it(mode):
    backend = make("torch")
    md = backend.make_metadata(4)
    kv = kv_pool()
    runner = GraphRunner(lambda q: backend.forward(q, kv, md), {"q": q_rows(4)}, metadata=md, buckets=[4], mode=mode)
    runner.capture()  # inert rows: no plan needed to capture
    with expect(ValueError, "plan() has not been called", who=f"torch, {mode}"):
        runner.run(q=q_rows(3))
    with expect(ValueError, "plan() has not been called", who=f"torch, {mode}"):
        backend.forward(q_rows(3), kv, md)  # the capture's allowance ended with it


RUNNER_CTOR_CASES = {
    "empty buckets": (dict(buckets=[]), ValueError, ["buckets is empty", "buckets=None"]),
    "float bucket": (dict(buckets=[2.5]), TypeError, ["buckets", "2.5"]),
    "zero bucket": (dict(buckets=[0, 2]), ValueError, ["buckets", "[1, 4]"]),
    "bucket > rows": (dict(buckets=[8]), ValueError, ["buckets", "[1, 4]"]),
    "mode": (dict(mode="partial"), ValueError, ["mode", "partial"]),
    "no inputs": (dict(static_inputs={}), ValueError, ["static_inputs"]),
    "input not a tensor": (dict(static_inputs={"q": [1.0]}), TypeError, ["static input 'q'"]),
    "rows differ": (dict(static_inputs={"q": torch.zeros(4, 2), "k": torch.zeros(3, 2)}), ValueError, ["dim 0"]),
    "pad value name": (dict(pad_values={"k": 0}), ValueError, ["pad_values", "'k'"]),
    "fn": (dict(fn=None), TypeError, ["fn", "callable"]),
    "platform": (dict(platform="cpu"), TypeError, ["platform"]),
}


@pytest.mark.parametrize("case", list(RUNNER_CTOR_CASES))
def test_runner_constructor(case):
    kwargs, exc, words = RUNNER_CTOR_CASES[case]
    args = dict(fn=lambda q: q * 2, static_inputs={"q": torch.zeros(4, 2)}) | kwargs
    with expect(exc, *words):
        GraphRunner(**args)


# -- BreakableGraph -------------------------------------------------------------------------
def test_breakable_graph():
    with expect(TypeError, "platform"):
        BreakableGraph(platform="cuda")
    graph = BreakableGraph()
    with expect(TypeError, "fn", "callable"):
        graph.capture(None)
    with expect(TypeError, "fn", "callable"):
        graph.warmup("step")
    with expect(RuntimeError, "replay() before capture()"):
        graph.replay()
    x = torch.ones(2)
    graph.capture(lambda t: t * 2, x)
    with expect(RuntimeError, "already captured"):
        graph.capture(lambda t: t * 2, x)


# -- registry -------------------------------------------------------------------------------
def test_registry():
    with expect(ValueError, "Unknown attention backend: 'nope'", "Valid options are", "torch"):
        get_backend_class("nope")
    with expect(TypeError, "name", "str"):
        get_backend_class(None)
    with expect(TypeError, "'os.path:join'", "AttentionBackend"):
        get_backend_class("os.path:join")
    with expect(ImportError, "no_such_module_here"):
        get_backend_class("no_such_module_here:Backend")
    with expect(TypeError, "name"):
        resolve_backend(7, HEADS, DTYPE, TOPK)
    with expect(ValueError, "'torch'", "num_heads=0", "--attn-backend"):
        resolve_backend("torch", 0, DTYPE, TOPK)
    with expect(ValueError, "'torch'", "topk=0"):
        resolve_backend("torch", HEADS, DTYPE, 0)
    with expect(ValueError, "Unknown attention backend: 'nope'"):
        resolve_backend("nope", HEADS, DTYPE, TOPK)


@pytest.mark.parametrize("args,word", [
    (dict(topk="64"), "topk"), (dict(topk=None), "topk"), (dict(num_heads=16.0), "num_heads"),
    (dict(dtype="bfloat16"), "dtype"), (dict(platform="cpu"), "platform"),
])
@pytest.mark.parametrize("name", ["torch", "auto"])
def test_registry_refuses_arguments_of_the_wrong_type(name, args, word):
    call = dict(num_heads=HEADS, dtype=DTYPE, topk=TOPK) | args
    with expect(TypeError, word, "must be", who=name):
        resolve_backend(name, **call)
    if name == "auto":
        with expect(TypeError, word, "must be"):
            available_backends(**call)


def test_register_backend_refuses_what_is_no_backend():
    for bad in (None, 5):
        with expect(TypeError, "name", "str"):
            register_backend(bad, "graphattn.backends.torch_ref:TorchBackend")
    for bad in ("", "a:b", " spaced "):
        with expect(ValueError, "name", repr(bad)):
            register_backend(bad, "graphattn.backends.torch_ref:TorchBackend")
    with expect(TypeError, "AttentionBackend", "dict"):
        register_backend("zz_not_a_backend", dict)
    assert "zz_not_a_backend" not in backend_names()
    # A string is imported lazily: one naming a non-backend becomes a refusal reason, and the
    # other backends stay listed.
    register_backend("zz_json", "json:JSONDecoder")
    try:
        assert any("AttentionBackend" in r for r in registry_refusal_reasons("zz_json", HEADS, DTYPE, TOPK))
        assert "torch" in available_backends(HEADS, DTYPE, TOPK)
    finally:
        unregister_backend("zz_json")


# -- environment variables ------------------------------------------------------------------
def test_platform_variable(monkeypatch):
    monkeypatch.setenv("GRAPHATTN_PLATFORM", "foo")
    reset_platform_cache()
    try:
        with expect(ValueError, "GRAPHATTN_PLATFORM", "foo"):
            current_platform()
    finally:
        monkeypatch.undo()
        reset_platform_cache()


def test_sanitize_variable(monkeypatch):
    monkeypatch.setenv("GRAPHATTN_SANITIZE", "maybe")
    with expect(ValueError, "GRAPHATTN_SANITIZE", "maybe", "unset"):
        BreakableGraph()
    with expect(ValueError, "GRAPHATTN_SANITIZE"):
        GraphRunner(lambda q: q, {"q": torch.zeros(2, 2)})
    monkeypatch.setenv("GRAPHATTN_SANITIZE", "off")
    assert BreakableGraph().sanitize is False


def test_switch_parsing():
    env = {"GRAPHATTN_X": " On "}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        assert validation.env_flag("GRAPHATTN_X") is True
        mp.setenv("GRAPHATTN_X", "")
        assert validation.env_flag("GRAPHATTN_X", default=True) is True
        mp.setenv("GRAPHATTN_X", "2")
        with expect(ValueError, "GRAPHATTN_X", "'2'"):
            validation.env_flag("GRAPHATTN_X")
        mp.setenv("GRAPHATTN_X", "JIT")
        assert validation.env_choice("GRAPHATTN_X", ("cached", "jit"), "cached") == "jit"
        mp.setenv("GRAPHATTN_X", "fast")
        with expect(ValueError, "GRAPHATTN_X", "'fast'", "['cached', 'jit']"):
            validation.env_choice("GRAPHATTN_X", ("cached", "jit"), "cached")


def test_launcher_variable_is_checked_when_the_kernels_load():
    code = "import graphattn.kernels.launch"
    env = {"GRAPHATTN_LAUNCHER": "fastest", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, "GRAPHATTN_LAUNCHER=fastest was accepted"
    last = proc.stderr.strip().splitlines()[-1]
    assert "ValueError" in last and "GRAPHATTN_LAUNCHER" in last and "'fastest'" in last, proc.stderr[-2000:]
