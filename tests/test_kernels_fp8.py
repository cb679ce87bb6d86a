"""Every kernel path reading 656-byte FP8 KV tokens, against the float64 reference of the cache
dequantised into q's dtype (CPU: the Triton interpreter; GPU: compiled).

The kernels load each token's bytes, bitcast the nope part to the platform's FP8 format,
multiply each value by its token's float32 block scale in float32 and round it once to q's
dtype (``kv_layout.dequantize_kv``), then multiply as for a plain cache in q's dtype; so the
plain tolerances apply. Both FP8 formats run under the interpreter; a GPU runs only its own.
"""

from __future__ import annotations

import pytest
import torch

from graphattn.common import kv_layout
from graphattn.common.platform import current_platform, reset_platform_cache
from graphattn.common.reference import sparse_mla_reference
from graphattn.common.tolerances import tolerance

from test_kernels import DEVICE, _nan_poison, make_inputs, run_path  # noqa: F401

PATHS = ("flashmla", "trtllm", "mega")
FORMATS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


@pytest.fixture(params=FORMATS, ids=["e4m3fn", "e4m3fnuz"])
def fp8(request, monkeypatch):
    """A fresh platform whose FP8 format is the parameter (plans are memoised per platform)."""
    reset_platform_cache()
    platform = current_platform()
    native = platform.fp8_dtype
    if platform.has_gpu and request.param != native:
        pytest.skip(f"this GPU converts {native} only")
    monkeypatch.setattr(platform, "fp8_dtype", request.param, raising=False)
    yield request.param
    reset_platform_cache()


def fp8_inputs(rows, heads, topk, pool, dtype, fmt):
    """q in ``dtype``, kv quantised to 656-byte tokens, indices mixing valid, −1, out-of-range
    and duplicates; every token no index selects is poisoned with 0xFF bytes (NaN scale and
    rope), so a kernel that reads one returns NaN."""
    q, kv, idx = make_inputs(rows, heads, topk, pool, dtype)
    kv8 = kv_layout.quantize_kv(kv.float() * 4, fmt)  # amplitudes beyond 1 exercise the scales
    selected = torch.zeros(pool, dtype=torch.bool, device=kv8.device)
    ok = (idx >= 0) & (idx < pool)
    selected[idx[ok].long()] = True
    kv8[~selected] = 0xFF
    return q, kv8, idx


def check_fp8(path, q, kv8, idx, sm_scale, out, lse, counter, fmt):
    ref_out, ref_lse = sparse_mla_reference(q, kv8, idx, sm_scale, fp8_dtype=fmt)
    tol = tolerance(q.dtype, "fp8")  # the plain tolerance: the dequantised cache is a plain one
    where = f"[{path} fp8 {fmt} rows={q.shape[0]} heads={q.shape[1]} topk={idx.shape[1]} {q.dtype}]"
    assert out.shape == ref_out.shape and out.dtype == q.dtype, f"{where} out {out.shape} {out.dtype}"
    torch.testing.assert_close(out.double(), ref_out, atol=tol.atol, rtol=tol.rtol,
                               msg=lambda m: f"{where} out: {m}")
    torch.testing.assert_close(lse.double(), ref_lse, atol=tol.lse_atol, rtol=tol.lse_rtol,
                               msg=lambda m: f"{where} lse: {m}")
    if counter is not None:
        assert int(counter.abs().sum()) == 0, f"{where} counter not reset: {counter.tolist()}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads,topk", [(3, 37), (20, 50)])
def test_fp8_matches_reference_of_dequantised_cache(fp8, path, heads, topk):
    q, kv8, idx = fp8_inputs(3, heads, topk, 300, torch.float16, fp8)
    out, lse, counter = run_path(path, q, kv8, idx, 0.07)
    check_fp8(path, q, kv8, idx, 0.07, out, lse, counter, fp8)


@pytest.mark.parametrize("path", PATHS)
def test_fp8_bf16_queries(path):
    fmt = current_platform().fp8_dtype
    q, kv8, idx = fp8_inputs(2, 24, 45, 128, torch.bfloat16, fmt)
    out, lse, counter = run_path(path, q, kv8, idx, 576**-0.5)
    check_fp8(path, q, kv8, idx, 576**-0.5, out, lse, counter, fmt)


