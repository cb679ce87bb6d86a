"""Every kernel path against the float64 reference (CPU: the Triton interpreter; GPU: compiled).

Under the interpreter the kernels upcast their tiles to float32 before ``tl.dot`` (the
interpreter's bf16 dot is wrong in triton 3.9), so bf16 here checks the kernels' indexing,
masking, softmax and split-KV logic in bf16 storage; the bf16 tensor-core path itself is
checked on a GPU by tests/test_kernels_gpu.py.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from graphattn.common.metadata import GraphMetadata
from graphattn.common.platform import current_platform
from graphattn.common.reference import sparse_mla_reference
from graphattn.kernels import (
    split_plan,
    sparse_mla_flashmla,
    sparse_mla_mega,
    sparse_mla_trtllm,
)

DEVICE = current_platform().device
# (dtype, atol, rtol) for out; lse is float32 in every case.
TOLERANCES = {torch.float16: (2e-3, 2e-2), torch.bfloat16: (1.6e-2, 5e-2)}
LSE_ATOL = 1e-3
PATHS = ("flashmla", "trtllm", "mega")


@pytest.fixture(autouse=True)
def _nan_poison():
    """torch.empty returns NaN-filled memory, so an output element a kernel skips shows up."""
    old = torch.utils.deterministic.fill_uninitialized_memory
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was)
    torch.utils.deterministic.fill_uninitialized_memory = old


def make_inputs(rows, heads, topk, pool, dtype, invalid_frac=0.2):
    """Random q/kv (never zeros), and indices mixing valid, −1, out-of-range and duplicates."""
    q = torch.randn(rows, heads, 576, device=DEVICE).to(dtype)
    kv = torch.randn(pool, 576, device=DEVICE).to(dtype)
    idx = torch.randint(0, pool, (rows, topk), device=DEVICE, dtype=torch.int32)
    r = torch.rand(rows, topk, device=DEVICE)
    idx[r < invalid_frac / 2] = -1
    idx[(r >= invalid_frac / 2) & (r < invalid_frac)] = pool + 7  # out of range: skipped
    if topk >= 4:
        idx[:, 1] = idx[:, 0]  # duplicates count twice
    return q, kv, idx


def run_path(path, q, kv, idx, sm_scale):
    """Call ``path`` with metadata-sized, NaN-poisoned workspace; returns (out, lse, counter)."""
    rows, heads, _ = q.shape
    plan = split_plan(path, heads, idx.shape[1])
    if path == "mega":
        return (*sparse_mla_mega(q, kv, idx, sm_scale), None)
    md = GraphMetadata(rows, heads, idx.shape[1], q.dtype, q.device, **plan.metadata_kwargs())
    ws_out, ws_lse = md.workspace_for(rows)
    ws_out.fill_(float("nan"))
    ws_lse.fill_(float("nan"))
    if path == "flashmla":
        return (*sparse_mla_flashmla(q, kv, idx, sm_scale, ws_out, ws_lse), None)
    counter = md.counter_for(rows)
    return (*sparse_mla_trtllm(q, kv, idx, sm_scale, counter, ws_out, ws_lse), counter)


def check_against_reference(path, q, kv, idx, sm_scale, out, lse, counter=None):
    ref_out, ref_lse = sparse_mla_reference(q, kv, idx, sm_scale)
    atol, rtol = TOLERANCES[q.dtype]
    where = f"[{path} rows={q.shape[0]} heads={q.shape[1]} topk={idx.shape[1]} {q.dtype}]"
    assert out.shape == ref_out.shape and out.dtype == q.dtype, f"{where} out {out.shape} {out.dtype}"
    assert lse.shape == ref_lse.shape and lse.dtype == torch.float32, f"{where} lse {lse.shape}"
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol, msg=lambda m: f"{where} out: {m}")
    torch.testing.assert_close(lse.double(), ref_lse, atol=LSE_ATOL, rtol=1e-4, msg=lambda m: f"{where} lse: {m}")
    if counter is not None:
        assert int(counter.abs().sum()) == 0, f"{where} counter not reset: {counter.tolist()}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads,topk", [(3, 37), (16, 64), (20, 50), (64, 90)])
def test_matches_reference_fp16(path, heads, topk):
    q, kv, idx = make_inputs(3, heads, topk, pool=300, dtype=torch.float16)
    out, lse, counter = run_path(path, q, kv, idx, 0.07)
    check_against_reference(path, q, kv, idx, 0.07, out, lse, counter)


@pytest.mark.parametrize("path", PATHS)
def test_matches_reference_bf16_upcast(path):
    q, kv, idx = make_inputs(2, 24, 45, pool=128, dtype=torch.bfloat16)
    out, lse, counter = run_path(path, q, kv, idx, 1 / math.sqrt(576))
    check_against_reference(path, q, kv, idx, 1 / math.sqrt(576), out, lse, counter)


@pytest.mark.parametrize("path", PATHS)
def test_all_invalid_row_gives_zero_and_minus_inf(path):
    q, kv, idx = make_inputs(3, 5, 40, pool=64, dtype=torch.float16)
    idx[1] = -1
    idx[2, ::2] = -1
    idx[2, 1::2] = 1 << 30  # far out of range: must not be read
    out, lse, counter = run_path(path, q, kv, idx, 0.1)
    where = f"[{path}]"
    assert torch.all(out[1:] == 0), f"{where} out of an all-invalid row is not 0"
    assert torch.all(lse[1:] == float("-inf")), f"{where} lse of an all-invalid row: {lse[1:]}"
    check_against_reference(path, q, kv, idx, 0.1, out, lse, counter)


def unpadded_q(q, spare=3):
    """``q`` as a head slice of a wider tensor whose other heads are NaN: a kernel that reads a
    head outside ``[0, H)`` picks NaN up, and a store of one lands NaN in the output."""
    rows, heads, dim = q.shape
    wide = torch.full((rows, heads + 2 * spare, dim), float("nan"), dtype=q.dtype, device=q.device)
    wide[:, spare:spare + heads] = q
    return wide[:, spare:spare + heads]  # strides stay 16-byte multiples: every kernel may run


SENTINEL = 1234.5  # workspace heads and output rows past what a launch may write


def check_unpadded_flashmla(rows, heads, topk, pool, dtype, ws_splits=None, sm_scale=0.07):
    """flashmla on unpadded q ``[rows, heads, 576]`` (a NaN-flanked view), indices with −1,
    out-of-range, duplicates and (rows > 1) an all-invalid last row, against the reference.

    Two launches: ``torch.ops.graphattn.sparse_mla_flashmla`` (exact-size outputs, NaN-poisoned
    by ``torch.empty`` under ``_nan_poison``), and the same plan bound by ``bind_flashmla``
    writing into the first ``rows`` rows of NaN-poisoned outputs followed by a SENTINEL row.
    The workspace (``ws_splits`` splits per row, all the pool holds when ``None``; 0: one split
    that writes the outputs directly) has SENTINEL heads past ``heads``. A store of a head
    ``>= heads`` would change a SENTINEL; a read of one would bring NaN in.
    """
    from graphattn.kernels.flashmla import bind_flashmla, kernel_name, plan_flashmla
    from graphattn.kernels.launch import aligned_16

    q, kv, idx = make_inputs(rows, heads, topk, pool=pool, dtype=dtype)
    q = unpadded_q(q)
    if rows > 1:
        idx[-1] = -1
    sizes = split_plan("flashmla", heads, topk).metadata_kwargs() | {"workspace_heads": heads + 16}
    md = GraphMetadata(rows, heads, topk, dtype, q.device, **sizes)
    ws_out, ws_lse = md.workspace_for(rows, ws_splits)
    ws_out.fill_(float("nan"))
    ws_lse.fill_(float("nan"))
    ws_out[:, :, heads:] = SENTINEL
    ws_lse[:, :, heads:] = SENTINEL
    path = f"flashmla ({kernel_name(q, kv, topk)}, {max(ws_out.shape[1], 1)} splits)"
    out, lse = torch.ops.graphattn.sparse_mla_flashmla(q, kv, idx, sm_scale, ws_out, ws_lse)
    assert tuple(out.shape) == (rows, heads, 512) and tuple(lse.shape) == (rows, heads), (
        f"[{path}] outputs must be exactly [rows, H]: out {tuple(out.shape)}, lse {tuple(lse.shape)}")
    big_out = torch.full((rows + 1, heads, 512), float("nan"), dtype=dtype, device=q.device)
    big_lse = torch.full((rows + 1, heads), float("nan"), device=q.device)
    big_out[rows], big_lse[rows] = SENTINEL, SENTINEL
    launch = plan_flashmla(rows, heads, topk, ws_out.shape[1], aligned_16(q, kv))
    bind_flashmla(launch, idx, sm_scale, ws_out, ws_lse)(q, kv, (big_out[:rows], big_lse[:rows]))
    spare = (ws_out[:, :, heads:], ws_lse[:, :, heads:], big_out[rows], big_lse[rows])
    assert all(torch.all(t == SENTINEL) for t in spare), f"[{path} heads={heads}] a store past head {heads}"
    for what, (o, l) in (("op", (out, lse)), ("bound call", (big_out[:rows], big_lse[:rows]))):
        where = f"{path} {what}"
        if rows > 1:
            assert torch.all(o[-1] == 0) and torch.all(l[-1] == float("-inf")), f"[{where}] all-invalid row"
        assert not o.isnan().any() and not l.isnan().any(), f"[{where} heads={heads}] NaN in the outputs"
        check_against_reference(where, q, kv, idx, sm_scale, o, l)


@pytest.fixture(params=["interpreter tiles", "64-head blocks"])
def flashmla_head_block(request):
    """flashmla with the launch table's head block, and with sm_90's 64-head block (the Gluon
    kernel's, which cannot run here) on the heads-major and tokens-major Triton tiles."""
    from graphattn.kernels.launch import clear_launch_plans

    if request.param == "interpreter tiles":
        yield None
        return
    platform = current_platform()
    if not platform.uses_triton_interpreter:
        pytest.skip("a 64-head Triton tile is only forced under the interpreter")
    clear_launch_plans()
    with platform.launch_table.override("flashmla", BLOCK_H=64):
        yield 64
    clear_launch_plans()


@pytest.mark.parametrize("heads", [1, 16, 20, 48, 64, 80])
@pytest.mark.parametrize("splits", ["split", "direct"])
def test_flashmla_reads_unpadded_q(flashmla_head_block, heads, splits):
    check_unpadded_flashmla(3, heads, 45, pool=80, dtype=torch.float16, ws_splits=0 if splits == "direct" else None)


def test_flashmla_op_at_16_heads_needs_no_padding():
    """The op takes 16 heads as they are (no multiple of 64), eager and under fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, kv, idx = make_inputs(2, 16, 40, pool=64, dtype=torch.float16)
    plan = split_plan("flashmla", 16, 40)
    assert plan.workspace_heads == 16, f"flashmla: workspace sized for {plan.workspace_heads} heads"
    md = GraphMetadata(2, 16, 40, q.dtype, q.device, **plan.metadata_kwargs())
    ws = md.workspace_for(2)
    out, lse = torch.ops.graphattn.sparse_mla_flashmla(q, kv, idx, 0.1, *ws)
    check_against_reference("flashmla op", q, kv, idx, 0.1, out, lse)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) for t in (q, kv, idx, *ws)]
        out, lse = torch.ops.graphattn.sparse_mla_flashmla(*fake[:3], 0.1, *fake[3:])
        assert out.shape == (2, 16, 512) and lse.shape == (2, 16), f"flashmla fake: {out.shape} {lse.shape}"


@pytest.mark.parametrize("path", ("flashmla", "trtllm"))
def test_small_workspace_uses_fewer_splits(path):
    heads = 16
    q, kv, idx = make_inputs(2, heads, 64, pool=100, dtype=torch.float16)
    ws_out = torch.full((2, 1, heads, 512), float("nan"), device=DEVICE)
    ws_lse = torch.full((2, 1, heads), float("nan"), device=DEVICE)
    if path == "flashmla":
        out, lse, counter = *sparse_mla_flashmla(q, kv, idx, 0.1, ws_out, ws_lse), None
    else:
        counter = torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)
        out, lse = sparse_mla_trtllm(q, kv, idx, 0.1, counter, ws_out, ws_lse)
    check_against_reference(path, q, kv, idx, 0.1, out, lse, counter)


def test_trtllm_counter_zero_after_repeated_launches():
    q, kv, idx = make_inputs(2, 20, 300, pool=400, dtype=torch.float16)
    plan = split_plan("trtllm", 20, 300)
    assert plan.num_splits > 1 and plan.counter_cols >= 2, f"trtllm: plan {plan} does not split"
    counter = torch.zeros(2, plan.counter_cols, dtype=torch.int32, device=DEVICE)
    ws = (torch.empty(2, plan.num_splits, 20, 512, device=DEVICE), torch.empty(2, plan.num_splits, 20, device=DEVICE))
    for _ in range(2):
        out, lse = sparse_mla_trtllm(q, kv, idx, 0.1, counter, *ws)
        check_against_reference("trtllm", q, kv, idx, 0.1, out, lse, counter)
        q, kv, idx = make_inputs(2, 20, 300, pool=400, dtype=torch.float16)


def test_split_plan_shapes():
    assert split_plan("mega", 16, 2048) == (0, 0, 0, 0)
    fm = split_plan("flashmla", 64, 2048)
    assert fm.num_splits >= 1 and fm.counter_cols == 0 and fm.workspace_heads == 64
    tr = split_plan("trtllm", 20, 2048)
    assert tr.counter_cols == 2 and tr.workspace_heads == 20
    with pytest.raises(ValueError, match="Unknown kernel path"):
        split_plan("nope", 16, 2048)


def test_custom_ops_are_registered_with_fakes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, kv, idx = make_inputs(2, 64, 32, pool=50, dtype=torch.float16)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fkv, fidx = (mode.from_tensor(t) for t in (q, kv, idx))
        out, lse = torch.ops.graphattn.sparse_mla_mega(fq, fkv, fidx, 0.1)
        assert out.shape == (2, 64, 512) and lse.shape == (2, 64) and lse.dtype == torch.float32
        ws = (fq.new_empty(2, 2, 64, 512, dtype=torch.float32), fq.new_empty(2, 2, 64, dtype=torch.float32))
        assert torch.ops.graphattn.sparse_mla_flashmla(fq, fkv, fidx, 0.1, *ws)[0].shape == (2, 64, 512)
    schema = torch.ops.graphattn.sparse_mla_trtllm.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"counter", "ws_out", "ws_lse"}, f"trtllm mutates_args: {mutated}"


def _bad_input_cases():
    q, kv, idx = make_inputs(2, 64, 16, pool=32, dtype=torch.float16)
    ws = (torch.zeros(2, 2, 64, 512, device=DEVICE), torch.zeros(2, 2, 64, device=DEVICE))
    return [
        ("q dtype", lambda: sparse_mla_mega(q.float(), kv, idx, 0.1), TypeError, "bfloat16 or float16"),
        ("kv dtype", lambda: sparse_mla_mega(q, kv.bfloat16(), idx, 0.1), TypeError, "kv dtype must equal"),
        ("index dtype", lambda: sparse_mla_mega(q, kv, idx.long(), 0.1), TypeError, "int32"),
        ("head dim", lambda: sparse_mla_mega(q[..., :512], kv, idx, 0.1), ValueError, "576"),
        ("kv dim", lambda: sparse_mla_mega(q, kv[:, :512].contiguous(), idx, 0.1), ValueError, "pool_tokens, 576"),
        ("rows", lambda: sparse_mla_mega(q, kv, idx[:1], 0.1), ValueError, "rows=2"),
        ("stride", lambda: sparse_mla_mega(q, kv.t().contiguous().t(), idx, 0.1), ValueError, "contiguous last dim"),
        ("ws rows", lambda: sparse_mla_flashmla(q, kv, idx, 0.1, ws[0][:1], ws[1][:1]), ValueError, "too small"),
        ("ws dtype", lambda: sparse_mla_flashmla(q, kv, idx, 0.1, ws[0].half(), ws[1]), TypeError, "float32"),
        ("counter cols", lambda: sparse_mla_trtllm(q, kv, idx, 0.1, torch.zeros(2, 1, dtype=torch.int32), *ws),
         ValueError, "head blocks"),
        ("counter dtype", lambda: sparse_mla_trtllm(q, kv, idx, 0.1, torch.zeros(2, 4), *ws), TypeError, "int32"),
    ]


@pytest.mark.parametrize("settings", ["interpreter", "sm90", "gfx942"])
@pytest.mark.parametrize("path,heads,topk", [("flashmla", 64, 2048), ("flashmla", 128, 2048),
                                             ("trtllm", 20, 2048), ("trtllm", 128, 8192), ("flashmla", 64, 100)])
def test_workspace_pool_gives_every_row_count_its_splits(monkeypatch, settings, path, heads, topk):
    """``split_plan``'s pool holds, at every row count, the splits the launcher would choose."""
    from graphattn.cuda import configs as cuda_configs
    from graphattn.hip import configs as hip_configs
    from graphattn.kernels.plan import choose_splits, path_config, usable_splits

    platform = type(current_platform())
    if settings == "sm90":
        monkeypatch.setattr(platform, "kernel_config", lambda self, p, **kw: cuda_configs.kernel_config(p, **kw))
    elif settings == "gfx942":
        monkeypatch.setattr(platform, "kernel_config",
                            lambda self, p, **kw: hip_configs.kernel_config(p, "gfx942", **kw))
    plan = split_plan(path, heads, topk)
    md = GraphMetadata(4096, heads, topk, torch.float16, "meta", **plan.metadata_kwargs())
    where = f"[{path} {settings} heads={heads} topk={topk} plan={plan}]"
    assert plan.max_partials <= 1024, f"{where} the pool should stay small"
    for rows in range(1, 1100):
        cfg = path_config(path, rows, heads, topk)
        want = choose_splits(rows, heads, topk, cfg)
        got = usable_splits(rows, heads, topk, cfg, md.workspace_splits(rows))
        assert got == want, f"{where} rows={rows}: the pool allows {got} splits, the launcher wants {want}"


@pytest.mark.parametrize("case", range(11))
def test_bad_inputs_raise_clearly(case):
    name, call, exc, text = _bad_input_cases()[case]
    with pytest.raises(exc, match=text):
        call()


def _use_sm90_settings(monkeypatch):
    from graphattn.cuda import configs as cuda_configs

    monkeypatch.setattr(type(current_platform()), "kernel_config",
                        lambda self, p, **kw: cuda_configs.kernel_config(p, **kw))
    return cuda_configs


def _plan_as_h200(monkeypatch):
    """sm_90's launch table and an H200's 132 SMs for this test's plans (skipped where this
    triton has no Gluon, whose kernels the plans name); returns graphattn.cuda.configs."""
    cuda_configs = _use_sm90_settings(monkeypatch)
    if not cuda_configs.gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect")
    monkeypatch.setattr(type(current_platform()), "num_compute_units", lambda self: cuda_configs.SM90_SMS)
    return cuda_configs


def _fresh_plan(rows, heads, topk, ws_splits, kv_fp8):
    """flashmla's plan made now (none memoised before or kept after: the test's settings apply)."""
    from graphattn.kernels.flashmla import plan_flashmla
    from graphattn.kernels.launch import clear_launch_plans

    clear_launch_plans()
    try:
        return plan_flashmla(rows, heads, topk, ws_splits, kv_fp8=kv_fp8)
    finally:
        clear_launch_plans()


def _h200_plan_running(monkeypatch, rows, heads, topk, kv_fp8, kernel):
    """An H200's flashmla plan (:func:`_plan_as_h200`, :func:`_fresh_plan`; 64 workspace splits),
    asserted to run ``kernel``: ``(graphattn.cuda.configs, plan, where)``, ``where`` naming the
    shape and the launch for failure messages."""
    cuda_configs = _plan_as_h200(monkeypatch)
    plan = _fresh_plan(rows, heads, topk, 64, kv_fp8)
    where = f"[flashmla {heads}x{rows}x{topk} fp8={kv_fp8}] {plan.kernel} splits={plan.splits} {plan.main!r}"
    assert plan.kernel == kernel, where
    return cuda_configs, plan, where


def test_sm90_flashmla_picks_gluon_and_falls_back_for_unaligned_inputs(monkeypatch):
    """With sm_90 settings flashmla runs the warp-specialised Gluon kernel where its 16-byte
    cp.async copies are legal (at 12 warps, so with a register cap at launch), and flashmla's
    Triton tiles for inputs they are not (odd strides)."""
    from graphattn.kernels import flashmla

    cuda_configs = _use_sm90_settings(monkeypatch)
    if not cuda_configs.gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect")
    q = torch.randn(4, 64, 576)
    kv = torch.randn(100, 576)
    kernel, cfg = flashmla._split_kernel(q, kv, 2048)
    assert kernel.__name__ == "_flashmla_rr_kernel" and cfg["kernel"] == "wgmma_rr", cfg
    assert cfg["num_warps"] == 4 and cfg["maxnreg"] * 12 * 32 <= 65536, cfg  # 3 warpgroups must fit
    assert cfg["split_cost_blocks"] > 0 and "IDX_AHEAD" not in cfg, cfg
    for name, (q_bad, kv_bad) in {
        "kv row stride 577": (q, torch.randn(100, 577)[:, :576]),
        "q head stride 580": (torch.randn(4, 64, 580)[..., :576], kv),
        "kv base off by 4 bytes": (q, torch.randn(100 * 576 + 1)[1:].view(100, 576)),
    }.items():
        kernel, cfg = flashmla._split_kernel(q_bad, kv_bad, 2048)
        assert kernel is flashmla._flashmla_split_kernel and "kernel" not in cfg, f"[flashmla {name}] {cfg}"
        assert cfg == flashmla.path_config("flashmla_triton", 4, 64, 2048), f"[flashmla {name}] {cfg}"
    # One row of <= 64 heads keeps the tokens-major Triton tile (faster there).
    kernel, cfg = flashmla._split_kernel(q[:1], kv, 2048)
    assert kernel is flashmla._flashmla_split_kernel and cfg["KV_MAJOR"] == 1, cfg


@pytest.mark.parametrize("rows,heads,topk,want", [
    (1, 128, 2048, "wgmma_ws"),  # rr: 2 head blocks x 16 one-round splits = 32 programs
    (2, 64, 2048, "wgmma_ws"),
    (3, 64, 2048, "wgmma_rr"),  # 48 programs
    (2, 128, 2048, "wgmma_rr"),
    (1, 128, 8192, "wgmma_rr"),  # 32 splits of two rounds
    (512, 128, 2048, "wgmma_rr"),
    (64, 64, 2048, "wgmma_rr"),
])
def test_sm90_bf16_picks_rounds_where_the_launch_has_enough_programs(monkeypatch, rows, heads, topk, want):
    """bf16 kv at 64+ heads runs wgmma_rr (rounds of two tiles), except where its whole-round
    splits would leave fewer than WGMMA_RR_MIN_PROGRAMS programs (wgmma_ws's one-tile splits
    measured faster there); FP8 tokens keep wgmma_ws at every size."""
    from graphattn.kernels import flashmla
    from graphattn.kernels.plan import choose_splits, path_config

    cuda_configs = _use_sm90_settings(monkeypatch)
    if not cuda_configs.gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect")
    cfg = path_config("flashmla", rows, heads, topk)
    assert cfg.get("kernel") == want, f"[flashmla rows={rows} heads={heads} topk={topk}] {cfg}"
    rr = {**cfg, **cuda_configs._WGMMA_RR_TILE}
    programs = rows * (heads // 64) * choose_splits(rows, heads, topk, rr)
    assert (programs >= cuda_configs.WGMMA_RR_MIN_PROGRAMS) == (want == "wgmma_rr"), (programs, cfg)
    q, kv = torch.randn(rows, heads, 576), torch.randn(100, 576)
    assert flashmla.kernel_name(q, kv, topk) == want
    fp8 = path_config("flashmla", rows, heads, topk, kv_fp8=True)
    assert fp8.get("kernel") == "wgmma_ws" and fp8.get("KV_FP8") == 1, fp8


@pytest.mark.parametrize("rows,heads,topk,want", [
    (64, 64, 2048, 2),  # 64 programs: one wave of 128, not two waves of 192
    (8, 64, 2048, 16),  # 8 programs: 128 in one wave
    (64, 128, 2048, 1),  # 128 programs already fill a wave
    (8, 128, 32768, 8),  # 9 splits would need a second wave for 16 more programs
    (100, 64, 2048, 1),  # two splits would be two waves of half the work, plus their partials
])
def test_sm90_wgmma_splits_fill_whole_waves(monkeypatch, rows, heads, topk, want):
    from graphattn.kernels.plan import choose_splits, path_config

    cuda_configs = _use_sm90_settings(monkeypatch)
    if not cuda_configs.gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect")
    cfg = path_config("flashmla", rows, heads, topk)
    assert cfg.get("kernel") == "wgmma_rr", cfg  # every case here has enough programs for rounds
    got = choose_splits(rows, heads, topk, cfg)
    assert got == want, f"[flashmla wgmma rows={rows} heads={heads} topk={topk}] {got} splits, want {want}"


@pytest.mark.parametrize("rows,heads,topk,kv_fp8,override,cluster", [
    (64, 64, 2048, False, {}, 2),  # two splits: a cluster of two merges them, no combine launch
    (24, 100, 2077, False, {}, 2),  # a masked head block too
    (64, 64, 2048, False, {"cluster_merge": 0}, 0),  # the setting off: partials and the combine
    (8, 128, 2048, False, {}, 0),  # 8 splits: the combine
    (512, 128, 2048, False, {}, 0),  # one split: direct
    (64, 64, 2048, True, {}, 2),  # FP8 tokens: wgmma_ws's producer merges them
    (32, 128, 2048, True, {}, 2),
    (28, 128, 2048, True, {}, 2),  # 112 CTAs: at least 0.75 of the SMs (FP8's cluster_min_fill)
    (52, 64, 2048, True, {}, 2),  # 104 CTAs
    (24, 128, 2048, True, {}, 0),  # 96 CTAs: partials and the combine, measured faster there
    (24, 128, 2048, False, {}, 2),  # bf16 (wgmma_rr) merges at any fill
    (64, 64, 2048, True, {"cluster_merge": 0}, 0),
    (8, 64, 2048, True, {}, 0),  # more splits: the combine
])
def test_sm90_two_splits_merge_in_a_cluster(monkeypatch, rows, heads, topk, kv_fp8, override, cluster):
    """Where wgmma_rr's launch (or wgmma_ws's with FP8 tokens) takes two splits, the plan runs
    them as thread-block clusters of two (``CLUSTER=2``: consecutive programs,
    ``Launch.cluster``) that merge in the kernel, with no combine launch (with FP8 tokens only
    where the launch fills at least 0.75 of an H200's 132 SMs); everywhere else the plan is
    unchanged."""
    cuda_configs = _plan_as_h200(monkeypatch)
    for key, value in override.items():
        monkeypatch.setitem(cuda_configs._WGMMA_FP8_TILE if kv_fp8 else cuda_configs._WGMMA_RR_TILE, key, value)
    plan = _fresh_plan(rows, heads, topk, 32, kv_fp8)
    where = f"[flashmla {heads}x{rows}x{topk} fp8={kv_fp8} {override}] {plan.main!r}"
    assert plan.main.kwargs.get("CLUSTER", 0) == cluster and plan.main.cluster == max(cluster, 1), where
    assert plan.main.grid == (rows * plan.splits * plan.head_blocks,), where
    if cluster:
        assert plan.kernel == ("wgmma_ws" if kv_fp8 else "wgmma_rr"), where
        assert plan.splits == 2 and plan.combine is None, where
        assert not plan.main.kwargs["DIRECT"] and plan.main.grid[0] % cluster == 0, where
    else:
        assert (plan.combine is None) == (plan.splits == 1), where


@pytest.mark.parametrize("heads,rows,topk,kv_fp8,programs,per", [
    (128, 1, 2048, False, 128, 1), (64, 2, 2048, False, 128, 1), (96, 1, 2048, False, 128, 1),  # wgmma_ws
    (16, 1, 2048, False, 16, 1), (64, 1, 2048, False, 64, 1),  # the tokens-major tile, the head-major combine
    (16, 4, 2048, False, 64, 1), (16, 8, 2048, False, 128, 1), (16, 8, 2048, True, 128, 1),  # wgmma_tn
    # the native combine of wgmma_rr (bf16) and wgmma_ws (FP8) at 2-8 rows: wider programs
    (128, 2, 2048, False, 128, 2), (64, 8, 2048, False, 128, 4), (128, 8, 2048, False, 128, 8),
    (64, 8, 2048, True, 128, 4), (128, 8, 2048, True, 128, 8), (128, 3, 32768, False, 96, 4),
    # wgmma_tn's head-major combine: several heads a program (16 x 16: 2, 16 x 24: 4, 13 x 20:
    # 4, the last group partly masked; FP8 32 x 5: 2; 16 x 64: 8; FP8 20 x 64: 16, its second
    # group 4 heads and 12 masked; at 132 SMs wgmma_tn's launches with splits never need more
    # than 16); the native combine's 2048 one-run programs are 256 at its most runs
    (16, 16, 2048, False, 128, 2), (16, 24, 2077, False, 96, 4), (13, 20, 2077, False, 80, 4),
    (32, 5, 2048, True, 80, 2), (16, 64, 2048, False, 128, 8), (20, 64, 2077, True, 128, 16),
    (128, 16, 2048, False, 0, 1),
])
def test_sm90_combine_of_one_wave_is_a_pdl_one_program_per_sm(monkeypatch, heads, rows, topk, kv_fp8, programs,
                                                               per):
    """On sm_90 flashmla's combine is a programmatic dependent launch wherever it has at most one
    program per SM (``programs`` of them; 0: more): its programs reserve ``COMBINE_HOLD_SMEM``
    of shared memory, more than half an SM's, so that, placed while the split kernel runs, no
    two share an SM, and the split kernel signals them first thing (``LAUNCH_DEPENDENTS``). To
    get there the native combine takes ``per`` runs of 8 columns a program (``4 * per`` warps),
    the head-major one ``per`` heads (``min(16, 4 * per)`` warps). A larger combine is a plain
    launch after the split kernel."""
    cuda_configs = _plan_as_h200(monkeypatch)
    plan = _fresh_plan(rows, heads, topk, 32, kv_fp8)
    combine = plan.combine
    where = f"[flashmla {heads}x{rows}x{topk} fp8={kv_fp8}] {plan.kernel} {combine!r}"
    assert combine is not None and plan.splits > 1, where
    assert cuda_configs.COMBINE_HOLD_SMEM * 2 > 228 * 1024, "one program per SM of an H200"
    native = combine.name == "_flashmla_combine_native_kernel"
    runs, group = (per, 1) if native else (1, per)
    assert combine.kwargs.get("RUNS", 1) == runs and combine.kwargs.get("HEADS", 1) == group, where
    assert combine.kwargs["num_warps"] == (4 * runs if native else min(16, 4 * group)), where
    if runs > 1:
        heads_blocks = -(-heads // 64)
        assert combine.grid == (rows * heads_blocks * 64 // runs,), where
        assert runs * combine.kwargs["BLOCK_S"] <= 128, where  # no spills (ptxas, sm_90)
    if group > 1:
        assert combine.grid == (rows * -(-heads // group),), where
        assert group * combine.kwargs["BLOCK_S"] * 512 <= 64 * 32 * combine.kwargs["num_warps"], where
    if programs:
        assert combine.grid == (programs,), where
        assert combine.kwargs["PDL"] == 1 and combine.kwargs["launch_pdl"] is True, where
        assert combine.kwargs["HOLD_SMEM"] == cuda_configs.COMBINE_HOLD_SMEM, where
        assert plan.main.kwargs.get("LAUNCH_DEPENDENTS") == 1, where
    else:
        assert combine.grid[0] > cuda_configs.SM90_SMS, where
        assert not {"PDL", "HOLD_SMEM", "launch_pdl"} & set(combine.kwargs), where
        assert not plan.main.kwargs.get("LAUNCH_DEPENDENTS"), where


@pytest.mark.parametrize("programs,block_s,partial_16,want", [
    (64, 32, True, 1), (128, 32, True, 1), (256, 16, True, 2), (512, 16, True, 4), (1024, 8, True, 8),
    (384, 32, True, 4), (576, 32, True, 1),  # 8 runs would spill at 32 splits: no PDL
    (1024, 16, True, 8), (1024, 16, False, 1), (512, 16, False, 4), (2048, 4, True, 1),
])
def test_native_combine_runs_are_the_fewest_that_fit_one_wave(programs, block_s, partial_16, want):
    """The native combine's runs a program: the fewest powers of two up to ``native_runs`` that
    bring its one-run ``programs`` to ``pdl_max_programs``, at most 128 / ``block_s`` with 16-bit
    partials (64 / ``block_s`` with f32: a thread holds 4 * ``block_s`` of them, and ptxas spilled
    above that); 1 where none does."""
    from graphattn.kernels.flashmla import _native_runs

    assert _native_runs(programs, block_s, partial_16, 8, 132) == want, (programs, block_s, partial_16)
    assert _native_runs(programs, block_s, partial_16, 1, 132) == 1  # not asked for
    # a cap that is no power of two rounds down (the A/B script's c_native_runs=3: 2, no PDL at 512)
    assert _native_runs(512, 16, True, 3, 132) == 1
    assert _native_runs(256, 16, True, 3, 132) == 2
    # a GPU of fewer SMs (an H100 PCIe: 114) takes more runs, or none where even 8 do not fit
    assert _native_runs(512, 16, True, 8, 114) == 8 and _native_runs(1024, 16, True, 8, 114) == 1


@pytest.mark.parametrize("rows,heads,block_s,want", [
    (8, 16, 16, 1), (9, 16, 16, 2), (16, 16, 8, 2), (32, 16, 4, 4), (64, 16, 2, 8), (64, 32, 2, 16),
    (64, 20, 2, 16),  # 20 heads: groups of 16 and 4 (masked)
    (33, 16, 16, 4), (33, 16, 32, 1),  # 2 heads a program would hold 128 values a thread at 32 splits
    (128, 32, 2, 1),  # 16 heads a program still leaves 256 programs
])
def test_head_major_combine_takes_the_fewest_heads_that_fit_one_wave(rows, heads, block_s, want):
    """The head-major combine's heads a program: the fewest powers of two up to
    ``combine_heads`` that bring its ``rows * heads`` programs to ``pdl_programs``, while a
    thread of its ``min(16, 4 * HEADS)`` warps holds at most 64 partial values; 1 where none
    does."""
    from graphattn.kernels.flashmla import _combine_heads

    assert _combine_heads(rows, heads, block_s, 16, 132) == want, (rows, heads, block_s)
    assert _combine_heads(rows, heads, block_s, 1, 132) == 1  # not asked for
    assert _combine_heads(64, 16, 2, 16, 0) == 1  # no PDL on this GPU
    assert _combine_heads(64, 16, 2, 4, 132) == 1  # 4 heads leave 256 programs
    assert _combine_heads(16, 16, 8, 3, 132) == 2  # a cap that is no power of two rounds down
    # a GPU of fewer SMs (an H20: 78) takes more heads, or none where even the most do not fit
    assert _combine_heads(16, 16, 8, 16, 78) == 4 and _combine_heads(64, 16, 2, 4, 78) == 1


def test_head_major_combine_settings_are_compiled_at_their_most_splits():
    """sm_90's launch table compiles each several-heads setting of the head-major combine
    (``HEADS`` up to ``COMBINE_HEADS``) at the largest ``BLOCK_S`` (power of two, at most 32)
    whose partial values a thread of it can hold (:func:`combine_heads_most`): the plan never
    gives that many heads more splits, and every count it can give has its setting."""
    from graphattn.cuda import configs as cuda_configs
    from graphattn.kernels.flashmla import combine_heads_most

    settings = {c["HEADS"]: c for c in cuda_configs.all_configs("flashmla_combine") if "HEADS" in c}
    want = {1 << i for i in range(1, 16) if 1 << i <= min(cuda_configs.COMBINE_HEADS, combine_heads_most(2))}
    assert set(settings) == want, sorted(settings)
    for group, cfg in settings.items():
        block_s = cfg["BLOCK_S"]
        assert combine_heads_most(block_s) >= group, cfg
        assert block_s == 32 or combine_heads_most(2 * block_s) < group, cfg
        assert cfg["num_warps"] == min(16, 4 * group) and cfg["PDL"] == 1, cfg


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_combine_is_a_plain_launch_outside_sm90(capability):
    """griddepcontrol exists from sm_90 on, and the PDL with its 120,000-byte reservation was
    measured on sm_90 only (sm_120 could not reserve it): other NVIDIA GPUs' combine setting
    has no PDL."""
    from graphattn.cuda import configs as cuda_configs

    cfg = cuda_configs.kernel_config("flashmla_combine", 1, 128, 2048, capability=capability)
    assert not {"pdl_max_programs", "PDL", "native_runs", "combine_heads"} & set(cfg), cfg


@pytest.mark.parametrize("heads,rows,want", [
    (16, 4, 16), (1, 4, 16), (16, 512, 16), (17, 64, 32), (32, 1000, 32),  # heads on N
    (16, 3, None), (16, 1, None), (32, 63, None), (33, 512, None), (64, 8, None),  # not there
])
def test_sm90_few_heads_run_the_heads_on_n_gluon_kernel(monkeypatch, heads, rows, want):
    """At <= 32 heads sm_90 flashmla runs ``wgmma_tn`` (the heads on the wgmma's N side, 16 or
    32 per program: ``want``) from ``TN_MIN_ROWS`` rows on, for plain kv and FP8 tokens alike;
    below those rows and above 32 heads it runs what it ran before (``want`` None). (FP8 tokens
    at few rows and a top-k of at most ``TN_FP8_FEW_ROWS_MAX_TOPK`` take ``wgmma_tn`` below
    those rows too: test_sm90_fp8_ring_where_a_split_has_few_tiles; here their top-k is above.)"""
    from graphattn.kernels import flashmla

    cuda_configs = _use_sm90_settings(monkeypatch)
    if not cuda_configs.gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect")
    q, kv = torch.randn(rows, heads, 576), torch.randn(100, 576)
    kernel, cfg = flashmla._split_kernel(q, kv, 2048)
    fp8 = cuda_configs.kernel_config("flashmla", rows, heads, cuda_configs.TN_FP8_FEW_ROWS_MAX_TOPK + 1, kv_fp8=True)
    where = f"[flashmla sm_90 {heads} heads x {rows} rows]"
    if want is None:
        assert cfg.get("kernel") != "wgmma_tn" and fp8.get("kernel") != "wgmma_tn", f"{where} {cfg} / {fp8}"
        return
    assert kernel.__name__ == "_flashmla_tn_kernel" and cfg["BLOCK_H"] == want, f"{where} {cfg}"
    assert cfg["num_warps"] == 4 and cfg["maxnreg"] * 12 * 32 <= 65536 and "KV_MAJOR" not in cfg, f"{where} {cfg}"
    assert fp8["kernel"] == "wgmma_tn" and fp8["BLOCK_H"] == want and fp8["KV_FP8"] == 1, f"{where} FP8 {fp8}"
    # Unaligned inputs cannot take its 16-byte copies: flashmla's heads-major Triton tiles.
    kernel, cfg = flashmla._split_kernel(q, torch.randn(100, 577)[:, :576], 2048)
    assert kernel is flashmla._flashmla_split_kernel and "kernel" not in cfg, f"{where} unaligned {cfg}"


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0)])
def test_wgmma_kernel_only_on_sm90(capability):
    """wgmma exists on sm_90 only: other NVIDIA GPUs get flashmla's Triton tiles."""
    from graphattn.cuda import configs as cuda_configs

    for rows, heads in ((1, 128), (8, 64), (512, 128), (512, 16), (64, 32)):
        cfg = cuda_configs.kernel_config("flashmla", rows=rows, heads=heads, topk=2048, capability=capability)
        assert "kernel" not in cfg and "BLOCK_H" in cfg, f"[flashmla sm_{capability[0]}{capability[1]}] {cfg}"


@pytest.mark.parametrize("rows,heads,topk,kv_fp8,kernel,ring,raw", [
    (4, 16, 2048, True, "wgmma_tn", 3, 0),  # one tile a split
    (8, 16, 2048, True, "wgmma_tn", 3, 0),
    (8, 16, 4096, True, "wgmma_tn", 0, 1),  # four tiles a split at 16 heads: the raw tile
    (12, 16, 2048, True, "wgmma_tn", 0, 1),  # three
    (16, 16, 2048, True, "wgmma_tn", 0, 1),
    (32, 16, 2048, True, "wgmma_tn", 0, 1),  # eight: the raw tile, scores from registers
    (8, 16, 32768, True, "wgmma_tn", 0, 1),
    (512, 16, 2048, True, "wgmma_tn", 0, 1),
    (40, 7, 2077, True, "wgmma_tn", 0, 1),  # 7 of 16 heads, a partial last tile
    (150, 13, 250, True, "wgmma_tn", 0, 1),  # one split of four tiles (direct), 13 of 16 heads
    (150, 13, 128, True, "wgmma_tn", 3, 0),  # one split of two tiles (direct): the ring
    (1, 16, 2048, True, "wgmma_tn", 3, 0),  # below TN_MIN_ROWS: FP8 at few rows and a small top-k
    (3, 16, 2048, True, "wgmma_tn", 3, 0),
    (1, 32, 2048, True, "wgmma_tn", 2, 0),  # 32 heads: two ring slots beside q
    (8, 20, 2000, True, "wgmma_tn", 2, 0),
    (1, 16, 2077, True, "wgmma_ws", 0, 0),  # a larger top-k at few rows: wgmma_ws, as measured
    (9, 32, 2048, True, "wgmma_ws", 0, 0),
    (64, 32, 2048, True, "wgmma_tn", 0, 0),  # 16 tiles a split at 32 heads: in place (no room for raw slots)
    (8, 16, 2048, False, "wgmma_tn", 0, 0),  # bf16 kv: no raw bytes to ring
    (512, 16, 2048, False, "wgmma_tn", 0, 0),
])
def test_sm90_fp8_ring_where_a_split_has_few_tiles(monkeypatch, rows, heads, topk, kv_fp8, kernel, ring, raw):
    """With FP8 tokens at <= 32 heads, where a split has at most ``ring_max_tiles`` KV tiles,
    sm_90 plans ``wgmma_tn`` with its ring of raw slots (``RING``), also below ``TN_MIN_ROWS``
    at few rows and a small top-k; with more tiles at 16 heads its raw tile (``RAW_TILE``);
    elsewhere it keeps the two in-place slots (or wgmma_ws)."""
    cuda_configs, plan, where = _h200_plan_running(monkeypatch, rows, heads, topk, kv_fp8, kernel)
    assert plan.main.kwargs.get("RING", 0) == ring, where
    assert plan.main.kwargs.get("RAW_TILE", 0) == raw, where
    if ring:
        assert -(-plan.split_len // 64) <= cuda_configs.TN_FP8_RING_MAX_TILES[plan.main.kwargs["BLOCK_H"]], where
    if raw:
        assert plan.main.kwargs["BLOCK_H"] == 16, where
        assert -(-plan.split_len // 64) > cuda_configs.TN_FP8_RING_MAX_TILES[16], where
    if kernel == "wgmma_tn":  # the ahead-of-time compile has this launch's constexprs
        want = {k: v for k, v in plan.main.kwargs.items() if k.isupper()}
        assert any(want.items() <= job.items() for job in _sm90_tn_jobs()), where


@functools.cache
def _sm90_tn_jobs() -> list[dict]:
    """The constexprs of every bf16 wgmma_tn compile of ``graphattn.kernels.aot`` for sm_90."""
    from graphattn.kernels import aot

    return [meta for kernel, _, meta, _, dtype in aot.jobs(["sm90"])
            if kernel == "flashmla_wgmma_tn" and dtype == "bf16"]


@pytest.mark.parametrize("rows,heads,topk,kv_fp8,kernel,early", [
    (64, 128, 2048, False, "wgmma_rr", 1),  # one split, two head blocks sharing each token
    (512, 128, 2048, False, "wgmma_rr", 1),
    (64, 128, 8192, False, "wgmma_rr", 1),
    (257, 100, 2077, False, "wgmma_rr", 1),  # a partly-masked second head block
    (512, 64, 2048, False, "wgmma_rr", 0),  # one head block: measured no faster
    (8, 64, 2048, False, "wgmma_rr", 0),
    (8, 128, 2048, False, "wgmma_rr", 1),  # in splits, the partials in the accumulator's order
    (8, 128, 32768, False, "wgmma_rr", 1),
    (2, 128, 2048, False, "wgmma_rr", 1),
    (8, 100, 2048, False, "wgmma_rr", 1),  # in splits, head-major partials
    (24, 128, 2048, False, "wgmma_rr", 0),  # two splits merged in a cluster
    (64, 128, 2048, True, "wgmma_ws", 0),  # FP8 tokens: another kernel
])
def test_sm90_rr_takes_its_index_loads_off_the_producers_path(monkeypatch, rows, heads, topk, kv_fp8, kernel,
                                                              early):
    """wgmma_rr's producer loads its indices early (``IDX_EARLY``: the split's indices asked of
    L2, each round's a round ahead) where the launch setting's ``idx_early_min_heads`` says and
    the launch is no cluster merge, as measured on the H200; nowhere else."""
    cuda_configs, plan, where = _h200_plan_running(monkeypatch, rows, heads, topk, kv_fp8, kernel)
    assert plan.main.kwargs.get("IDX_EARLY", 0) == early, where
    if early:
        assert plan.main.cluster == 1 and heads >= cuda_configs._WGMMA_RR_TILE["idx_early_min_heads"], where


@pytest.mark.parametrize("rows,heads,topk,kv_fp8,early", [
    (512, 32, 2048, True, 1),  # FP8 tokens in place, one split
    (64, 32, 2048, True, 1),  # in place, in splits
    (64, 24, 8192, True, 1),  # a partly-masked 32-head block
    (8, 32, 2048, True, 0),  # few tiles a split: the ring
    (512, 16, 2048, True, 0),  # 16 heads: the raw tile
    (512, 32, 2048, False, 0),  # bf16 kv
    (64, 16, 2048, False, 0),
])
def test_sm90_tn_takes_its_index_loads_off_the_producers_path_for_fp8_in_place(monkeypatch, rows, heads, topk,
                                                                               kv_fp8, early):
    """wgmma_tn's producer loads its indices early (``IDX_EARLY``) where FP8 tokens are gathered
    in place at 32 heads, as measured on the H200; not with the FP8 ring or raw tile, nor with
    bf16 kv (both measured slower)."""
    _, plan, where = _h200_plan_running(monkeypatch, rows, heads, topk, kv_fp8, "wgmma_tn")
    assert plan.main.kwargs.get("IDX_EARLY", 0) == early, where
    assert not (early and (plan.main.kwargs.get("RING") or plan.main.kwargs.get("RAW_TILE"))), where


@pytest.mark.parametrize("rows,heads,kv_fp8,override,native", [
    (8, 128, False, {}, True),  # wgmma_rr, 8 splits through the combine
    (8, 64, False, {}, True),
    (1, 128, False, {}, True),  # wgmma_ws (few programs), with the combine as a dependent launch
    (8, 128, True, {}, True),  # FP8 tokens: wgmma_ws
    (8, 128, False, {"partial_native": 0}, False),  # the setting off
    (8, 100, False, {}, False),  # a masked head block of 36 heads: not whole warps of the accumulator
    (8, 32, False, {}, True),  # 32 heads in a 64-head block (wgmma_rr): its 32 heads stored compact
    (8, 96, False, {}, True),  # a whole block and a half-masked one
    (8, 48, True, {}, True),  # FP8 tokens: wgmma_ws, 48 heads in a 64-head block
    (1, 16, True, {}, False),  # FP8 tokens at one row of 16 heads: wgmma_tn (its ring) stores head-major rows
    (8, 16, False, {}, False),  # wgmma_tn stores head-major rows
    (64, 64, False, {}, False),  # two splits merged in a cluster: no combine
    (512, 128, False, {}, False),  # one split: direct
])
def test_sm90_partials_in_the_accumulator_order(monkeypatch, rows, heads, kv_fp8, override, native):
    """Where a launch of wgmma_rr or wgmma_ws goes through the combine with heads a multiple of
    16 (a partly-masked 64-head block stores whole warps of its accumulator) above 16, the split kernel
    stores its partials in the accumulator's order (``PARTIAL_NATIVE``) and the combine is the
    kernel that reads that order; everywhere else both stay head-major."""
    from graphattn.kernels.flashmla import NATIVE_COMBINE, _flashmla_combine_kernel, _gluon

    cuda_configs = _plan_as_h200(monkeypatch)
    for tile in (cuda_configs._WGMMA_RR_TILE, cuda_configs._WGMMA_FP8_TILE, cuda_configs._WGMMA_TILE):
        for key, value in override.items():
            monkeypatch.setitem(tile, key, value)
    plan = _fresh_plan(rows, heads, 2048, 32, kv_fp8)
    where = f"[flashmla {heads}x{rows} fp8={kv_fp8} {override}] {plan.kernel} {plan.main!r} {plan.combine!r}"
    assert bool(plan.main.kwargs.get("PARTIAL_NATIVE")) == native, where
    if plan.combine is not None:
        assert plan.combine.fn is (_gluon(*NATIVE_COMBINE) if native else _flashmla_combine_kernel), where
        # partials in q's dtype (the launch setting's 2) are read so by the combine
        assert plan.combine.kwargs.get("PARTIAL_16", 0) == (plan.main.kwargs.get("PARTIAL_NATIVE") == 2), where
        runs = plan.combine.kwargs.get("RUNS", 1)  # runs of 8 columns a program (native: 1-8)
        group = plan.combine.kwargs.get("HEADS", 1)  # heads a program (head-major: 1-16)
        assert plan.combine.grid == ((rows * -(-heads // 64) * 64 // runs,) if native
                                     else (rows * -(-heads // group),)), where
        assert runs == 1 or (native and plan.combine.kwargs["PDL"] == 1), where  # only to make it a PDL
        assert group == 1 or (not native and plan.combine.kwargs["PDL"] == 1), where
    else:
        assert not native, where


@pytest.mark.parametrize("heads_per", [1, 2, 4])
def test_head_major_combine_of_several_heads_a_program_matches_float64(heads_per):
    """flashmla's head-major combine with ``HEADS`` heads a program (the last group partly
    masked: 5 heads) merges each head's split partials by their lse's exactly as the float64
    formula does, an empty split (lse -inf) weighing nothing and a head with no valid split
    getting lse -inf; the heads past the last one (a partly-masked group's) are not written
    (the buffers' NaN-poisoned tail past ``rows * heads`` stays NaN)."""
    from graphattn.common.platform import triton_interpreter_env
    from graphattn.kernels.flashmla import _flashmla_combine_kernel

    rows, heads, splits, block_s, d = 3, 5, 3, 4, 512
    gen = torch.Generator().manual_seed(7 + heads_per)
    ws_out = torch.randn(rows, block_s, heads, d, generator=gen).to(DEVICE)
    ws_lse = torch.randn(rows, block_s, heads, generator=gen).to(DEVICE) * 3
    ws_lse[0, 1, 2] = float("-inf")  # an empty split
    ws_lse[2, :, 4] = float("-inf")  # a head that saw no valid token
    # the outputs at the front of buffers with room for a whole group more, poisoned
    out_buf = torch.full(((rows * heads + heads_per) * d,), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse_buf = torch.full((rows * heads + heads_per,), float("nan"), device=DEVICE)
    out, lse = out_buf[:rows * heads * d].view(rows, heads, d), lse_buf[:rows * heads].view(rows, heads)
    grid = (rows * -(-heads // heads_per),)
    with triton_interpreter_env():  # a no-op where kernels compile
        _flashmla_combine_kernel[grid](ws_out, ws_lse, out, lse, heads, splits,
                                       ws_out.stride(0), ws_out.stride(1), ws_out.stride(2), ws_lse.stride(0),
                                       ws_lse.stride(1), BLOCK_S=block_s, D_NOPE=d, HEADS=heads_per)
    lse_s = ws_lse[:, :splits].double()
    top = lse_s.amax(1, keepdim=True)
    top = torch.where(top.isinf(), torch.zeros_like(top), top)
    w = (lse_s - top).exp()  # [rows, splits, heads]
    w_sum = w.sum(1)
    ref_out = (w[..., None] * ws_out[:, :splits].double()).sum(1) / w_sum.clamp_min(1e-300)[..., None]
    ref_lse = torch.where(w_sum == 0, float("-inf"), top[:, 0] + w_sum.log())
    where = f"[flashmla combine HEADS={heads_per}]"
    assert not out.isnan().any() and not lse.isnan().any(), where
    torch.testing.assert_close(out.double(), ref_out, atol=1e-2, rtol=1e-2, msg=where)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5, msg=where)
    assert out[2, 4].eq(0).all() and lse[2, 4].item() == float("-inf"), where
    assert out_buf[rows * heads * d:].isnan().all() and lse_buf[rows * heads:].isnan().all(), f"{where} wrote past H"
