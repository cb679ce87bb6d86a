"""The 656-byte FP8 KV token: its bytes, the quantiser's round trip, the cache dequantised into
q's dtype, the capturable pool write, and which FP8 format each platform reads
(graphattn.common.kv_layout)."""

from __future__ import annotations

import pytest
import torch

from graphattn.common import kv_layout as kvl
from graphattn.common.platform import CpuPlatform
from graphattn.graphs import BreakableGraph

FORMATS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
ids = lambda d: str(d).replace("torch.float8_", "")  # noqa: E731


def test_layout_constants():
    assert (kvl.SCALE_OFFSET, kvl.ROPE_OFFSET, kvl.TOKEN_BYTES) == (512, 528, 656)
    assert kvl.TOKEN_BYTES % 16 == 0, "rows of 656 bytes keep 16-byte alignment"


@pytest.mark.parametrize("fp8", FORMATS, ids=ids)
def test_bytes_of_one_token(fp8):
    kv = torch.randn(2, 576, dtype=torch.bfloat16)
    kv[1, 128:256] = 0  # a zero tile
    tok = kvl.quantize_kv(kv, fp8)
    assert tok.shape == (2, 656) and tok.dtype == torch.uint8
    fmax = torch.finfo(fp8).max  # 448 for e4m3fn, 240 for e4m3fnuz
    amax = kv[:, :512].float().reshape(2, 4, 128).abs().amax(-1)
    scale = tok[:, 512:528].contiguous().view(torch.float32)
    expected = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))  # normal amaxes
    assert torch.equal(scale, expected), f"[{fp8}] scales {scale} != amax / {fmax}"
    assert scale[1, 1] == 1.0, "a zero tile gets scale 1"
    values = tok[:, :512].contiguous().view(fp8).float()
    assert values.abs().max() == fmax, f"[{fp8}] the tile maximum must map to {fmax}"
    assert torch.all(values[1, 128:256] == 0)
    assert torch.equal(tok[:, 528:].contiguous().view(torch.bfloat16), kv[:, 512:]), "rope is stored as bf16"


@pytest.mark.parametrize("fp8", FORMATS, ids=ids)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_round_trip_error_is_within_half_an_fp8_ulp(fp8, dtype):
    kv = (torch.randn(64, 576) * torch.logspace(-3, 2, 64)[:, None]).to(dtype)  # many magnitudes
    back = kvl.dequantize_kv(kvl.quantize_kv(kv, fp8), fp8, torch.float64)
    x = kv.double()
    scale = kvl.quantize_kv(kv, fp8)[:, 512:528].contiguous().view(torch.float32).double()
    scale_col = scale.repeat_interleave(128, dim=1)  # [64, 512]
    # e4m3: 3 mantissa bits, so rounding is within 2^-4 of the value; below the smallest normal
    # (2^-6 fn, 2^-7 fnuz) within half a subnormal step (2^-10 / 2^-11) of the scale.
    bound = x[:, :512].abs() * 2**-4 + scale_col * 2**-10
    err = (back[:, :512] - x[:, :512]).abs()
    assert torch.all(err <= bound), f"[{fp8} {dtype}] worst excess {(err - bound).max().item()}"
    rope_ref = kv[:, 512:].to(torch.bfloat16).double()
    assert torch.equal(back[:, 512:], rope_ref), "rope round-trips through bf16 exactly"
    # The relative error over a tile, measured as docs/backends.md states it.
    rel = (err.norm(dim=1) / x[:, :512].norm(dim=1)).max().item()
    assert rel < 0.04, f"[{fp8} {dtype}] relative rms error {rel:.4f}"


