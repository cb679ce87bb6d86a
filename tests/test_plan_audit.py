"""scripts/plan_audit.py on the CPU: every launch plan of every platform table fits in the
metadata ``make_metadata`` reserved (a reduced grid of the script's), the audit reports metadata
that is too small, and its model of the kernels' index arithmetic is the kernels' own where a CPU
can check it (their expressions evaluated from their source, and the Triton kernels run under
the interpreter). A failure of the grid test after a change of launch settings
(graphattn/cuda/configs.py and the other tables) or of a planner is a launch that would write
past its metadata on that platform; ``python scripts/plan_audit.py`` runs the full grid.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS = ROOT / "graphattn" / "kernels"


def _load_script():
    if str(ROOT / "scripts") not in sys.path:  # as when run: the script's folder is on sys.path
        sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("plan_audit", ROOT / "scripts" / "plan_audit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["plan_audit"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


A = _load_script()

# Every threshold that matters: heads around the head tiles (16, 32, 64) and the 64-head blocks of
# the accumulator-order store (48 and 80 heads: its partly-filled last blocks of 48 and 16);
# top-k from one index past the KV tiles and split thresholds to the largest; rows around the
# split and pool thresholds (the pools hold 24-510 partials), the reserved 512 and an oversized
# eager step above it (600).
GRID = A.Grid(
    heads=(1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 80, 127, 128, 129, 257),
    topks=(1, 64, 65, 2048, 2077, 8192, 65536),
    rows=(0, 1, 2, 8, 9, 63, 64, 65, 131, 132, 133, 257, 512, 600),
    max_rows=(512,),
)
# Plans a (kv dtype, heads, top-k, rows) gives: flashmla aligned and not (2), trtllm, mega,
# dispatch aligned and not, each with the three paths it may pick, its planned one among them (6).
PLANS_PER_SHAPE = 10
GLUON_SM90 = [n for n in A.PLATFORMS if "sm_90" in n and A.PLATFORMS[n][1]]


def _problems(report, limit=20) -> str:
    lines = []
    for key, problems in list(report.problems.items())[:limit]:
        lines.append(f"{key}: " + "; ".join(sorted(set(problems))[:4]))
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(A.PLATFORMS))
def test_every_launch_fits_its_metadata(name):
    """The audit of GRID on one platform table finds nothing, checks every plan it should, and the
    plans exercise what the audit models (splits, the combine, trtllm's counter, oversized steps,
    rows beyond the pool; on sm_90 each Gluon kernel, the accumulator-order partials with a short
    last block, the cluster merge, and combines of several runs or heads a program)."""
    report = A.audit_platform(name, GRID)
    assert not report.problems, f"launches that need more than the metadata reserved on {name}:\n" + _problems(report)
    shapes = len(A.KV_DTYPES) * len(GRID.heads) * len(GRID.topks) * len(GRID.rows)
    assert report.direct == report.op == shapes * PLANS_PER_SHAPE
    assert report.metadata == len(A.KV_DTYPES) * len(GRID.heads) * len(GRID.topks) * len(A.BACKENDS)
    f = report.features
    want = {"splits", "combine", "counter", "oversized", "no workspace room", "flashmla:triton", "trtllm:triton",
            "mega:triton"}
    if name in GLUON_SM90:
        want |= {"flashmla:wgmma_ws", "flashmla:wgmma_tn", "flashmla:wgmma_rr", "cluster", "native short block",
                 "combine pdl"}
        assert any(k.startswith("native ") and k[-1].isdigit() for k in f), sorted(f)
        assert any(k.startswith("combine runs ") and k != "combine runs 1" for k in f), sorted(f)
        assert any(k.startswith("combine heads ") and k != "combine heads 1" for k in f), sorted(f)
    missing = want - set(f)
    assert not missing, (f"GRID no longer makes {name} plan {sorted(missing)}: extend GRID (and the full grid of "
                         f"scripts/plan_audit.py) so that the audit still covers them; seen {sorted(f)}")


# ----------------------------------------------------------------------------------------------
# Fault injection: metadata too small for its launches is reported, by the model's accesses.

# rows up to the 8 reserved (and an oversized 64): the last row's counters and partials end the storage
SMALL = A.Grid(heads=(16, 17, 64, 96, 128), topks=(2048, 8192), rows=(1, 2, 8, 64), max_rows=(8,))


def _model_found(report) -> list[str]:
    """Problems the model of the kernels' indexing found (not graphattn's own checks' refusals)."""
    return [p for problems in report.problems.values() for p in problems
            if "OUT OF BOUNDS" in p or "outside the view" in p]


