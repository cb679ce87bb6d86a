"""Every kernel, with every launch setting the cuda and hip config modules can choose, compiles
ahead of time for sm_90, gfx942 and gfx950 (no GPU needed).

The compile runs in a subprocess with ``TRITON_INTERPRET=0``: in this process the kernels may be
interpreter wrappers (no GPU), which cannot be compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942", "gfx950"])
def test_every_kernel_compiles_ahead_of_time(target):
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "graphattn.kernels.aot", "--targets", target, "--jobs", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failures = [r for r in records if r.get("ok") is False]
    assert not failures, "AOT compile failed:\n" + "\n".join(
        f"{r['kernel']} {r['target']} {r['constexprs']} {r['options']}: {r['error']}" for r in failures
    )
    assert proc.returncode == 0, f"aot exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    summary = records[-1]
    compiled = {r["kernel"] for r in records if r.get("ok")}
    expected = {"flashmla_split", "flashmla_combine", "trtllm", "mega"}
    if target == "sm90":  # flashmla's Gluon kernel: Hopper only, with a triton that has Gluon
        from graphattn.cuda.configs import gluon_available

        expected |= ({"flashmla_wgmma_ws", "flashmla_wgmma_tn", "flashmla_wgmma_rr", "flashmla_combine_native"}
                     if gluon_available() else set())
    assert compiled == expected, f"{target}: {compiled}"
    assert summary["failed"] == 0 and summary["compiled"] >= 4, summary
    # Every attention kernel also compiled reading 656-byte FP8 tokens, in the target's format.
    from graphattn.kernels.aot import fp8_code

    fp8 = {(r["kernel"], r["constexprs"]["KV_FP8"]) for r in records if r.get("ok") and r["constexprs"].get("KV_FP8")}
    code = 2 if target == "gfx942" else 1  # e4m3fnuz on gfx942, e4m3fn on sm_90 and gfx950
    assert fp8_code(target) == code
    gluon_fp8 = {"flashmla_wgmma_ws", "flashmla_wgmma_tn"} & expected
    assert fp8 == {(k, code) for k in {"flashmla_split", "trtllm", "mega"} | gluon_fp8}, f"{target}: FP8 compiles {fp8}"


@pytest.mark.parametrize("target", ["sm90", "gfx942", "gfx950"])
def test_aot_jobs_compile_each_setting_as_it_runs(target):
    """Every config's own constexprs (IDX_AHEAD, KV_MAJOR, ...) reach the compile unchanged,
    for plain kv and, on the paths that read them, with the settings given to FP8 tokens."""
    from graphattn.kernels import aot
    from graphattn.kernels.plan import launch_parts

    compiled = {(k, json.dumps({**m, **o}, sort_keys=True)) for k, _, m, o, _ in aot.jobs([target])}
    # each setting is some kernel's of its path: one skipped below by every kernel would be
    # compiled by none (a misspelt constexpr)
    for path in {p for _, _, p in aot.KERNELS.values()}:
        kernels = [k for k, (_, _, p) in aot.KERNELS.items() if p == path and aot.runs_on(k, target)]
        for kv_fp8 in (False, True):
            for cfg in aot._configs(path, target, kv_fp8=kv_fp8):
                taken = any(aot._takes(aot._arg_names(k), cfg) for k in kernels)
                assert taken, f"{target} {path}: setting {cfg} is no kernel's"
    for kernel, (_, _, path) in aot.KERNELS.items():
        if not aot.runs_on(kernel, target):
            continue  # no setting of the target runs it (flashmla's native combine off sm_90)
        fp8_kernel = kernel in ("flashmla_split", "flashmla_wgmma_ws", "flashmla_wgmma_tn", "trtllm", "mega")
        layouts = (False, True) if fp8_kernel else (False,)
        for kv_fp8 in layouts:
            for cfg in aot._configs(path, target, kv_fp8=kv_fp8):
                if cfg.get("kernel") != aot._KERNEL_KEY.get(kernel) or not aot._takes(aot._arg_names(kernel), cfg):
                    continue  # another function of the same path runs this setting (RUNS: the native combine)
                meta, opts = launch_parts(cfg)
                hits = [key for k, key in compiled if k == kernel
                        and {**meta, **opts}.items() <= json.loads(key).items()
                        and bool(json.loads(key).get("KV_FP8")) == kv_fp8]
                assert hits, f"{target} {kernel}: setting {cfg} (kv_fp8={kv_fp8}) is not compiled as configured"


PTXAS_SAMPLE = """ptxas info    : Compiling entry function '_trtllm_kernel' for 'sm_90a'
ptxas info    : Function properties for _trtllm_kernel
    800 bytes stack frame, 916 bytes spill stores, 832 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 800 bytes cumulative stack size
