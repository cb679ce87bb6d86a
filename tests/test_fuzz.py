"""The fuzz harness (graphattn.testing.fuzz): random shapes for every backend against the float64
reference, issue 10's regression shapes, and isolation of crashing cases.

On the CPU the kernels run under the Triton interpreter on small shapes; scripts/gpu_fuzz.sh
runs hundreds of cases per backend on a GPU, and under compute-sanitizer memcheck.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import pytest
import torch

from graphattn.common.platform import current_platform
from graphattn.testing import fuzz
from graphattn.testing.fuzz_runner import BUILTIN, main, run_cases

TESTS = Path(__file__).parent


def _failures(summary) -> str:
    return "\n".join(r.message or r.case.label for r in summary.failures)


def test_random_cases_every_backend():
    """Fresh random shapes per run of the suite (the seed is printed on failure)."""
    seed = random.randrange(2**31)
    cases = fuzz.draw_cases(list(BUILTIN), 6, seed, fuzz.CPU)
    summary = run_cases(cases, isolate=False)
    assert summary.clean, f"fuzz seed {seed}:\n{_failures(summary)}"
    for backend in BUILTIN:
        assert summary.counts[backend]["ok"] >= 5, f"backend '{backend}': {summary.counts[backend]} (seed {seed})"


def test_regression_shapes_flashmla():
    """Issue 10's shapes (pool of 1 token, top-k below a tile, strided and offset q/kv)."""
    summary = run_cases(fuzz.regression_cases(["flashmla"]), isolate=False)
    assert summary.clean, _failures(summary)
    assert summary.counts["flashmla"]["ok"] == len(fuzz.REGRESSION_SHAPES)


def test_regression_shapes_reach_every_gluon_kernel_on_sm90():
    """On an H200 the regression shapes run each of flashmla's Gluon kernels, the two-split
    cluster merge, the partials in the accumulator's order (also for a partly-masked head block)
    and wgmma_tn's FP8 ring, raw tile and early indices included (random draws seldom plan
    them), so the GPU sweep checks them all."""
    from graphattn.common.platform import DeviceFacts
    from graphattn.cuda.configs import gluon_available
    from graphattn.cuda.platform import CudaPlatform

    if not gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect: sm_90 plans no Gluon kernel")
    h200 = CudaPlatform(DeviceFacts("nvidia", "H200", 132, capability=(9, 0)), device="cuda:0")
    ran, masked = set(), set()
    for case in fuzz.regression_cases(["flashmla"]):
        q, kv, _ = fuzz.make_inputs(case, torch.device("cpu"))  # its layouts: aligned or not
        fp8 = " fp8" if case.kv_dtype == fuzz.KV_FP8 else ""
        label = fuzz.kernel_label(case, q, kv, h200) + fp8  # the label the GPU sweep prints
        ran.add(label)
        if case.heads % 64:
            masked.add(label)
    native = {"wgmma_rr+native", "wgmma_ws+native", "wgmma_ws+native fp8"}
    assert {"wgmma_rr+cluster", "wgmma_rr", "wgmma_rr+early", "wgmma_rr+native+early", "wgmma_ws", "wgmma_tn",
            "wgmma_ws+cluster fp8", "wgmma_tn+ring fp8", "wgmma_tn+raw fp8",
            "wgmma_tn+early fp8"} | native <= ran, sorted(ran)
    assert native <= masked, f"partly-masked head blocks' compact native partials: {sorted(masked)}"


def test_draws_reach_the_edges():
    """The generator reaches what the sweep must: a 1-token pool, top-k off every tile, odd
    heads, every q/kv layout, all-invalid rows, out-of-range indices."""
    cases = fuzz.draw_cases(["x"], 600, 0, fuzz.GPU)
    seen = lambda pred: sum(1 for c in cases if pred(c))  # noqa: E731
    assert seen(lambda c: c.pool == 1) >= 10
    assert seen(lambda c: c.topk % 16 and c.topk < 64) >= 30
    assert seen(lambda c: c.heads % 2 and c.heads > 64) >= 10
    assert seen(lambda c: c.heads == 128) >= 10 and seen(lambda c: c.topk >= 2048) >= 30
    assert {c.q_layout for c in cases} == set(fuzz.Q_LAYOUTS)
    assert {c.kv_layout for c in cases} == set(fuzz.KV_LAYOUTS)
    assert seen(lambda c: c.empty_rows) >= 50 and seen(lambda c: c.out_of_range > 0) >= 200
    assert all(c.rows * c.heads * c.topk <= fuzz.GPU.max_work for c in cases)