@pytest.mark.parametrize("fp8", FORMATS, ids=ids)
def test_tiny_and_non_finite_tiles(fp8):
    """fp32 tiles too small for a normal scale stay finite (amax / fmax used to underflow to a
    0 scale, and 0 / 0 made their zeros NaN); a NaN or inf makes its whole tile NaN, and only
    its tile."""
    kv = torch.randn(3, 576)
    kv[0, :128] = 0
    kv[0, 0] = 1e-44  # a subnormal fp32 amax: amax / 448 underflows
    kv[1, 130] = float("nan")
    kv[2, 300] = float("inf")
    tok = kvl.quantize_kv(kv, fp8)
    back = kvl.dequantize_kv(tok, fp8, torch.float64)
    scale = tok[:, 512:528].contiguous().view(torch.float32)
    assert scale[0, 0] == torch.finfo(torch.float32).tiny, f"[{fp8}] {scale[0, 0]}"
    assert torch.isfinite(back[0]).all() and back[0, :128].abs().max() <= 1e-44, f"[{fp8}] tiny tile"
    assert back[1, 128:256].isnan().all() and back[2, 256:384].isnan().all(), f"[{fp8}] non-finite tiles"
    for row, tile in ((1, 1), (2, 2)):  # the other tiles of those tokens are untouched
        others = torch.ones(576, dtype=torch.bool)
        others[tile * 128:(tile + 1) * 128] = False
        assert torch.isfinite(back[row, others]).all(), f"[{fp8}] token {row}"


def test_dequantize_keeps_leading_dims_and_exactness():
    tok = kvl.quantize_kv(torch.randn(10, 576))
    gathered = tok[torch.tensor([[3, 3, 7], [0, 9, 1]])]  # [2, 3, 656], what a backend gathers
    out = kvl.dequantize_kv(gathered, dtype=torch.float64)
    assert out.shape == (2, 3, 576) and out.dtype == torch.float64
    assert torch.equal(out[0, 1], kvl.dequantize_kv(tok, dtype=torch.float64)[3])
    f32 = kvl.dequantize_kv(tok)  # float32: each product rounded once
    torch.testing.assert_close(f32.double(), kvl.dequantize_kv(tok, dtype=torch.float64), rtol=2**-23, atol=0)


@pytest.mark.parametrize("fp8", FORMATS, ids=ids)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequantize_into_q_dtype_rounds_each_product_once(fp8, dtype):
    """The cache attention reads: ``dtype(float32(fp8) * scale)``, rope in ``dtype``."""
    kv = torch.randn(32, 576) * torch.logspace(-2, 2, 32)[:, None]
    tok = kvl.quantize_kv(kv, fp8)
    got = kvl.dequantize_kv(tok, fp8, dtype)
    assert got.shape == (32, 576) and got.dtype == dtype
    values = tok[:, :512].contiguous().view(fp8).float().view(32, 4, 128)
    scale = tok[:, 512:528].contiguous().view(torch.float32)
    product = (values * scale[..., None]).view(32, 512)  # float32, each product rounded once
    assert torch.equal(got[:, :512], product.to(dtype)), f"[{fp8} {dtype}] nope"
    assert torch.equal(got[:, 512:], kv[:, 512:].to(torch.bfloat16).to(dtype)), f"[{fp8} {dtype}] rope"
    exact = kvl.dequantize_kv(tok, fp8, torch.float64)
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), exact, rtol=2**-24, atol=0)
    else:  # one rounding of the float32 product to q's dtype: within half an ulp, and visible
        info = torch.finfo(dtype)
        half_ulp = torch.maximum(exact[:, :512].abs(), torch.tensor(info.smallest_normal)) * info.eps / 2
        err = (got.double() - exact)[:, :512].abs()
        assert torch.all(err <= half_ulp * (1 + 2**-20)), f"[{fp8} {dtype}]"
        assert (err > 0).float().mean() > 0.5, f"[{fp8} {dtype}] the scales should make most values round"


def test_fp16_dequantisation_overflows_to_inf():
    """Beyond fp16's range a dequantised value is inf in fp16 (an fp16 model's cache holds none)."""
    kv = torch.zeros(2, 576)
    kv[0, :128] = 1e5
    kv[1, :128] = 1e3
    got = kvl.dequantize_kv(kvl.quantize_kv(kv), dtype=torch.float16)
    assert torch.isinf(got[0, :128]).all() and torch.isfinite(got[1]).all()
    assert torch.isfinite(kvl.dequantize_kv(kvl.quantize_kv(kv), dtype=torch.bfloat16)).all()