"""


def test_ptxas_report_is_parsed():
    from graphattn.kernels.aot import parse_ptxas_usage

    assert parse_ptxas_usage(PTXAS_SAMPLE) == {"stack": 800, "spill_stores": 916, "spill_loads": 832,
                                               "registers": 255}
    assert parse_ptxas_usage("ptxas fatal   : Unsupported .version 9.4") is None


@pytest.mark.slow
def test_aot_reports_registers_and_spills_of_an_sm90_kernel():
    """``--ptxas``: one sm_90 compile carries what ``ptxas -v`` said (the FP8 tiles' spills were
    found this way: 255 registers and ~800 bytes of spills per thread at 32 heads x 32 tokens)."""
    code = ("import json; from graphattn.kernels import aot; "
            "job = next(j for j in aot.jobs(['sm90']) if j[0] == 'trtllm'); "
            "print(json.dumps(aot.compile_one(job, usage=True)))")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["ok"], record
    usage = record["ptxas"]
    if usage is None:
        pytest.skip("no ptxas bundled with this triton accepts its PTX")
    assert 0 < usage["registers"] <= 255 and usage["spill_stores"] >= 0, usage


# The Gluon split kernels' launches whose spills the test below bounds: wgmma_ws with bf16 kv and FP8
# tokens, wgmma_rr, and wgmma_tn's raw tile (FP8 tokens at 16 heads) and in-place tiles (32 heads).
_SPILL_CASES = ("(k == 'flashmla_wgmma_ws' and not (c.get('DIRECT') or c.get('CLUSTER') or c.get('PARTIAL_NATIVE'))) "
                "or (k == 'flashmla_wgmma_rr' and c.get('IDX_EARLY') and not c.get('DIRECT')) "
                "or (k == 'flashmla_wgmma_tn' and c.get('KV_FP8') and not c.get('DIRECT') and not c.get('RING'))")


@pytest.mark.slow
def test_gluon_split_kernels_spill_little_under_this_triton():
    """wgmma_ws (bf16 kv and FP8 tokens), wgmma_rr and wgmma_tn's FP8 tiles: ptxas spills at most
    128 B a thread under the installed triton. Under triton 3.9 the indices the kernels hide from
    the compiler were folded (graphattn.kernels.wgmma._OPAQUE_ZERO): wgmma_ws spilled 240-416 B,
    wgmma_tn's raw tile 88-100; under 3.6 every one is 0-60 B."""
    from graphattn.cuda.configs import gluon_available

    if not gluon_available():
        pytest.skip("this triton has no Gluon")
    code = ("import json; from graphattn.kernels import aot; "
            "cases = lambda k, c: " + _SPILL_CASES + "; "
            "jobs = [j for j in aot.jobs(['sm90']) if j[4] == 'bf16' and cases(j[0], j[2])]; "
            "print(json.dumps([aot.compile_one(j, usage=True) for j in jobs]))")
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(proc.stdout.strip().splitlines()[-1])
    kinds = {(r["kernel"], r["constexprs"].get("KV_FP8", 0), r["constexprs"].get("RAW_TILE", 0)) for r in records}
    assert {("flashmla_wgmma_ws", 0, 0), ("flashmla_wgmma_ws", 1, 0), ("flashmla_wgmma_rr", 0, 0),
            ("flashmla_wgmma_tn", 1, 1), ("flashmla_wgmma_tn", 1, 0)} <= kinds, kinds
    for record in records:
        assert record["ok"], record
        if record["ptxas"] is None:
            pytest.skip("no ptxas bundled with this triton accepts its PTX")
        assert record["ptxas"]["spill_stores"] <= 128, (record["kernel"], record["constexprs"], record["ptxas"])