def test_inputs_follow_the_case():
    case = fuzz.FuzzCase("torch", rows=3, heads=5, topk=40, pool=9, q_layout="head_slice",
                         kv_layout="offset", offset=3, invalid=0.2, out_of_range=0.2, empty_rows=1, seed=5)
    q, kv, idx = fuzz.make_inputs(case, torch.device("cpu"))
    assert q.shape == (3, 5, 576) and q.stride(1) == 600 and not q.is_contiguous()
    assert kv.shape == (9, 576) and kv.data_ptr() % 16 == 6, "offset 3 bf16 elements = 6 bytes"
    assert idx.dtype == torch.int32 and idx.shape == (3, 40)
    valid = (idx >= 0) & (idx < 9)
    assert not valid[2].any(), "the last row is all-invalid"
    assert (idx == -1).any() and ((idx >= 9) | (idx < -1)).any() and valid[:2].any()
    q2, kv2, idx2 = fuzz.make_inputs(case, torch.device("cpu"))
    assert torch.equal(q, q2) and torch.equal(kv, kv2) and torch.equal(idx, idx2), "seeded"


def test_a_wrong_answer_is_caught(monkeypatch):
    """A backend whose output is off by a little more than the tolerance fails its case."""
    from graphattn.backends.torch_ref import TorchBackend

    forward = TorchBackend.forward
    monkeypatch.setattr(TorchBackend, "forward", lambda self, q, kv, md: (
        lambda o: (o[0] + 0.05, o[1]))(forward(self, q, kv, md)))
    case = fuzz.FuzzCase("torch", rows=2, heads=3, topk=20, pool=50, invalid=0.0, seed=1)
    result = fuzz.run_case(case)
    assert result.status == "wrong" and "out max error" in result.message, result
    assert "backend 'torch'" in result.message


def test_a_crash_does_not_hide_the_next_case():
    """A worker that dies is reported as a crash (with its stderr), and the next case runs in a
    fresh worker."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    base = fuzz.FuzzCase("crashing_backend:CrashingBackend", rows=1, heads=3, topk=8, pool=20, seed=2)
    cases = [dataclasses.replace(base, heads=7), base, dataclasses.replace(base, heads=7), base]
    results = []
    summary = run_cases(cases, isolate=True, env=env, on_result=results.append, timeout=300)
    assert [r.status for r in results] == ["crash", "ok", "crash", "ok"], [r.message for r in results]
    assert "exit code 9" in results[0].message


def test_cli_writes_counts(tmp_path):
    path = tmp_path / "fuzz.json"
    assert main(["--backends", "torch", "--cases", "3", "--no-isolate", "--quiet", "--json", str(path)]) == 0
    *results, counts = [json.loads(line) for line in path.read_text().splitlines()]
    assert counts["counts"]["torch"]["ok"] == 3 and len(results) == 3
    assert all(r["status"] == "ok" and r["case"]["backend"] == "torch" for r in results)
    with pytest.raises(SystemExit):
        main(["--cases", "0"])


def test_time_limit_stops_starting_cases_and_still_reports(tmp_path, capsys):
    """``--time-limit``: no case starts after it; the counts of those that ran are printed and
    written, and a clean time-boxed sweep exits 0 (gpu_fuzz.sh once lost its table to ``timeout``)."""
    path = tmp_path / "fuzz.json"
    assert main(["--backends", "torch", "--cases", "4", "--no-isolate", "--quiet", "--time-limit", "0",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 cases in" in out and "(time limit: 4 not started)" in out, out
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 1 and "counts" in lines[0], lines
    cases = fuzz.draw_cases(["torch"], 3, 0, fuzz.CPU)
    ran = []
    run_cases(cases, isolate=False, on_result=ran.append, deadline=float("inf"))
    assert len(ran) == 3
    with pytest.raises(SystemExit):
        main(["--time-limit", "-1"])


def test_unaligned_inputs_run_the_heads_major_tiles(monkeypatch):
    """Issue 10: neither the wgmma kernel nor the tokens-major tile gets inputs whose rows are
    not 16-byte aligned, whatever the row and head count; they run the heads-major tiles."""
    from graphattn.cuda import configs as cuda_configs
    from graphattn.kernels import flashmla

    monkeypatch.setattr(type(current_platform()), "kernel_config",
                        lambda self, p, **kw: cuda_configs.kernel_config(p, **kw))
    kv_ok = torch.randn(100, 576)
    bad = {"kv row stride 600": torch.randn(100, 600)[:, :576],
           "kv offset 3": torch.randn(100 * 576 + 3)[3:].view(100, 576)}
    for rows, heads in ((1, 64), (1, 128), (2, 64), (8, 64), (1, 192)):
        q = torch.randn(rows, heads, 576)
        for name, kv in bad.items():
            assert flashmla.kernel_name(q, kv, 64) == "triton", f"[flashmla {rows}x{heads} {name}]"
        assert flashmla.kernel_name(q, kv_ok, 64) != "triton" or not cuda_configs.gluon_available()
