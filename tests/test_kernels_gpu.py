"""GPU checks of the compiled kernels: bf16 at real sizes, and CUDA-graph capture/replay.

Marked ``gpu``: tests/conftest.py skips them when no CUDA/HIP GPU is present.
"""

from __future__ import annotations

import math

import pytest
import torch

from graphattn.common.reference import sparse_mla_reference

# tests/ is on sys.path under pytest (rootdir conftest); share the CPU suite's harness.
from test_kernels import (  # noqa: F401
    DEVICE, LSE_ATOL, TOLERANCES, _nan_poison, check_against_reference, check_unpadded_flashmla, make_inputs,
    run_path,
)

pytestmark = pytest.mark.gpu
PATHS = ("flashmla", "trtllm", "mega")
SCALE = 1 / math.sqrt(576)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads,rows", [(16, 1), (32, 8), (64, 2), (64, 64), (128, 1), (128, 3), (128, 257), (16, 1024)])
def test_bf16_real_sizes(path, heads, rows):
    q, kv, idx = make_inputs(rows, heads, 2048, pool=rows * 2048 + 4096, dtype=torch.bfloat16, invalid_frac=0.1)
    out, lse, counter = run_path(path, q, kv, idx, SCALE)
    torch.cuda.synchronize()
    check_against_reference(path, q, kv, idx, SCALE, out, lse, counter)


# wgmma_rr; wgmma_ws, the last with PDL; then partly-masked head blocks (compact): wgmma_rr, wgmma_ws
@pytest.mark.parametrize("heads,rows", [(128, 8), (64, 2), (128, 1), (32, 8), (96, 1)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flashmla_split_partials_in_q_dtype(heads, rows, dtype):
    """Where flashmla's splits of 32 heads or more (a multiple of 16) go through the combine,
    sm_90's Gluon kernels store each partial in q's dtype in the accumulator's order (``PARTIAL_NATIVE=2``) and
    the combine reads it so: fp16 and bf16 q against the float64 reference."""
    from graphattn.common.metadata import GraphMetadata
    from graphattn.cuda.configs import gluon_available
    from graphattn.kernels import split_plan
    from graphattn.kernels.flashmla import plan_flashmla

    q, kv, idx = make_inputs(rows, heads, 2077, pool=rows * 2048 + 4096, dtype=dtype, invalid_frac=0.1)
    md = GraphMetadata(rows, heads, 2077, dtype, q.device, **split_plan("flashmla", heads, 2077).metadata_kwargs())
    plan = plan_flashmla(rows, heads, 2077, md.workspace_for(rows)[0].shape[1])  # what run_path's call plans
    if torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0) and gluon_available():
        assert plan.main.kwargs.get("PARTIAL_NATIVE") == 2, f"[flashmla {heads}x{rows} {dtype}] {plan.main!r}"
    out, lse, _ = run_path("flashmla", q, kv, idx, SCALE)
    check_against_reference(f"flashmla ({plan.kernel}, {plan.splits} splits) {dtype}", q, kv, idx, SCALE, out, lse)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [2, 5])  # flashmla on sm_90: 2 x 20 heads run the tokens-major tile, 5 the Gluon one
def test_fp16_long_topk_and_odd_heads(path, rows):
    heads = 20
    q, kv, idx = make_inputs(rows, heads, 8192 + 37, pool=50_000, dtype=torch.float16)
    idx[rows - 1] = -1  # an all-invalid row
    out, lse, counter = run_path(path, q, kv, idx, SCALE)
    check_against_reference(path, q, kv, idx, SCALE, out, lse, counter)
    assert torch.all(lse[rows - 1] == float("-inf")) and torch.all(out[rows - 1] == 0), f"[{path}] empty row"


