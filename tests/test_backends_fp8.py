"""Backends with the 656-byte FP8 KV layout: capability data, refusal reasons that name the
layout, the conformance suite with ``kv_dtype="fp8"`` (against the reference of the cache
dequantised into q's dtype), and ``graphattn list`` / ``check`` / ``bench --kv-dtype``."""

from __future__ import annotations

import json

import pytest
import torch

from graphattn.backends import AttentionBackend, builtin_backends, get_backend_class
from graphattn.backends import registry
from graphattn.cli import main
from graphattn.common import kv_layout
from graphattn.common.platform import current_platform
from graphattn.testing.checks import check_case
from graphattn.testing.plugin import conformance_params, selected_backends
from graphattn.testing.specs import SMALL

from test_cli import TINY, run_cli

FP8_PHRASE = "kv_dtype fp8 ([pool, 656] uint8 FP8 tokens) not in supported KV layouts ['auto']"


class PlainBackend(AttentionBackend):
    """A backend written before FP8 KV: takes only kv in q's dtype."""

    name = "plain"


class LegacyRefusalBackend(AttentionBackend):
    """Overrides refusal_reasons with the signature from before ``kv_dtype`` existed."""

    name = "legacy"

    @classmethod
    def refusal_reasons(cls, num_heads, dtype, topk, platform=None):
        return super().refusal_reasons(num_heads, dtype, topk, platform)


def test_builtin_backends_take_fp8_and_say_so():
    for name in builtin_backends():
        cls = get_backend_class(name)
        assert cls.supported_kv_dtypes == ("auto", "fp8"), f"backend '{name}': {cls.supported_kv_dtypes}"
        assert cls.capabilities()["kv_dtypes"] == ["auto", "fp8"], f"backend '{name}'"
        assert cls.refusal_reasons(16, torch.float16, 64, kv_dtype="fp8") == [], f"backend '{name}'"


def test_a_backend_without_fp8_refuses_naming_the_layout():
    assert PlainBackend.refusal_reasons(16, torch.float16, 64, kv_dtype="fp8") == [FP8_PHRASE]
    with pytest.raises(ValueError, match=r"refuses .*kv_dtype=fp8.*not in supported KV layouts"):
        PlainBackend(16, 64, torch.float16, kv_dtype="fp8")
    with pytest.raises(ValueError, match="Unknown kv_dtype: 'fp4'"):
        PlainBackend(16, 64, torch.float16, kv_dtype="fp4")
    assert "Unknown kv_dtype" in PlainBackend.refusal_reasons(16, torch.float16, 64, kv_dtype="fp4")[0]
    LegacyRefusalBackend(16, 64, torch.float16)  # the default layout never passes kv_dtype


def test_registry_resolves_with_the_layout():
    registry.register_backend("plain_fp8_test", PlainBackend)
    try:
        with pytest.raises(ValueError, match=r"kv_dtype=fp8 .*not in supported KV layouts"):
            registry.resolve_backend("plain_fp8_test", 16, torch.float16, 64, kv_dtype="fp8")
        assert "plain_fp8_test" not in registry.available_backends(16, torch.float16, 64, kv_dtype="fp8")
        assert "plain_fp8_test" in registry.available_backends(16, torch.float16, 64)
        auto = registry.resolve_backend("auto", 16, torch.float16, 64, kv_dtype="fp8")
        assert "fp8" in auto.supported_kv_dtypes
    finally:
        registry.unregister_backend("plain_fp8_test")


def test_fp8_backend_checks_the_kv_it_gets():
    backend = get_backend_class("torch")(4, 8, torch.float16, kv_dtype="fp8")
    md = backend.make_metadata(2)
    dev = backend.device
    backend.plan(md, torch.zeros(2, 8, dtype=torch.int32, device=dev))
    q = torch.randn(2, 4, 576, device=dev).half()
    with pytest.raises(ValueError, match=r"expected kv \[pool, 656\] torch.uint8 \(kv_dtype=fp8\)"):
        backend.forward(q, torch.randn(16, 576, device=dev).half(), md)
    out, lse = backend.forward(q, kv_layout.quantize_kv(torch.randn(16, 576, device=dev)), md)
    assert out.shape == (2, 4, 512) and out.dtype == torch.float16 and torch.isfinite(out).all()