def _swizzled_chunk(row: int, col: int, element_bytes: int) -> int:
    """The 16-byte bank group of element ``(row, col)`` of an NVMMA tile with the 128-byte swizzle
    (``element_bytes`` 1: the FP8 bytes, 2: the dequantised values): chunk ``c`` of a row's
    128-byte line is stored at ``c ^ (row % 8)``."""
    return ((col * element_bytes) % 128 // 16) ^ (row % 8)


def _layout_element(bases: dict, index: int) -> tuple[int, int]:
    """The ``(row, col)`` that a DistributedLinearLayout (``bases``: its reg, lane and warp bases
    over ``[rows, cols]``) gives the bits of ``index`` (register bits first, then lane, then warp)."""
    row = col = 0
    for i, (r, c) in enumerate(bases["reg"] + bases["lane"] + bases["warp"]):
        if index >> i & 1:
            row, col = row ^ r, col ^ c
    return row, col


def _layout_elements(bases: dict) -> set[tuple[int, int]]:
    """Every ``(row, col)`` that the layout ``bases`` gives some register, lane and warp."""
    n_bits = len(bases["reg"]) + len(bases["lane"]) + len(bases["warp"])
    return {_layout_element(bases, index) for index in range(1 << n_bits)}


def _lane_conflicts(bases: dict, element_bytes: int, access_bytes: int = 16) -> int:
    """The worst n-way bank conflict of an ``access_bytes`` shared access (``access_bytes /
    element_bytes`` values a lane, the register bases' first ones) by ``bases`` (a
    DistributedLinearLayout's reg, lane and warp bases over ``[rows, cols]``) to an NVMMA tile
    with the 128-byte swizzle, which shared memory serves 128 bytes at a time (8 lanes of 16-byte
    accesses, 16 of 8-byte ones): the most distinct 128-byte lines that one 4-byte bank serves."""
    reg_bits, lane_bits = len(bases["reg"]), len(bases["lane"])
    vec_bits = (access_bytes // element_bytes).bit_length() - 1
    lanes = 128 // access_bytes
    worst = 0
    for warp in range(1 << len(bases["warp"])):
        for reg in range(0, 1 << reg_bits, 1 << vec_bits):
            index = reg | warp << (reg_bits + lane_bits)
            for first in range(0, 32, lanes):
                banks: dict[int, set] = {}
                for lane in range(first, first + lanes):
                    row, col = _layout_element(bases, index | lane << reg_bits)
                    line = (row, col * element_bytes // 128)
                    bank = _swizzled_chunk(row, col, element_bytes) * 4 + col * element_bytes % 16 // 4
                    for b in range(bank, bank + access_bytes // 4):
                        banks.setdefault(b, set()).add(line)
                worst = max(worst, max(len(lines) for lines in banks.values()))
    return worst


def _gluon_json(code: str):
    """What ``code`` prints as its last line, parsed as JSON, run in a fresh process that imports
    Gluon (``TRITON_INTERPRET=0``: this process's triton may be the interpreter's); skips where
    this triton has no Gluon."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    from graphattn.cuda.configs import gluon_available

    if proc.returncode != 0 and not gluon_available():
        pytest.skip("this triton has no Gluon")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _accumulator_f32_conflicts(vec: int, per_phase: int, max_phase: int, width: int, cols: int) -> int:
    """The worst n-way bank conflict of a wgmma accumulator's 8-byte f32 accesses (lane ``l``: row
    ``l // 4`` (+ 8), columns ``8 j + 2 (l % 4)`` and the next) to a ``[rows, width]`` f32 buffer
    of a SwizzledSharedLayout (group ``c // vec`` of row ``r`` stored at ``(c // vec) ^ (r //
    per_phase % max_phase)``), over its first ``cols`` columns; 8-byte accesses are served 16 lanes
    at a time (128 bytes)."""
    worst = 0
    for j in range(cols // 8):
        for upper in (0, 8):
            for half in (0, 16):
                words = {}
                for lane in range(half, half + 16):
                    row, col = lane // 4 + upper, 8 * j + 2 * (lane % 4)
                    group = (col // vec) ^ (row // per_phase % max_phase)
                    word = row * width + group * vec + col % vec
                    for w in (word, word + 1):
                        words.setdefault(w % 32, set()).add(w)
                worst = max(worst, max(len(ws) for ws in words.values()))
    return worst


def test_merge_staging_layout_does_not_conflict_in_shared_memory():
    """F32_STAGE (wgmma_ws: every merge's f32 staging in shared memory: wgmma_tn's two consumers,
    wgmma_rr's and wgmma_ws's cluster merges) takes the wgmma accumulator's 8-byte stores and
    loads without bank conflicts, at 16 and 32 heads over 128-byte rows (wgmma_tn) and over
    1 KB rows (the cluster merges' 256 columns); the layouts it replaced were 4-way (8-byte
    groups) and 2-way (16-byte groups) conflicted."""
    code = ("import json; from graphattn.kernels import wgmma_ws as w; l = w.F32_STAGE.value; "
            "print(json.dumps(dict(vec=l.vec, per_phase=l.per_phase, max_phase=l.max_phase, order=list(l.order))))")
    stage = _gluon_json(code)
    assert stage.pop("order") == [1, 0], "rows contiguous"
    for width, cols in ((32, 16), (32, 32), (256, 256)):
        assert _accumulator_f32_conflicts(2, 1, 8, width, cols) == 4  # the model sees the old layouts
        assert _accumulator_f32_conflicts(4, 1, 4, width, cols) == 2
        assert _accumulator_f32_conflicts(**stage, width=width, cols=cols) == 1, (stage, width, cols)


def test_fp8_dequantisation_layouts_do_not_conflict_in_shared_memory():
    """DEQ_32 / DEQ_64 (wgmma_dequant: every Gluon FP8 dequantisation) cover a [rows, 128] scale block
    once and read its FP8 bytes and write its values without shared-memory bank conflicts under
    the 128-byte swizzle; the BlockedLayout they replaced wrote its values 2-way conflicted (twice
    the ideal wavefronts in Nsight Compute on the H200, docs/benchmarks.md)."""
    code = ("import json; from graphattn.kernels import wgmma_dequant as w; "
            "print(json.dumps({n: dict(reg=l.reg_bases, lane=l.lane_bases, warp=l.warp_bases, shape=l.shape) "
            "for n, l in (('DEQ_32', w.DEQ_32.value), ('DEQ_64', w.DEQ_64.value))}))")
    layouts = _gluon_json(code)
    blocked_32 = dict(reg=[[0, 1], [0, 2], [0, 4], [0, 8], [16, 0]], lane=[[0, 16], [0, 32], [0, 64], [1, 0], [2, 0]],
                      warp=[[4, 0], [8, 0]], shape=[32, 128])
    assert _lane_conflicts(blocked_32, 2) == 2 and _lane_conflicts(blocked_32, 1) == 1  # the model sees it
    for name, bases in layouts.items():
        rows, cols = bases["shape"]
        assert cols == 128 and rows in (32, 64), name
        assert _layout_elements(bases) == {(r, c) for r in range(rows) for c in range(cols)}, \
            f"{name} does not cover the block once"
        assert _lane_conflicts(bases, 1) == 1, f"{name}: its FP8 byte loads conflict"
        assert _lane_conflicts(bases, 2) == 1, f"{name}: its stores of dequantised values conflict"


def test_raw_tile_register_loads_do_not_conflict_in_shared_memory():
    """REGS_LOAD (wgmma_tn's raw tile: a scale block of a tile's FP8 bytes loaded into the
    scores' A registers) covers a [64, 128] block once and reads it with 16-byte loads without
    bank conflicts under the 128-byte swizzle; the model's 8-byte accesses see a layout whose 16
    lanes read rows 0-15 of one column 2-way conflicted (rows r and r + 8 share a swizzled chunk)."""
    code = ("import json; from graphattn.kernels import wgmma_tn as w; l = w.REGS_LOAD.value; "
            "print(json.dumps(dict(reg=l.reg_bases, lane=l.lane_bases, warp=l.warp_bases, shape=l.shape)))")
    bases = _gluon_json(code)
    rows, cols = bases["shape"]
    assert _layout_elements(bases) == {(r, c) for r in range(rows) for c in range(cols)}
    assert _lane_conflicts(bases, 1) == 1, "REGS_LOAD's FP8 byte loads conflict"
    rows_down = dict(reg=[[0, 1], [0, 2], [0, 4]], lane=[[1, 0], [2, 0], [4, 0], [8, 0], [16, 0]],
                     warp=[[32, 0], [0, 8]], shape=[64, 16])
    assert _lane_conflicts(rows_down, 1, access_bytes=8) == 2


def test_raw_tile_v_stores_do_not_conflict_in_shared_memory():
    """The raw tile's consumers store each scale block's dequantised values (REGS_LOAD's layout,
    16-bit) into their V tile with the columns in V_TILE_ORDER: 16-byte stores without bank
    conflicts, a block's columns covered once; in the value's own order they were 2-way
    conflicted (lanes 0-3's columns 0 and 64 lie in two 128-byte lines at the same chunk),
    which cost 3% at 16 heads × 512 rows (docs/benchmarks.md). _v_column, which maps the output
    rows back at the store, is the order's inverse."""
    code = ("import json; from graphattn.kernels import wgmma_tn as w; l = w.REGS_LOAD.value; "
            "print(json.dumps(dict(reg=l.reg_bases, lane=l.lane_bases, warp=l.warp_bases, shape=l.shape, "
            "order=list(w.V_TILE_ORDER), v_column=[w._v_column.fn(i) for i in range(512)])))")
    bases = _gluon_json(code)
    order = bases.pop("order")
    v_column = bases.pop("v_column")  # _v_column's integer arithmetic, run on Python ints
    sizes = [2, 2, 2, 2, 8]  # the reshape of a block's 128 columns: bits 6, 5, 4, 3, 0-2
    assert sorted(order) == list(range(6)) and order[0] == 0 and order[-1] == 5, "rows and bits 0-2 stay"

    def stored(col):
        digits, shift = [], 7
        for size in sizes:
            shift -= size.bit_length() - 1
            digits.append(col >> shift & size - 1)
        out = 0
        for dim in order[1:]:
            out = out << (sizes[dim - 1].bit_length() - 1) | digits[dim - 1]
        return out

    assert _lane_conflicts(bases, 2) == 2, "the model sees the values' own order conflict"
    permuted = dict(bases, **{k: [[r, stored(c)] for r, c in bases[k]] for k in ("reg", "lane", "warp")})
    assert _layout_elements(permuted) == {(r, c) for r in range(64) for c in range(128)}
    assert _lane_conflicts(permuted, 2) == 1, "the V stores conflict"
    assert all(v_column[128 * block + stored(c)] == 128 * block + c for block in range(4) for c in range(128)), \
        "_v_column does not map the V tile's columns back"