@pytest.mark.parametrize("path", PATHS)
def test_fp8_all_invalid_rows_and_duplicates(path):
    fmt = current_platform().fp8_dtype
    q, kv8, idx = fp8_inputs(4, 5, 40, 64, torch.float16, fmt)
    idx[1] = -1
    idx[2, ::2] = -1
    idx[2, 1::2] = 1 << 30  # far out of range: must not be read
    idx[3] = idx[3, :1]  # one token, 40 times
    out, lse, counter = run_path(path, q, kv8, idx, 0.1)
    assert torch.all(out[1:3] == 0) and torch.all(lse[1:3] == float("-inf")), f"[{path} fp8] empty rows"
    check_fp8(path, q, kv8, idx, 0.1, out, lse, counter, fmt)


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the interpreter's max over a NaN row
@pytest.mark.parametrize("path", PATHS)
def test_fp8_nan_code_in_a_selected_token_reaches_the_output(fp8, path):
    """A selected token holding the format's NaN code (e4m3fn 0x7F/0xFF, e4m3fnuz 0x80) makes
    its rows NaN, as the reference's; the rows that do not select it stay finite and right."""
    q, kv8, idx = fp8_inputs(3, 4, 24, 64, torch.float16, fp8)
    idx[1] = torch.where(idx[1] == 5, 6, idx[1])  # row 1 never selects token 5
    idx[0, 3] = idx[2, 7] = 5
    kv8[5] = kv_layout.quantize_kv(torch.randn(1, 576, device=kv8.device), fp8)[0]
    kv8[5, 100] = 0x80 if fp8 == torch.float8_e4m3fnuz else 0x7F
    out, lse, counter = run_path(path, q, kv8, idx, 0.1)
    ref_out, ref_lse = sparse_mla_reference(q, kv8, idx, 0.1, fp8_dtype=fp8)
    where = f"[{path} fp8 {fp8}]"
    assert ref_lse[[0, 2]].isnan().all() and not ref_lse[1].isnan().any(), where  # the test's premise
    assert lse[[0, 2]].isnan().all() and out[[0, 2]].isnan().all(), f"{where} NaN token read as a number"
    check_fp8(path, q[1:2], kv8, idx[1:2], 0.1, out[1:2], lse[1:2], None, fp8)


def test_fp8_tokens_need_the_656_byte_layout():
    from graphattn.kernels import sparse_mla_mega

    q, kv8, idx = fp8_inputs(2, 16, 8, 32, torch.float16, current_platform().fp8_dtype)
    with pytest.raises(ValueError, match=r"\[pool_tokens, 656\] uint8"):
        sparse_mla_mega(q, kv8[:, :576].contiguous(), idx, 0.1)
    with pytest.raises(ValueError, match="4-byte aligned"):
        unaligned = torch.zeros(32 * 656 + 2, dtype=torch.uint8, device=DEVICE)[2:].view(32, 656)
        sparse_mla_mega(q, unaligned, idx, 0.1)


def test_sm90_flashmla_reads_fp8_with_the_gluon_kernel(monkeypatch):
    """On sm_90 FP8 kv runs the warp-specialised Gluon kernel with ``KV_FP8=1`` at every row count (never the
    tokens-major tile, which spills with FP8); trtllm and mega keep the heads-major Triton tiles
    at sm_90's FP8 warp count (where they do not spill)."""
    from graphattn.cuda import configs as cuda_configs
    from graphattn.kernels import flashmla

    if not cuda_configs.gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect")
    monkeypatch.setattr(type(current_platform()), "kernel_config",
                        lambda self, p, **kw: cuda_configs.kernel_config(p, **kw))
    q = torch.randn(4, 64, 576)
    kv8 = kv_layout.quantize_kv(torch.randn(100, 576))
    assert flashmla.kernel_name(q, kv8, 2048) == "wgmma_ws"
    assert flashmla.kernel_name(q[:1], kv8, 2048) == "wgmma_ws"
    assert cuda_configs.kernel_config("flashmla", 4, 64, 2048, kv_fp8=True)["KV_FP8"] == 1
    assert flashmla.kernel_name(q[:1], q.new_empty(100, 576), 2048) == "triton_kv_major"  # plain kv
    cfg = cuda_configs.kernel_config("trtllm", 1, 16, 2048, kv_fp8=True)
    assert cfg["num_warps"] == cuda_configs.FP8_NUM_WARPS[cfg["BLOCK_H"]] == 8 and not cfg["KV_MAJOR"], cfg