def _fp8_cases() -> list:
    """Every spec eagerly for every backend; the graph modes on the decode spec, which shrinks
    and grows the batch across buckets (the interpreter is slow, and the layout does not
    interact with capture beyond that). `graphattn check --kv-dtype fp8` runs the full matrix."""
    def keep(param) -> bool:
        case = param.values[0]
        return case.mode == "eager" or case.spec.name == "decode"

    return [p for p in conformance_params(selected_backends(None), "small", kv_dtype="fp8") if keep(p)]


@pytest.mark.parametrize("case", _fp8_cases())
def test_builtin_backend_conformance_fp8(case):
    assert case.kv_dtype == "fp8" and case.id.endswith("-kv_fp8")
    case.run()


@pytest.mark.parametrize("name", ["flashmla", "trtllm", "flashmla_mega", "dispatch"])
def test_custom_ops_refuse_a_backend_of_another_fp8_format(name):
    """Under a full-graph capture the kernels run as custom ops, which read FP8 tokens in
    current_platform()'s format: a backend made for the other format refuses there (it used to
    read the cache as the wrong type: NaN), and runs eager and breakable graphs as before."""
    if current_platform().has_gpu:
        pytest.skip("needs a CPU platform of the other FP8 format")
    from graphattn.common.platform import CpuPlatform
    from graphattn.hip.launch import AmdLaunchTable

    other = CpuPlatform(launch_table=AmdLaunchTable("gfx942"))
    assert other.fp8_dtype != current_platform().fp8_dtype  # the test's premise
    spec = SMALL.spec("ragged")
    cls = get_backend_class(name)
    check_case(cls, spec, "breakable", SMALL, platform=other, kv_dtype="fp8")
    with pytest.raises(ValueError, match="custom ops"):
        check_case(cls, spec, "full", SMALL, platform=other, kv_dtype="fp8")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_torch_backend_reads_the_cache_dequantised_into_q_dtype(dtype):
    """The torch backend's FP8 semantics, pinned as the kernels' are (test_kernels_fp8)."""
    from graphattn.common.reference import sparse_mla_reference
    from graphattn.common.tolerances import tolerance
    from test_kernels_fp8 import rounding_tokens, worst_ratio

    fmt = current_platform().fp8_dtype
    q, kv8, idx, sm_scale = rounding_tokens(2, 16, 40, 64, dtype, fmt)
    backend = get_backend_class("torch")(16, 40, dtype, kv_dtype="fp8", sm_scale=sm_scale)
    md = backend.make_metadata(2)
    backend.plan(md, idx)
    got = backend.forward(q, kv8, md)
    tol = tolerance(dtype, "fp8")
    assert worst_ratio(got, sparse_mla_reference(q, kv8, idx, sm_scale), tol) <= 1, f"torch fp8 {dtype}"
    exact = sparse_mla_reference(q, kv_layout.dequantize_kv(kv8, fmt, torch.float64), idx, sm_scale)
    assert worst_ratio(got, exact, tol) > 3, f"torch fp8 {dtype}: follows the exactly dequantised cache"


def test_conformance_skips_a_backend_without_fp8_with_its_reason():
    (param, *_) = conformance_params(["torch"], "small", kv_dtype="fp8")
    assert not param.marks[1:], "torch takes FP8 KV"
    registry.register_backend("plain_fp8_test", PlainBackend)
    try:
        params = conformance_params(["plain_fp8_test"], "small", kv_dtype="fp8")
        reasons = [m.kwargs.get("reason", "") for p in params for m in p.marks if m.name == "skip"]
        assert len(reasons) == len(params) and FP8_PHRASE in reasons[0], reasons[0]
    finally:
        registry.unregister_backend("plain_fp8_test")


def test_check_case_catches_a_wrong_fp8_read_and_names_the_layout():
    # A kernel that reads the FP8 tokens wrongly (here: scales ignored) must fail, naming the layout.
    class ScalelessBackend(get_backend_class("torch")):
        name = "scaleless"

        def kv_rows_float(self, rows):
            return kv_layout.dequantize_kv(self._no_scales(rows), self.platform.fp8_dtype)

        @staticmethod
        def _no_scales(rows):
            rows = rows.clone()
            rows[..., 512:528] = torch.tensor(1.0).view(1).view(torch.uint8).repeat(4)
            return rows

    with pytest.raises(AssertionError, match=r"backend 'scaleless' \[decode/eager, torch.(b?float16), kv fp8\]"):
        check_case(ScalelessBackend, SMALL.spec("decode"), "eager", SMALL, kv_dtype="fp8")