def _capture(step, static):
    """``(graph, out, lse)``: ``step(*static)`` warmed up on a side stream (compiles and plans
    outside the capture), then captured once; replays write the same ``out``/``lse``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step(*static)
    return graph, out, lse


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 4])
def test_cuda_graph_replay_matches_eager(path, rows):
    """Capture once, then replay with new inputs copied into the static tensors."""
    from graphattn.common.metadata import GraphMetadata
    from graphattn.kernels import split_plan, sparse_mla_flashmla, sparse_mla_mega, sparse_mla_trtllm

    heads, topk = 48, 2048
    plan = split_plan(path, heads, topk)
    md = GraphMetadata(rows, heads, topk, torch.bfloat16, "cuda", **plan.metadata_kwargs())

    def step(q, kv, idx):
        if path == "mega":
            return sparse_mla_mega(q, kv, idx, SCALE)
        if path == "flashmla":
            return sparse_mla_flashmla(q, kv, idx, SCALE, *md.workspace_for(rows))
        return sparse_mla_trtllm(q, kv, idx, SCALE, md.counter_for(rows), *md.workspace_for(rows))

    static = make_inputs(rows, heads, topk, pool=20_000, dtype=torch.bfloat16)
    graph, g_out, g_lse = _capture(step, static)
    for trial in range(3):
        fresh = make_inputs(rows, heads, topk, pool=20_000, dtype=torch.bfloat16)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        e_out, e_lse = step(*fresh)
        torch.cuda.synchronize()
        where = f"[{path} replay {trial}]"
        torch.testing.assert_close(g_out, e_out, atol=0, rtol=0, msg=lambda m: f"{where} out: {m}")
        torch.testing.assert_close(g_lse, e_lse, atol=0, rtol=0, msg=lambda m: f"{where} lse: {m}")
        if md.counter is not None:
            assert int(md.counter_for(rows).abs().sum()) == 0, f"{where} counter not reset"
    ref_out, _ = sparse_mla_reference(*fresh, SCALE)
    torch.testing.assert_close(g_out.double(), ref_out, atol=1.6e-2, rtol=5e-2, msg=lambda m: f"[{path}] {m}")


@pytest.mark.parametrize("layout", ["contiguous", "kv row stride 584", "q head stride 584"])
def test_flashmla_wgmma_and_its_unaligned_fallback(layout):
    """flashmla's Gluon kernel (64 heads x 8 rows, 128 heads with one split) and the Triton tiles
    it falls back to when a stride rules out 16-byte cp.async copies give the reference."""
    for rows, heads in ((8, 64), (200, 128)):
        q, kv, idx = make_inputs(rows, heads, 2048 + 29, pool=30_000, dtype=torch.bfloat16)
        if layout == "kv row stride 584":
            kv = torch.nn.functional.pad(kv, (0, 8))[:, :576]
        elif layout == "q head stride 584":
            q = torch.nn.functional.pad(q, (0, 8))[..., :576]
        out, lse, _ = run_path("flashmla", q, kv, idx, SCALE)
        check_against_reference(f"flashmla {layout}", q, kv, idx, SCALE, out, lse)


@pytest.mark.parametrize("heads,rows,topk", [(16, 4, 2077), (7, 33, 2077), (20, 64, 2077), (32, 100, 2077),
                                             (13, 150, 250)])
@pytest.mark.parametrize("kind", ["bf16", "fp16", "fp8", "fp8-fp16"])
def test_flashmla_heads_on_n_kernel(heads, rows, topk, kind):
    """At <= 32 heads (from 4 rows at <= 16 heads, 64 at 17-32) sm_90 flashmla runs the Gluon
    kernel with the heads on the wgmma's N side (``wgmma_tn``; with FP8 tokens at 16 heads x 4
    rows and 13 x 150 x topk 250 its ring of raw slots, in splits and direct); with -1,
    out-of-range and duplicate indices, an all-invalid row, a topk that is not a multiple of
    the tile, and FP8 tokens (unselected ones poisoned with NaN; bf16 and fp16 q) it gives the
    float64 reference."""
    from graphattn.common.platform import current_platform
    from graphattn.cuda.configs import gluon_available
    from graphattn.kernels.flashmla import kernel_name
    from test_kernels_fp8 import check_fp8, fp8_inputs

    dtype = torch.float16 if kind.endswith("fp16") else torch.bfloat16
    pool = rows * 2048 + 4096
    if kind.startswith("fp8"):
        fmt = current_platform().fp8_dtype
        q, kv, idx = fp8_inputs(rows, heads, topk, pool, dtype, fmt)
    else:
        q, kv, idx = make_inputs(rows, heads, topk, pool=pool, dtype=dtype)
    idx[rows - 1] = -1
    name = kernel_name(q, kv, topk)
    if torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0) and gluon_available():
        assert name == "wgmma_tn", f"[flashmla {heads} heads x {rows} rows {kind}] ran {name}"
    out, lse, _ = run_path("flashmla", q, kv, idx, SCALE)
    if kind.startswith("fp8"):
        check_fp8(f"flashmla ({name}) {kind}", q, kv, idx, SCALE, out, lse, None, fmt)
    else:
        check_against_reference(f"flashmla ({name}) {kind}", q, kv, idx, SCALE, out, lse)
    assert torch.all(lse[rows - 1] == float("-inf")) and torch.all(out[rows - 1] == 0), f"[flashmla ({name})] empty row"


@pytest.mark.parametrize("heads,rows,topk,kind,group", [
    (16, 16, 2048, "bf16", 2), (16, 24, 2077, "fp16", 4), (13, 20, 2077, "bf16", 4), (32, 5, 2048, "fp8", 2),
    (7, 33, 2077, "fp8", 2), (16, 64, 2048, "fp8", 8), (20, 64, 2077, "bf16", 16),
])
def test_flashmla_head_major_combine_of_several_heads_a_program(heads, rows, topk, kind, group):
    """Where wgmma_tn's head-major combine would have more programs than SMs (an H200's 132),
    sm_90's plan gives each ``group`` heads (``HEADS``; 13, 7 and 20 heads: the last group
    partly masked) and launches it as a programmatic dependent launch of one program per SM; eager and
    replayed from a CUDA graph, with -1 and out-of-range indices and an all-invalid row, it
    gives the float64 reference of the (dequantised) cache."""
    from graphattn.common.metadata import GraphMetadata
    from graphattn.common.platform import current_platform
    from graphattn.cuda.configs import gluon_available
    from graphattn.kernels import sparse_mla_flashmla, split_plan
    from graphattn.kernels.flashmla import plan_flashmla
    from test_kernels_fp8 import check_fp8, fp8_inputs

    if torch.version.hip is not None or torch.cuda.get_device_capability() != (9, 0) or not gluon_available():
        pytest.skip("several heads a combine program is sm_90's plan (Gluon kernels)")
    if current_platform().num_compute_units() != 132:
        pytest.skip("the expected plans are an H200's (132 SMs)")
    dtype = torch.float16 if kind == "fp16" else torch.bfloat16
    pool = rows * 2048 + 4096
    fmt = current_platform().fp8_dtype
    if kind == "fp8":
        q, kv, idx = fp8_inputs(rows, heads, topk, pool, dtype, fmt)
    else:
        q, kv, idx = make_inputs(rows, heads, topk, pool=pool, dtype=dtype)
    idx[rows - 1] = -1
    where = f"[flashmla {heads} heads x {rows} rows x topk {topk} {kind}]"
    md = GraphMetadata(rows, heads, topk, dtype, "cuda", **split_plan("flashmla", heads, topk).metadata_kwargs())
    ws_splits = md.workspace_splits(rows)
    plan = plan_flashmla(rows, heads, topk, ws_splits, kv_fp8=kind == "fp8")
    combine = plan.combine
    assert plan.kernel == "wgmma_tn" and combine is not None, f"{where} {plan.kernel} {combine!r}"
    assert combine.kwargs.get("HEADS") == group and combine.kwargs.get("PDL") == 1, f"{where} {combine!r}"
    assert combine.grid == (rows * -(-heads // group),), f"{where} {combine!r}"

    def check(out, lse, how):
        if kind == "fp8":
            check_fp8(f"flashmla (wgmma_tn) {kind} {how}", q, kv, idx, SCALE, out, lse, None, fmt)
        else:
            check_against_reference(f"flashmla (wgmma_tn) {kind} {how}", q, kv, idx, SCALE, out, lse)
        assert torch.all(lse[rows - 1] == float("-inf")) and torch.all(out[rows - 1] == 0), f"{where} {how}: empty row"

    out, lse, _ = run_path("flashmla", q, kv, idx, SCALE)
    check(out, lse, "eager")
    graph, g_out, g_lse = _capture(lambda *t: sparse_mla_flashmla(*t, SCALE, *md.workspace_for(rows)), (q, kv, idx))
    for _ in range(2):
        g_out.fill_(float("nan"))
        g_lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(g_out, g_lse, "graph replay")


@pytest.mark.parametrize("heads,rows,topk", [(16, 1, 2000), (13, 3, 2048), (32, 1, 2048), (20, 8, 1999)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_flashmla_fp8_few_rows_run_the_ring(heads, rows, topk, dtype):
    """FP8 tokens at <= 32 heads, few rows and a top-k of at most 2048 run ``wgmma_tn`` with its
    ring of raw slots on sm_90 (below ``TN_MIN_ROWS``, one or two tiles a split; at 1-2 rows its
    combine is a programmatic dependent launch) and give the float64 reference of the
    dequantised cache, an all-invalid row included."""
    from graphattn.common.platform import current_platform
    from graphattn.cuda.configs import gluon_available
    from graphattn.kernels.flashmla import kernel_name
    from test_kernels_fp8 import check_fp8, fp8_inputs

    fmt = current_platform().fp8_dtype
    q, kv, idx = fp8_inputs(rows, heads, topk, rows * 2048 + 4096, dtype, fmt)
    idx[rows - 1] = -1
    name = kernel_name(q, kv, topk)
    if torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0) and gluon_available():
        assert name == "wgmma_tn", f"[flashmla FP8 {heads} heads x {rows} rows] ran {name}"
    out, lse, _ = run_path("flashmla", q, kv, idx, SCALE)
    check_fp8(f"flashmla ({name}) few rows", q, kv, idx, SCALE, out, lse, None, fmt)
    assert torch.all(lse[rows - 1] == float("-inf")) and torch.all(out[rows - 1] == 0), f"[flashmla ({name})] empty row"


@pytest.mark.parametrize("heads", [1, 16, 48, 64, 80])
@pytest.mark.parametrize("rows", [1, 3, 72])
def test_flashmla_reads_unpadded_q(heads, rows):
    """flashmla's kernels (on sm_90 the Gluon kernel where rows x heads > 64, else the
    tokens-major tile; the failure message names the kernel that ran) read
    q ``[rows, H, 576]`` unpadded, a view whose neighbouring heads are NaN, and write exact-size
    NaN-poisoned outputs: heads >= H are neither read nor stored."""
    check_unpadded_flashmla(rows, heads, 2048 + 29, pool=rows * 2048 + 4096, dtype=torch.bfloat16)


@pytest.mark.parametrize("heads,rows,topk,dtype,kv_fp8", [
    (64, 64, 2048, torch.bfloat16, False), (100, 24, 2077, torch.float16, False),
    (64, 64, 2048, torch.bfloat16, True), (100, 28, 2077, torch.float16, True),  # wgmma_ws's producer merges
])
def test_flashmla_cluster_merge_replays_in_a_graph(heads, rows, topk, dtype, kv_fp8):
    """Where flashmla's launch takes two splits (sm_90: they merge in a thread-block cluster, no
    combine launch; FP8 tokens too) a captured call replays with fresh inputs exactly as an
    eager call runs, from a NaN-poisoned workspace each time, and matches the float64
    reference (of the dequantised cache with FP8 tokens)."""
    def expect(plan):
        if plan.kernel in ("wgmma_rr", "wgmma_ws"):
            assert plan.main.cluster == 2 and plan.combine is None, f"[flashmla {heads}x{rows} fp8={kv_fp8}] {plan.main!r}"

    _check_graph_replays(heads, rows, topk, dtype, kv_fp8, expect)


@pytest.mark.parametrize("heads,rows,topk,dtype", [
    (128, 70, 1000, torch.bfloat16), (100, 70, 1000, torch.float16), (128, 140, 2077, torch.bfloat16),
    (128, 6, 400, torch.bfloat16), (100, 5, 700, torch.float16),  # in splits
])
def test_flashmla_rr_early_indices_replay_in_a_graph(heads, rows, topk, dtype):
    """wgmma_rr with its producer loading the indices early (``IDX_EARLY``: more than 64 heads,
    one split or several through the combine): the last round part-filled, 10% of the indices
    -1, a captured call replays with fresh inputs exactly as an eager call runs and matches the
    float64 reference."""
    def expect(plan):
        if plan.kernel == "wgmma_rr":
            assert plan.main.kwargs.get("IDX_EARLY") == 1 and plan.main.cluster == 1, \
                f"[flashmla {heads}x{rows}] {plan.main!r}"
            assert (plan.splits > 1) == (rows < 64), f"[flashmla {heads}x{rows}] {plan.main!r}"

    _check_graph_replays(heads, rows, topk, dtype, False, expect)


def _check_graph_replays(heads, rows, topk, dtype, kv_fp8, expect):
    """flashmla at one shape: ``expect(plan)`` on sm_90, then a captured call replayed three
    times with fresh inputs, each from a NaN-poisoned workspace, bit-identical to an eager call
    and within the float64 reference's tolerance (of the dequantised cache with FP8 tokens)."""
    from graphattn.common.kv_layout import quantize_kv
    from graphattn.common.metadata import GraphMetadata
    from graphattn.common.platform import current_platform
    from graphattn.kernels import sparse_mla_flashmla, split_plan
    from graphattn.kernels.flashmla import plan_flashmla
    from test_kernels_fp8 import check_fp8

    md = GraphMetadata(rows, heads, topk, dtype, "cuda",
                       **split_plan("flashmla", heads, topk, kv_fp8=kv_fp8).metadata_kwargs())
    ws_out, ws_lse = md.workspace_for(rows)
    if torch.cuda.get_device_capability() == (9, 0):
        expect(plan_flashmla(rows, heads, topk, ws_out.shape[1], kv_fp8=kv_fp8))

    fmt = current_platform().fp8_dtype

    def inputs():
        q, kv, idx = make_inputs(rows, heads, topk, pool=40_000, dtype=dtype, invalid_frac=0.1)
        return q, quantize_kv(kv, fmt) if kv_fp8 else kv, idx

    def step(q, kv, idx):
        return sparse_mla_flashmla(q, kv, idx, SCALE, ws_out, ws_lse)

    static = inputs()
    graph, g_out, g_lse = _capture(step, static)
    for trial in range(3):
        fresh = inputs()
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        ws_out.fill_(float("nan"))
        ws_lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        r_out, r_lse = g_out.clone(), g_lse.clone()
        ws_out.fill_(float("nan"))
        ws_lse.fill_(float("nan"))
        e_out, e_lse = step(*fresh)
        torch.cuda.synchronize()
        where = f"[flashmla {heads}x{rows}x{topk} {dtype} fp8={kv_fp8} replay {trial}]"
        torch.testing.assert_close(r_out, e_out, atol=0, rtol=0, msg=lambda m: f"{where} out: {m}")
        torch.testing.assert_close(r_lse, e_lse, atol=0, rtol=0, msg=lambda m: f"{where} lse: {m}")
    if kv_fp8:
        check_fp8(f"flashmla {heads}x{rows} graph", *fresh, SCALE, r_out, r_lse, None, fmt)
    else:
        check_against_reference(f"flashmla {heads}x{rows} graph", *fresh, SCALE, r_out, r_lse)