def rounding_tokens(rows, heads, topk, pool, dtype, fmt):
    """``q, kv8, idx, sm_scale`` whose dequantisation into q's dtype rounds every value the same
    way, and whose lse shows it.

    Each block scale is ``2^-5 (1 + d)`` with ``d`` below half of q's dtype's relative ulp (2^-9
    bf16, 2^-12 fp16): ``fp8 * scale`` (exact in float32, at most 17 significant bits) rounds
    down to ``fp8 * 2^-5`` for every value, and the exactly dequantised cache is ``1 + d`` times
    the cache the paths read. The nope values are positive and q is all ones, so every nope
    score is large (about 100 after ``sm_scale``) and moves by ``d`` times that between the two;
    the rope part cancels most of it, so lse stays small (its tolerance is mostly ``lse_atol``)."""
    q, kv8, idx = fp8_inputs(rows, heads, topk, pool, dtype, fmt)  # for the indices and poison
    read = ~(kv8 == 0xFF).all(dim=1)  # the unselected tokens keep their NaN poison
    n = int(read.sum())
    values = kv_layout.quantize_kv(torch.rand(n, 576, device=kv8.device) + 0.5, fmt)
    d = 2.0**-9 if dtype == torch.bfloat16 else 2.0**-12
    values[:, kv_layout.SCALE_OFFSET:kv_layout.ROPE_OFFSET] = torch.full(
        (n, kv_layout.NUM_TILES), 2.0**-5 * (1 + d), device=kv8.device).view(torch.uint8)
    nope = kv_layout.dequantize_kv(values, fmt, dtype)[:, :512].double().sum(dim=1)  # [n] scores
    rope = torch.full((n, 64), -float(nope.mean()) / 64, device=kv8.device).to(torch.bfloat16)
    values[:, kv_layout.ROPE_OFFSET:] = rope.view(torch.uint8)
    kv8[read] = values
    return torch.ones_like(q), kv8, idx, 100 / float(nope.mean())


def worst_ratio(got, want, tol):
    """Largest error of ``(out, lse)`` against ``want`` relative to the tolerance (1 = at it)."""
    ratio = 0.0
    for g, w, atol, rtol in ((got[0], want[0], tol.atol, tol.rtol), (got[1], want[1], tol.lse_atol, tol.lse_rtol)):
        finite = w.isfinite()
        err = (g.double() - w).abs()[finite] / (atol + rtol * w.abs()[finite])
        ratio = max(ratio, float(err.max()))
    return ratio


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_is_attention_over_the_cache_dequantised_into_q_dtype(path, dtype):
    """The semantics, pinned: a path matches the reference of ``dequantize_kv(kv, q's dtype)``
    at the plain tolerance, and misses the reference of the exactly dequantised cache (the
    scales applied to the float32 products, the numerics before) by several tolerances, so a
    path that kept those numerics fails here."""
    fmt = current_platform().fp8_dtype
    q, kv8, idx, sm_scale = rounding_tokens(2, 16, 40, 64, dtype, fmt)
    out, lse, counter = run_path(path, q, kv8, idx, sm_scale)
    check_fp8(path, q, kv8, idx, sm_scale, out, lse, counter, fmt)
    tol = tolerance(dtype, "fp8")
    exact = sparse_mla_reference(q, kv_layout.dequantize_kv(kv8, fmt, torch.float64), idx, sm_scale)
    crafted = worst_ratio(sparse_mla_reference(q, kv8, idx, sm_scale, fp8_dtype=fmt), exact, tol)
    assert crafted > 8, f"the two references differ by only {crafted:.2f} tolerances"
    missed = worst_ratio((out, lse), exact, tol)
    assert missed > 3, f"[{path} fp8 {dtype}] within {missed:.2f} tolerances of the exactly dequantised cache"