def test_graphattn_check_passes_kv_dtype_to_the_suite():
    proc = run_cli("check", "--attn-backend", "torch", "--kv-dtype", "fp8", "-k", "one_row")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout, proc.stdout


def test_list_shows_kv_layouts(capsys):
    assert main(["list", "--kv-dtype", "fp8", "--heads", "16", "--topk", "64"]) == 0
    out = capsys.readouterr().out
    assert "kv_dtype=fp8" in out and " kv " in out.splitlines()[2]
    assert all(f"{n} " in out for n in builtin_backends()) and "auto,fp8" in out
    assert f"fp8_dtype={str(current_platform().fp8_dtype).replace('torch.', '')}" in out


@pytest.mark.parametrize("backend", ["torch", "flashmla_mega"])
def test_bench_fp8_counts_656_bytes_per_token(backend, tmp_path, capsys):
    path = tmp_path / "bench.json"
    args = ["bench", "--attn-backend", backend, *TINY, "--kv-dtype", "fp8", "--json", str(path)]
    if backend != "torch":
        args += ["--modes", "eager,full", "--batch-sizes", "2"]
    assert main(args) == 0
    report = json.loads(path.read_text())
    assert report["ok"] and report["workload"]["kv_dtype"] == "fp8", report["checks"]
    r = report["results"][0]
    elt = torch.empty((), dtype=getattr(torch, report["workload"]["dtype"])).element_size()
    expected = r["rows"] * (8 * 656 + 4 * (576 + 512) * elt)  # heads 4, topk 8
    layer_s = r["layer_us"] / 1e6
    assert r["gb_per_s"] == pytest.approx(expected / layer_s / 1e9)
    assert "kv_dtype=fp8" in capsys.readouterr().out


def test_bench_kv_dtype_names_the_model_dtype(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *TINY, "--kv-dtype", "bf16", "--dtype", "float16"])
    assert exit_info.value.code == 2
    assert "must be q's dtype" in capsys.readouterr().err


def test_kernel_bench_counts_656_bytes_and_dequantises():
    from graphattn.bench import kernels
    from graphattn.common.reference import sparse_mla_reference

    plain, flops, _ = kernels.roofline(8, 16, 2048)
    fp8, flops8, _ = kernels.roofline(8, 16, 2048, kv_fp8=True)
    assert plain - fp8 == 8 * 2048 * (1152 - 656) and flops == flops8
    s = kernels.make_copies(2, 4, 16, 2, device="cpu", kv_fp8=True)[0]
    assert s["kv"].dtype == torch.uint8 and s["kv"].shape[1] == 656
    out, lse = kernels.torch_reference(s["q"], s["kv"], s["idx"], 576**-0.5)
    ref, ref_lse = sparse_mla_reference(s["q"], s["kv"], s["idx"], 576**-0.5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=0.05, rtol=0, msg="kernel bench torch path, fp8")
    torch.testing.assert_close(out.double(), ref, atol=0.05, rtol=0.05, msg="kernel bench torch path, fp8")


def test_fuzz_fp8_cases_every_backend():
    """Random shapes, index mixes and byte layouts of FP8 tokens (4- but not always 16-byte
    aligned rows, poisoned bytes between rows) against the reference of the dequantised cache."""
    import dataclasses
    import random

    from graphattn.testing import fuzz
    from graphattn.testing.fuzz_runner import BUILTIN, run_cases

    seed = random.randrange(2**31)
    limits = dataclasses.replace(fuzz.CPU, kv_dtypes=("fp8",))
    cases = fuzz.draw_cases(list(BUILTIN), 3, seed, limits)
    assert all(c.kv_dtype == "fp8" for c in cases)
    summary = run_cases(cases, isolate=False)
    failures = "\n".join(r.message or r.case.label for r in summary.failures)
    assert summary.clean, f"fuzz seed {seed}:\n{failures}"
    for layout, n, aligned_16 in (("row_stride", 577, False), ("offset", 1, False), ("row_stride", 580, True)):
        case = fuzz.FuzzCase("torch", rows=2, heads=3, topk=9, pool=7, kv_layout=layout, stride=n,
                             offset=n, kv_dtype="fp8", seed=3)
        _, kv, _ = fuzz.make_inputs(case, torch.device("cpu"))
        assert kv.shape == (7, 656) and kv.dtype == torch.uint8 and kv.stride(0) % 4 == 0
        assert (kv.data_ptr() % 16 == 0 and kv.stride(0) % 16 == 0) == aligned_16, (layout, kv.stride())
        result = fuzz.run_case(case)
        assert result.status == "ok", result.message