def test_write_into_pool_rows_skips_invalid_slots():
    pool = kvl.quantize_kv(torch.randn(8, 576))
    before = pool.clone()
    new = torch.randn(5, 576)
    slots = torch.tensor([6, -1, 2, 99, 0], dtype=torch.int32)  # -1 and 99 are skipped
    kvl.write_kv_fp8_(pool, slots, new)
    tok = kvl.quantize_kv(new)
    for i, s in enumerate(slots.tolist()):
        if 0 <= s < 8:
            assert torch.equal(pool[s], tok[i]), f"slot {s} not written"
    untouched = [r for r in range(8) if r not in (6, 2, 0)]
    assert torch.equal(pool[untouched], before[untouched]), "rows of skipped slots changed"


def test_write_with_no_valid_slot_changes_nothing():
    pool = kvl.quantize_kv(torch.randn(4, 576))
    before = pool.clone()
    kvl.write_kv_fp8_(pool, torch.full((3,), -1), torch.randn(3, 576))
    assert torch.equal(pool, before)


@pytest.mark.usefixtures("cpu_platform")
def test_quantise_and_write_capture_and_replay():
    """An engine writes KV inside its decode graph: capture, then replay with new inputs."""
    pool = torch.zeros(16, 656, dtype=torch.uint8)
    kv = torch.randn(4, 576, dtype=torch.bfloat16)
    slots = torch.tensor([1, 5, -1, 9])

    def write(kv, slots):
        kvl.write_kv_fp8_(pool, slots, kv)
        return kvl.dequantize_kv(pool)

    graph = BreakableGraph()
    graph.capture(write, kv, slots)
    kv.copy_(torch.randn(4, 576))
    slots.copy_(torch.tensor([3, -1, 12, 0]))
    out = graph.replay()
    expected = kvl.dequantize_kv(kvl.quantize_kv(kv))
    for i, s in enumerate([3, 12, 0]):
        torch.testing.assert_close(out[s], expected[[0, 2, 3][i]], rtol=0, atol=0)


def test_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match=r"\[pool_tokens, 656\] uint8"):
        kvl.dequantize_kv(torch.zeros(3, 576, dtype=torch.uint8))
    with pytest.raises(ValueError, match="4-byte aligned"):
        kvl.dequantize_kv(torch.zeros(3 * 656 + 2, dtype=torch.uint8)[2:].view(3, 656))
    with pytest.raises(ValueError, match=r"expected kv \[tokens, 576\]"):
        kvl.quantize_kv(torch.randn(3, 512))
    with pytest.raises(TypeError, match="FP8 KV format"):
        kvl.quantize_kv(torch.randn(3, 576), torch.float8_e5m2)
    with pytest.raises(ValueError, match="Unknown kv_dtype: 'int4'. Valid options are: auto, fp8"):
        kvl.kv_dtype_name("int4")
    assert kvl.kv_dtype_name("fp8_ds_mla") == "fp8"
    assert kvl.resolve_kv_dtype("bf16", torch.bfloat16) == "auto"
    with pytest.raises(ValueError, match="must be q's dtype"):
        kvl.resolve_kv_dtype("bf16", torch.float16)


def test_platform_decides_the_fp8_format():
    from graphattn.common.interpreter_configs import InterpreterLaunchTable
    from graphattn.cuda.launch import NvidiaLaunchTable
    from graphattn.hip.launch import AmdLaunchTable

    assert CpuPlatform().fp8_dtype == torch.float8_e4m3fn
    assert NvidiaLaunchTable((9, 0)).fp8_dtype == torch.float8_e4m3fn
    assert AmdLaunchTable("gfx942").fp8_dtype == torch.float8_e4m3fnuz
    assert AmdLaunchTable("gfx950").fp8_dtype == torch.float8_e4m3fn
    amd = CpuPlatform(launch_table=AmdLaunchTable("gfx942"))
    assert amd.fp8_dtype == torch.float8_e4m3fnuz and amd.describe()["fp8_dtype"] == "float8_e4m3fnuz"
    assert InterpreterLaunchTable().fp8_dtype == torch.float8_e4m3fn