def _native_offsets(heads: int = 64) -> torch.Tensor:
    """``[heads, 512]``: where a Gluon kernel's accumulator-order store (``PARTIAL_NATIVE``) puts
    head ``m``, column ``n`` of a head block of ``heads`` (16-64, whole warps) heads: consumer
    ``n // 256``'s half, at (register pair, thread) of the wgmma accumulator layout (warp
    ``m // 16``, rows ``m % 8`` and ``m % 8 + 8`` of its 16, columns ``2 (lane % 4)`` and ``+ 1``
    of each 8), the threads of warps past the block's heads left out."""
    m = torch.arange(heads)[:, None]
    n = torch.arange(512)[None, :]
    half, nn = n // 256, n % 256
    thread = (m // 16) * 32 + (m % 8) * 4 + (nn % 8) // 2
    pair = (nn // 8) * 2 + (m % 16) // 8  # register pair: 4 registers per 8 columns, 2 per row half
    threads = heads // 16 * 32  # the threads that hold the block's heads
    return half * heads * 256 + pair * threads * 2 + thread * 2 + nn % 2


@pytest.mark.parametrize("heads,splits,dtype,pdl", [(64, 3, torch.bfloat16, 0), (128, 8, torch.float16, 0),
                                                    (128, 32, torch.bfloat16, 1), (64, 1, torch.bfloat16, 1),
                                                    (32, 16, torch.bfloat16, 0), (96, 5, torch.float16, 1),
                                                    (48, 4, torch.bfloat16, 0), (16, 16, torch.float16, 0)])
@pytest.mark.parametrize("partial_16", [0, 1])
@pytest.mark.parametrize("runs", [1, 4])
def test_flashmla_combine_reads_partials_in_the_accumulator_order(heads, splits, dtype, pdl, partial_16, runs):
    """``_flashmla_combine_native_kernel`` (flashmla's combine where a Gluon kernel stored its
    partials with ``PARTIAL_NATIVE``: f32, or with ``PARTIAL_16`` in the output's dtype in the
    first half of each head block's f32 slab) merges a workspace in that order into what the
    float64 merge of the same partials gives: the order is the wgmma accumulator's (a
    permutation of each 64-head block), splits with no valid token (lse -inf) weigh nothing, a
    head with none anywhere gets 0 and -inf, and a split slot past ``num_splits`` (NaN) is never
    read. A partly-masked last head block (16, 32, 48 heads; 96 = 64 + 32) holds its own heads only.
    ``runs``: runs of 8 columns a program (``RUNS``, four warps each; as a PDL the programs reserve
    the plan's shared memory, one per SM)."""
    from graphattn.cuda.configs import gluon_available
    from graphattn.kernels.launch import make_launch

    if torch.version.hip is not None or torch.cuda.get_device_capability() != (9, 0) or not gluon_available():
        pytest.skip("the native combine is a Gluon kernel for sm_90 (where the partials it reads are stored)")
    from graphattn.kernels.wgmma_combine import _flashmla_combine_native_kernel

    blocks = [min(64, heads - b) for b in range(0, heads, 64)]  # each block's heads
    rows, slots = 3, splits + 1
    part = torch.randn(rows, splits, heads, 512, dtype=torch.float64)
    lse = torch.randn(rows, splits, heads, dtype=torch.float64) * 3
    lse[0, 0] = float("-inf")  # an empty split of row 0
    lse[1, :, 5] = float("-inf")  # head 5 of row 1 saw nothing valid
    part[1, :, 5] = 0.0  # as a split kernel stores an empty head
    ws_out = torch.full((rows, slots, heads, 512), float("nan"), device=DEVICE)
    ws_lse = torch.full((rows, slots, heads), float("nan"), device=DEVICE)
    if partial_16:  # as the split kernels store them: rounded to the output's dtype
        part = part.to(dtype).double()
    for b, r in enumerate(blocks):  # each block's partial, in its own f32 region (heads 64 b ...)
        offsets = _native_offsets(r).flatten()
        assert torch.equal(offsets.sort().values, torch.arange(r * 512)), f"not a permutation at {r} heads"
        native = torch.empty(rows, splits, r * 512, dtype=torch.float64)
        native[..., offsets] = part[:, :, 64 * b:64 * b + r].reshape(rows, splits, r * 512)
        if partial_16:  # in the first half of the block's f32 region, offsets doubled in the 16-bit view
            ws16 = ws_out.view(dtype).view(rows, slots, heads * 1024)
            ws16[:, :splits, b * 64 * 1024:b * 64 * 1024 + r * 512] = native.to(dtype).to(DEVICE)
        else:
            ws32 = ws_out.view(rows, slots, heads * 512)
            ws32[:, :splits, b * 64 * 512:b * 64 * 512 + r * 512] = native.float().to(DEVICE)
    ws_lse[:, :splits] = lse.float().to(DEVICE)
    out = torch.empty(rows, heads, 512, dtype=dtype, device=DEVICE)
    lse_out = torch.empty(rows, heads, device=DEVICE)
    wide = {"RUNS": runs, "num_warps": 4 * runs} if runs > 1 else {"num_warps": 4}
    if runs > 1 and pdl:
        wide["HOLD_SMEM"] = 120_000
    launch = make_launch(_flashmla_combine_native_kernel, (rows * len(blocks) * 64 // runs,),
                         BLOCK_S=max(2, 1 << (splits - 1).bit_length()), D_NOPE=512, num_stages=1,
                         PDL=pdl, launch_pdl=bool(pdl), PARTIAL_16=partial_16, **wide)
    launch(ws_out, ws_lse, out, lse_out, heads, splits, *ws_out.stride()[:3], *ws_lse.stride()[:2])
    top = lse.max(dim=1).values
    w = torch.exp(lse - torch.where(top.isinf(), 0.0, top)[:, None])
    den = w.sum(dim=1)
    ref = (w[..., None] * part).sum(dim=1) / torch.where(den == 0, 1.0, den)[..., None]
    ref_lse = torch.where(den == 0, float("-inf"), top + torch.log(torch.where(den == 0, 1.0, den)))
    atol, rtol = TOLERANCES[dtype]
    where = (f"[flashmla native combine {heads} heads x {splits} splits {dtype} pdl={pdl} partial_16={partial_16} "
             f"runs={runs}]")
    torch.testing.assert_close(out.double().cpu(), ref, atol=atol, rtol=rtol, msg=where)
    torch.testing.assert_close(lse_out.double().cpu(), ref_lse, atol=LSE_ATOL, rtol=0, msg=where)
    assert lse_out[1, 5].item() == float("-inf") and not out[1, 5].any(), where