def test_the_small_grid_is_clean_before_injection():
    report = A.audit_platform(A.H200, SMALL)
    assert report.ok, _problems(report)


def _short_workspace_view(monkeypatch):
    real = A.GraphMetadata.workspace_for

    def short(self, rows, splits=None):  # one split fewer than asked (or than the pool holds)
        out, lse = real(self, rows, splits)
        return out[:, :max(out.shape[1] - 1, 0)], lse[:, :max(lse.shape[1] - 1, 0)]

    monkeypatch.setattr(A.GraphMetadata, "workspace_for", short)


def _split_plan_with(monkeypatch, **change):
    real = A.kplan.split_plan

    def smaller(path, heads, topk, platform=None, kv_fp8=False):
        plan = real(path, heads, topk, platform, kv_fp8)
        return plan._replace(**{k: f(heads) for k, f in change.items()}) if path != "mega" else plan

    monkeypatch.setattr(A.kplan, "split_plan", smaller)


# fault -> (what the model reports, past the storage too): a view short of the launch's splits stays
# inside the pool's storage; a counter a column short overruns it at the last reserved row; partials a
# head short overrun it only where a launch uses the whole pool (not at these rows)
FAULTS = {"workspace view one split short": ("ws_", False), "a counter column per 64 heads": ("counter", True),
          "workspace heads one short": ("ws_out", None)}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_audit_reports_metadata_too_small(monkeypatch, fault):
    """Each injected shortfall makes the model find accesses outside the views on the H200 table
    (where the same grid is clean without it), besides graphattn's own checks refusing them."""
    if fault == "workspace view one split short":
        _short_workspace_view(monkeypatch)
    elif fault == "a counter column per 64 heads":
        _split_plan_with(monkeypatch, counter_cols=lambda h: -(-h // 64))
    else:
        _split_plan_with(monkeypatch, workspace_heads=lambda h: max(1, h - 1))
    where, past_storage = FAULTS[fault]
    report = A.audit_platform(A.H200, SMALL)
    found = _model_found(report)
    assert not report.ok and any(where in p for p in found), (
        f"{fault}: the model found nothing; all problems:\n" + _problems(report))
    if past_storage is not None:
        assert any("OUT OF BOUNDS" in p for p in found) == past_storage, _problems(report)
    assert any("refused" in p for v in report.problems.values() for p in v), _problems(report)


@pytest.mark.parametrize("backend,heads,topk,sized_for", [("trtllm", 64, 8192, 16), ("trtllm", 129, 8192, 100),
                                                          ("flashmla", 128, 2048, 16), ("flashmla", 20, 2048, 16)])
def test_audit_reports_metadata_made_for_fewer_heads(backend, heads, topk, sized_for):
    """Metadata made by hand with ``split_plan`` of fewer heads (what the bound call's room check
    refuses since b0eaff3): the model finds the launches' partials or counters outside it."""
    with A.platform_named(A.H200) as platform:
        be = A.BACKENDS[backend](heads, topk, torch.bfloat16, platform=platform)
        sp = A.kplan.split_plan(be.kernel_spec.name, sized_for, topk, platform)
        md = A.GraphMetadata(64, heads, topk, torch.bfloat16, "meta", **sp.metadata_kwargs())
        md.mark_captured()
        report = A.Report()
        A.audit_metadata(be, md, (1, 2, 8, 33, 64), report, (A.H200, backend, "auto", heads, topk, 64))
    assert _model_found(report), _problems(report)
    assert any("room check refused" in p for v in report.problems.values() for p in v), _problems(report)


def test_model_flags_a_native_partial_one_head_short():
    """A workspace of the plan's splits but one head short: the accumulator-order store (whose
    head block is one run from its first head) reaches past the storage; the exact size does not."""
    with A.platform_named(A.H200) as platform:
        plan = A.kflashmla.plan_flashmla(8, 128, 2048, 32, True, False, platform)
        assert plan.main.kwargs.get("PARTIAL_NATIVE") and plan.combine is not None, plan
        idx = torch.empty(8, 2048, dtype=torch.int32, device="meta")
        for heads, bad in ((128, False), (127, True)):
            ws_out = torch.empty(8, plan.splits, heads, 512, device="meta")
            ws_lse = torch.empty(8, plan.splits, heads, device="meta")
            problems, _ = A.check_launch(plan, idx, None, ws_out, ws_lse)
            assert any("OUT OF BOUNDS" in p for p in problems) == bad, problems


# ----------------------------------------------------------------------------------------------
# The model against the kernels.


@pytest.mark.parametrize("R", [16, 32, 48, 64])
def test_accumulator_order_partial_covers_its_block_exactly(R):
    """The model of wgmma_ws.py:_store_partial (NATIVE) stores a block of R heads at exactly the
    offsets [0, R * 512), each once; the native combine's programs (every RUNS) load exactly those
    offsets; and each offset holds the same (head, column) for the store and the combine."""
    stored = {}
    for WG in (0, 1):
        for m in range(R):  # accumulator rows >= R hold heads >= H: masked
            for n in range(A.HALF):
                off = A.native_store_offset(m, n, R, WG)
                assert off not in stored, (R, WG, m, n)
                stored[off] = (m, WG * A.HALF + n)
    assert sorted(stored) == list(range(R * 512))
    assert A.native_store_extent(R) == R * 512
    assert sorted(A.native_head(k, R) for k in range(R)) == list(range(R))  # a permutation of the heads
    assert A.native_head_extent(R) == R
    for runs in (1, 2, 4, 8):
        loaded = {}
        for g in range(0, 512 // 8, runs):  # a program's first run
            for k in range(R):
                for c in range(8 * runs):
                    off = A.native_combine_offset(g, k, c, R)
                    assert off not in loaded, (R, runs, g, k, c)
                    loaded[off] = (A.native_head(k, R), 8 * g + c)
        assert loaded == stored, (R, runs)
        assert A.native_program_extent(R, runs) == R * 512


def _function(file: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((KERNELS / file).read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{file}: {len(found)} functions named {name}"
    return found[0]


def _assigned(fn: ast.FunctionDef, name: str, nth: int = 0) -> ast.expr:
    """The value of the ``nth`` assignment (in source order) to ``name`` in ``fn``."""
    nodes = sorted((n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign))
                    and any(isinstance(t, ast.Name) and t.id == name
                            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))),
                   key=lambda n: (n.lineno, n.col_offset))
    assert len(nodes) > nth, f"{fn.name} assigns {name!r} {len(nodes)} times; the model follows its expressions"
    return nodes[nth].value


def _eval(expr: ast.expr, **names):
    return eval(compile(ast.Expression(expr), "<kernel>", "eval"), {"tl": _Lang, "gl": _Lang, **names})


class _Lang:
    """What the kernels' index expressions use of ``tl`` / ``gl``, on torch tensors."""

    int32, int64, constexpr = torch.int32, torch.int64, object
    pid = None

    @classmethod
    def program_id(cls, axis):
        return cls.pid

    @staticmethod
    def cdiv(a, b):
        return -(-a // b)

    @staticmethod
    def minimum(a, b):
        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))

    @staticmethod
    def where(c, a, b):
        return torch.where(c, a, b)

    @staticmethod
    def arange(lo, hi, layout=None):
        return torch.arange(lo, hi)


def _kernel_function(file: str, name: str):
    """A kernel helper of pure index arithmetic, as Python over torch tensors."""
    fn = _function(file, name)
    fn.decorator_list = []
    namespace = {"gl": _Lang, "tl": _Lang}
    exec(compile(ast.fix_missing_locations(ast.Module([fn], [])), file, "exec"), namespace)
    return namespace[name]


def test_native_store_and_combine_expressions_are_the_kernels():
    """The model's offsets and bases are the kernels' own expressions, evaluated from their source:
    wgmma_ws.py's _store_partial ``off_m``, ``off_n`` and ``base``, wgmma_combine.py's _native_head
    and _flashmla_combine_native_kernel's ``c_run`` and program-id decoding; its loads add them as
    the model does (the statements quoted below)."""
    store = _function("wgmma_ws.py", "_store_partial")
    m, n = torch.arange(64)[:, None], torch.arange(A.HALF)[None, :]
    strides = (7 * 4096, 4096 + 512, 512)  # row, split, head strides of some workspace view
    for R in (16, 32, 48, 64):
        off_m, off_n = _eval(_assigned(store, "off_m"), m=m, R=R), _eval(_assigned(store, "off_n"), n=n, R=R)
        for WG in (0, 1):
            model = torch.tensor([[A.native_store_offset(i, j, R, WG) for j in range(A.HALF)] for i in range(R)])
            for wide in (1, 2):
                for row, split, hb in ((0, 0, 0), (3, 2, 1), (5, 0, 4)):
                    base = _eval(_assigned(store, "base"), dst=0, wide=wide, row=torch.tensor(row), split=split, hb=hb,
                                 BLOCK_H=64, stride_wr=strides[0], stride_ws=strides[1], stride_wh=strides[2],
                                 WG=WG, R=R, HALF=A.HALF)
                    kernel = (base + off_m + off_n)[:R]  # rows m >= R: heads >= H, masked
                    assert torch.equal(kernel, A.native_block_base(row, split, hb, strides, wide) + model), (
                        R, WG, wide, row, split, hb)
        k = torch.arange(R)
        head = _kernel_function("wgmma_combine.py", "_native_head")(k, R)
        assert head.tolist() == [A.native_head(i, R) for i in range(R)], R

    combine = _function("wgmma_combine.py", "_flashmla_combine_native_kernel")
    text = ast.unparse(combine)
    for statement in (  # the load: run + wide * s * stride_ws + k * 8 + c_run, run from the block's base
            "run = ws_out_ptr.to(gl.pointer_type(out_ptr.dtype.element_ty)) + "
            "2 * (row * stride_wr + hb * 64 * stride_wh)",
            "run = ws_out_ptr + row * stride_wr + hb * 64 * stride_wh",
            "run = run + g * 8 * R",
            "o_s = gl.load(run + gl.expand_dims(wide * s * stride_ws + k * 8, 2) + "
            "gl.expand_dims(gl.expand_dims(c_run, 0), 0)",
            "lse_s = gl.load(ws_lse_ptr + row * stride_lr + s * stride_ls + gl.expand_dims(h1, 0)",
            "h1 = hb * 64 + _native_head(k1, R)"):
        assert statement in text, f"_flashmla_combine_native_kernel changed: {statement!r}; update plan_audit's model"
    c = torch.arange(64)
    for R in (16, 48, 64):
        for runs in (1, 2, 4, 8):
            c_run = _eval(_assigned(combine, "c_run"), c=c[:8 * runs], R=R)
            assert c_run.tolist() == [A.native_combine_offset(0, 0, i, R) for i in range(8 * runs)]
    plan = _FakePlan(heads=80, combine_kwargs={"RUNS": 4})
    pid = torch.arange(3 * 2 * 16)  # 3 rows x 2 head blocks x 16 programs
    names = {"D_NOPE": 512, "RUNS": 4, "H": 80}
    names["PROGRAMS"] = _eval(_assigned(combine, "PROGRAMS"), **names)
    _Lang.pid = pid
    names["pid"] = _eval(_assigned(combine, "pid"), **names)
    for var in ("g", "n_hb", "hb", "row"):
        names[var] = _eval(_assigned(combine, var), **names)
    decoded = [A.native_combine_program(plan, int(p)) for p in pid]
    assert [tuple(int(names[v][i]) for v in ("row", "hb", "g")) for i in range(len(pid))] == decoded


class _FakeLaunch:
    def __init__(self, kwargs):
        self.kwargs = kwargs
        self.name = ""


class _FakePlan:
    """The fields of a LaunchPlan the model's program decoders read."""

    def __init__(self, heads, splits=1, main_kwargs=None, combine_kwargs=None):
        self.heads, self.splits = heads, splits
        self.main = _FakeLaunch(main_kwargs or {})
        self.combine = _FakeLaunch(combine_kwargs or {})


def test_program_id_decoding_is_the_kernels():
    """main_program and combine_program decode program ids as the kernels do: _core.py:_split_program
    (the Triton split kernels), wgmma.py:_program_split (the Gluon kernels, with and without a
    cluster), mega.py:_mega_kernel and flashmla.py:_flashmla_combine_kernel (one or several heads a
    program); trtllm's counter is ``row * stride_cr + hb``."""
    H, BLOCK_H, splits, rows = 40, 16, 3, 4
    hbk = -(-H // BLOCK_H)
    pid = torch.arange(rows * splits * hbk)
    _Lang.pid = pid
    core = _function("_core.py", "_split_program")
    names = {"H": H, "BLOCK_H": BLOCK_H, "num_splits": splits}
    names["pid"] = _eval(_assigned(core, "pid"), **names)
    for var in ("head_blocks", "hb", "split", "row"):
        names[var] = _eval(_assigned(core, var), **names)
    plan = _FakePlan(H, splits, {"BLOCK_H": BLOCK_H})
    want = [A.main_program(plan, int(p)) for p in pid]
    assert [(int(names["row"][i]), int(names["split"][i]), int(names["hb"][i])) for i in range(len(pid))] == want

    program_split = _kernel_function("wgmma.py", "_program_split")
    for cluster in (0, 2):
        n = splits if not cluster else cluster
        _Lang.pid = torch.arange(rows * n * hbk)
        hb, split, row, *_ = program_split(H, 2048, 64, n, BLOCK_H, 64, cluster)
        plan = _FakePlan(H, n, {"BLOCK_H": BLOCK_H, "CLUSTER": cluster})
        want = [A.main_program(plan, p) for p in range(rows * n * hbk)]
        assert list(zip(row.tolist(), split.tolist(), hb.tolist())) == want, cluster

    mega = _function("mega.py", "_mega_kernel")
    _Lang.pid = torch.arange(rows * hbk)
    names = {"H": H, "BLOCK_H": BLOCK_H}
    names["pid"] = _eval(_assigned(mega, "pid"), **names)
    for var in ("head_blocks", "hb", "row"):
        names[var] = _eval(_assigned(mega, var), **names)
    plan = _FakePlan(H, 1, {"BLOCK_H": BLOCK_H})
    assert list(zip(names["row"].tolist(), names["hb"].tolist())) == [
        A.main_program(plan, p)[::2] for p in range(rows * hbk)]

    trtllm = _function("trtllm.py", "_trtllm_kernel")
    ctr = _eval(_assigned(trtllm, "ctr"), counter_ptr=0, row=torch.tensor(5), stride_cr=7, hb=3)
    assert int(ctr) == 5 * 7 + 3  # the model's counter access: row * stride(0) + head block

    combine = _function("flashmla.py", "_flashmla_combine_kernel")
    for heads_per_program, nth in ((1, 0), (4, 1)):  # the HEADS == 1 branch, then the other
        plan = _FakePlan(H, combine_kwargs={"HEADS": heads_per_program})
        for p in range(rows * -(-H // heads_per_program)):
            names = {"H": H, "HEADS": heads_per_program, "pid": torch.tensor(p)}
            if nth:
                names["n_hg"] = _eval(_assigned(combine, "n_hg"), **names)
            h = _eval(_assigned(combine, "h", nth), **names)
            row = _eval(_assigned(combine, "row", nth), **names)
            first = int(h) if heads_per_program == 1 else int(h[0])
            assert (int(row), first) == A.combine_program(plan, p), (heads_per_program, p)


@pytest.mark.parametrize("backend,heads,rows,aligned", [("flashmla", 17, 2, True), ("flashmla", 33, 3, False),
                                                        ("trtllm", 17, 2, True), ("trtllm", 1, 3, True)])
@pytest.mark.parametrize("call", ["bound call", "custom op"])
def test_interpreted_kernels_write_what_the_model_says(cpu_platform, backend, heads, rows, aligned, call):
    """The Triton kernels, run under the interpreter on a NaN-filled workspace pool, write exactly
    the partials and lse's the model says: the span it predicts from its first to its last
    element, every element of each (row, split, head) partial and nothing else; the combine's
    reads are that span too, and trtllm leaves its counters zero."""
    from graphattn.backends.flashmla import FlashMLABackend
    from graphattn.backends.trtllm import TrtllmBackend

    topk, pool = 48, 40
    be = (FlashMLABackend if backend == "flashmla" else TrtllmBackend)(heads, topk, torch.float16)
    md = be.make_metadata(4)
    idx = torch.randint(0, pool, (rows, topk), dtype=torch.int32)
    be.plan(md, idx)
    q = torch.randn(rows, heads, 576, dtype=torch.float16)
    kv = torch.randn(pool, 576, dtype=torch.float16)
    if not aligned:  # rows 577 elements apart: not 16-byte aligned (flashmla's heads-major tiles)
        kv = torch.randn(pool * 577, dtype=torch.float16).as_strided((pool, 576), (577, 1))
    assert A.kflashmla.aligned_16(q, kv) == aligned
    spec = be.kernel_spec
    if call == "bound call":
        plan = be.launch_plan(md, rows, aligned)
        args = be._fixed_args(md, rows, plan.workspace_splits, spec)
    else:
        args = be._fixed_args(md, rows, None, spec)
        plan = A.op_plan(be, spec.name, rows, aligned, args[-2].shape[1])
    assert plan.splits > 1, plan  # the interpreter's table splits these shapes
    md.workspace_out.tensor.fill_(float("nan"))
    md.workspace_lse.tensor.fill_(float("nan"))
    if call == "bound call":
        be.forward(q, kv, md)
        key = (be, rows, aligned if be._alignment else True)
        assert md.bound_call(key, lambda: None) is not None  # forward ran (and kept) the bound call
    else:
        spec.op(q, kv, *args)
    _, accesses, _ = A.model_launch(plan, args[0], args[2] if spec.uses_counter else None, *args[-2:])
    spans = {what: (lo, hi) for what, _, lo, hi in accesses}
    for buffer, view, what in ((md.workspace_out, args[-2], "ws_out partials (head-major)"),
                               (md.workspace_lse, args[-1], "ws_lse partials")):
        written = ~buffer.tensor.isnan().flatten()
        where = written.nonzero().flatten()
        assert (int(where[0]), int(where[-1]) + 1) == spans[what], (what, spans)
        expected = torch.zeros_like(written)  # the launch's splits of the view it was passed
        expected.as_strided(view.shape, view.stride(), view.storage_offset())[:, :plan.splits] = True
        assert torch.equal(written, expected), what
    if spec.name == "flashmla":
        assert spans["ws_out reads of the combine"] == spans["ws_out partials (head-major)"]
        assert spans["ws_lse reads of the combine"] == spans["ws_lse partials"]
    else:
        assert not md.counter.tensor.any()
    assert not A.check_accesses(accesses)


def test_cli_quick_run(capsys):
    """The command line: a quick run of one platform exits 0 and says so; an unknown platform is
    refused."""
    assert A.main(["--quick", "--platforms", "interpreter", "--backends", "trtllm,flashmla", "--kv", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "NO MISMATCH" in out and "interpreter (CPU) kv=fp8" in out, out
    with pytest.raises(SystemExit):
        A.main(["--platforms", "no such platform"])