@pytest.mark.parametrize("kv_fp8", [False, True])
def test_kernel_bench_pools_draw_distinct_tokens_of_the_rows_pool(kv_fp8):
    """``--pool-tokens`` (FlashMLA's benchmark conditions): the sets share the pools, one for all
    rows or one per ``rows_per_pool`` rows, and each row reads ``topk`` distinct tokens of its own
    pool; a pool smaller than top-k, or rows per pool without pools, is refused."""
    from graphattn.bench import kernels

    for rows_per_pool, pools in ((None, 1), (2, 150), (7, 43)):
        sets = kernels.make_copies(300, 4, 16, 2, device="cpu", kv_fp8=kv_fp8, pool_tokens=40,
                                   rows_per_pool=rows_per_pool)
        assert sets[0]["kv"] is sets[1]["kv"] and sets[0]["kv"].shape[0] == 40 * pools
        for s in sets:
            idx = s["idx"]
            assert idx.shape == (300, 16) and idx.dtype == torch.int32
            pool_of_row = torch.arange(300) // (rows_per_pool or 300)
            assert torch.equal(idx.long() // 40, pool_of_row[:, None].expand(300, 16)), "a row read another pool"
            assert all(len(set(row.tolist())) == 16 for row in idx), "a row read a token twice"
        assert not torch.equal(sets[0]["idx"], sets[1]["idx"])
    with pytest.raises(ValueError, match="at least topk"):
        kernels.make_copies(2, 4, 16, 2, device="cpu", pool_tokens=8)
    with pytest.raises(ValueError, match="needs pool_tokens"):
        kernels.make_copies(2, 4, 16, 2, device="cpu", rows_per_pool=2)


def test_kernel_bench_bars_are_the_issues_shapes():
    """``--bars``: flashmla at every shape issues 12 and 14 set a speed bar at, bf16 and FP8
    tokens, one table row each with its KV layout."""
    from graphattn.bench import kernels

    shapes = set(kernels.BAR_SHAPES)
    assert len(shapes) == len(kernels.BAR_SHAPES), "a shape twice"
    bf16 = {(h, r, t) for h, r, t, fp8 in shapes if not fp8}
    fp8 = {(h, r, t) for h, r, t, f in shapes if f}
    assert {(h, r, 2048) for h in (16, 32, 64, 128) for r in (1, 8)} <= bf16  # small batch: 10 and 14 us
    assert {(64, 64, 2048), (128, 64, 2048), (128, 512, 2048), (128, 64, 8192), (16, 512, 2048),
            (32, 512, 2048)} <= bf16  # the roofline and TFLOP/s bars
    assert {(16, 512, 2048), (128, 64, 2048)} <= fp8 and {(16, 1, 2048), (16, 8, 2048)} <= fp8
    assert all((h, r, t) in bf16 for h, r, t in fp8), "FP8 is compared with bf16 at the same shape"
    row = {"kv": "fp8", "heads": 16, "rows": 1, "topk": 2048, "path": "flashmla", "us": 8.97, "GBps": 150.0,
           "TFLOPs": 7.9, "roofline": 0.05}
    table = kernels.bars_markdown([row]).splitlines()
    assert table[0].startswith("| kv | heads")
    assert table[2] == "| fp8 | 16 | 1 | 2048 | flashmla | 8.97 | 150 | 7.9 | 0.05 |"


@pytest.mark.parametrize("argv,message", [
    (["--bars", "--quick"], "each choose the shapes"),
    (["--bars", "--pool-tokens", "4096"], "each choose the shapes"),
    (["--rows-per-pool", "2"], "--rows-per-pool needs --pool-tokens"),
    (["--pool-tokens", "4096", "--shape", "128x4096"], "expected HEADSxROWSxTOPK"),
    (["--pool-tokens", "1000"], "a pool needs at least topk (2048) tokens"),
])
def test_kernel_bench_refuses_bad_pool_options(argv, message, capsys):
    """The pool options are checked before anything runs (no GPU needed to be told)."""
    from graphattn.bench import kernels

    with pytest.raises(SystemExit) as exit_info:
        kernels.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
