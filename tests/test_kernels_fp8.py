"""Every kernel path reading 656-byte FP8 KV tokens, against the float64 reference of the
dequantised cache (CPU: the Triton interpreter; GPU: compiled).

The kernels load each token's bytes, bitcast the nope part to the platform's FP8 format and
convert it exactly to q's dtype; the per-128-value scales multiply the float32 score products
and the softmax weights (rounded to q's dtype), never the tile. The reference dequantises
exactly (float64). Both FP8 formats run under the interpreter; a GPU runs only its own.
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
    # The weights p * scale are rounded to q's dtype for the PV product: FP8's own tolerance.
    tol = tolerance(q.dtype, "fp8")
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


def test_fp8_tokens_need_the_656_byte_layout():
    from graphattn.kernels import sparse_mla_mega

    q, kv8, idx = fp8_inputs(2, 16, 8, 32, torch.float16, current_platform().fp8_dtype)
    with pytest.raises(ValueError, match=r"\[pool_tokens, 656\] uint8"):
        sparse_mla_mega(q, kv8[:, :576].contiguous(), idx, 0.1)
    with pytest.raises(ValueError, match="4-byte aligned"):
        unaligned = torch.zeros(32 * 656 + 2, dtype=torch.uint8, device=DEVICE)[2:].view(32, 656)
        sparse_mla_mega(q, unaligned, idx, 0.1)


def test_sm90_flashmla_reads_fp8_with_the_gluon_kernel(monkeypatch):
    """On sm_90 FP8 kv runs the Gluon kernel's FP8 variant at every row count (never the
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
    assert flashmla.kernel_name(q, kv8, 2048) == "wgmma_fp8"
    assert flashmla.kernel_name(q[:1], kv8, 2048) == "wgmma_fp8"
    assert flashmla.kernel_name(q[:1], q.new_empty(100, 576), 2048) == "triton_kv_major"  # plain kv
    cfg = cuda_configs.kernel_config("trtllm", 1, 16, 2048, kv_fp8=True)
    assert cfg["num_warps"] == cuda_configs.FP8_NUM_WARPS[cfg["BLOCK_H"]] == 8 and not cfg["KV_MAJOR"], cfg
