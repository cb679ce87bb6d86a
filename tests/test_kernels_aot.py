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
