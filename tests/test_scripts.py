"""The diagnostic scripts that docs/benchmarks.md cites and that patch kernel source: they must
still apply to the kernels as committed (they run only on a GPU, so a CPU test keeps them honest).
"""
import csv
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name):
    if str(ROOT / "scripts") not in sys.path:  # as when run: a script's folder is on sys.path
        sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["ws_probe", "rr_probe"])
def test_probe_hooks_every_milestone_once(name):
    """ws_probe (wgmma_ws) and rr_probe (wgmma_rr) still find each anchor exactly once, and every
    milestone they name gets a stamp."""
    call = "_probe(ws_out_ptr, out_ptr, DIRECT, "
    probe = _load(name)
    src = probe.instrumented_source()  # asserts each anchor is in the kernel exactly once
    compile(src, f"{name}.py", "exec")
    calls = [line.strip() for line in src.splitlines() if line.strip().startswith(call)]
    assert len(calls) == len(probe.BEFORE) + len(probe.AFTER), calls
    slots = set()
    for line in calls:  # "_probe(..., 21)" or "_probe(..., WG * 10 + 3)" (both consumers)
        arg = line[len(call):-1]
        slots |= {int(arg.split("+")[1]), 10 + int(arg.split("+")[1])} if "WG" in arg else {int(arg)}
    assert set(probe.NAMES) <= slots, sorted(set(probe.NAMES) - slots)


@pytest.mark.slow
@pytest.mark.parametrize("name,kernel,module", [("ws_probe", "flashmla_wgmma_ws", "wsprobe"),
                                                ("rr_probe", "flashmla_wgmma_rr", "rrprobe"),
                                                ("rr_waits", "flashmla_wgmma_rr", "rrwaits"),
                                                ("ws_waits", "flashmla_wgmma_ws", "wswaits")])
def test_instrumented_probe_kernels_compile_for_sm90(name, kernel, module):
    """The probes' instrumented kernels compile for sm_90 as a launch with splits runs them (no GPU):
    each hook sits in a function that has the probe's arguments (a hook in one that lacks them,
    as ws_probe's merged-sums hook once was, fails here rather than on the device)."""
    from graphattn.cuda.configs import gluon_available

    if not gluon_available():
        pytest.skip("this triton has no Gluon")
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "scripts")!r})
import {name} as probe
from graphattn.kernels import aot
probe.load_module(probe.instrumented_source(), {module!r})
aot.KERNELS[{kernel!r}] = ("graphattn.kernels.{module}",) + aot.KERNELS[{kernel!r}][1:]
job = next(j for j in aot.jobs(["sm90"]) if j[0] == {kernel!r} and j[4] == "bf16"
           and j[2].get("PARTIAL_NATIVE") and not j[2].get("KV_FP8"))
job = (job[0], job[1], {{**job[2], "DIRECT": False}}, job[3], job[4])
try:
    ptx = aot.compile_job(job).asm["ptx"]
    rec = {{"ok": True, "error": None, "stamps": ptx.count("globaltimer")}}
except Exception as exc:  # the compiler's message, for the assertion below
    rec = {{"ok": False, "error": f"{{type(exc).__name__}}: {{exc}}"[:2000], "stamps": 0}}
print(json.dumps(rec))
"""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    rec = json.loads(lines[-1])
    assert rec["ok"], rec["error"]
    probe = _load(name)  # every milestone's globaltimer read is in the PTX (rr_waits: each partition's)
    assert rec["stamps"] >= len(getattr(probe, "NAMES", None) or probe.BASES), rec


def _stamp_lines(src: str) -> list[str]:
    """The wait probes' stamp stores in an instrumented source (``_put(..., r, slot, value)``)."""
    return [line.strip() for line in src.splitlines() if line.strip().startswith("_put(ws_out_ptr, out_ptr, DIRECT, r, ")]


def test_rr_waits_times_every_wait_of_both_consumers_and_the_producer():
    """rr_waits still finds every wait of wgmma_rr: per round each consumer stamps its start and
    times its two halves, its scores' wgmma, the other's max and P and its P V wgmmas; the
    producer stamps its start and times each free wait and each gather call (both of its paths,
    with and without early indices), each into its own slot."""
    waits = _load("rr_waits")
    src = waits.instrumented_source()
    compile(src, "rr_waits.py", "exec")
    puts = _stamp_lines(src)
    slots = [line.split(", r, ")[1].split(",")[0] for line in puts]
    consumer = {f"WG * 10 + {i}" for i in range(len(waits.CONSUMER))} | {f"WG * 10 + {waits.CLOCK}",
                                                                        f"WG * 10 + {waits.TIMER}"}
    base = waits.BASES["producer"]
    producer = ({str(base + i) for i in range(len(waits.PRODUCER))}
                | {f"{base} + {waits.CLOCK}", f"{base} + {waits.TIMER}"})
    assert set(slots) == consumer | producer, sorted(set(slots) ^ (consumer | producer))
    # consumers: 2 stamps + 4 halves + scores + 4 exchanges + 4 P V waits; producer: 2 + 2 paths x 4 x 2
    assert len(puts) == 15 + 18, len(puts)
    assert src.count("mbarrier.wait(free.index(") == 8  # the explicit ones (_gather_half waits on its own `free`)
    assert max(base + waits.TIMER, 10 + waits.TIMER) < waits.SLOTS


def test_ws_waits_times_each_step_of_a_pair_of_tiles():
    """ws_waits still finds wgmma_ws's steps: per pair of tiles each consumer times the other's
    tile landing, its half dequantised and its P (inside _other_tile, which gets the stamps'
    arguments at both calls), its own tile landing (FP8 before its half's dequantisation, bf16
    before its scores), its half, the other's half of it, the other's P V, its scores and its own
    tile; the producer each slot's free wait and copies; every slot a label's, and the last other
    tile after the loop stores nothing (a round past those kept)."""
    waits = _load("ws_waits")
    src = waits.instrumented_source()
    compile(src, "ws_waits.py", "exec")
    puts = _stamp_lines(src)
    slots = {line.split(", r, ")[1].rsplit(", ", 1)[0] for line in puts}
    consumer = {f"WG * 12 + {i}" for i in range(len(waits.CONSUMER) + 2)}
    producer = {"24 + j % 2", "26 + j % 2", f"24 + {waits.CLOCK}", f"24 + {waits.CLOCK + 1}"}
    assert slots == consumer | producer, sorted(slots ^ (consumer | producer))
    assert src.count("fp8, ws_out_ptr, out_ptr, DIRECT, r)") == 2  # both calls of _other_tile
    assert src.count("fp8, ws_out_ptr, out_ptr, DIRECT: gl.constexpr, r):") == 1  # and its signature
    assert f"        r = {waits.NOWHERE}\n" in src and waits.NOWHERE >= waits.ROUNDS
    assert "_dequantise_mine(t," not in src  # replaced by its timed steps
    assert src.count(f"WG * 12 + {waits.CLOCK}, _clk())") == 2  # round 0 (consumer 0's tile 0) and the loop's
    assert max(waits.BASES.values()) + waits.CLOCK + 1 < waits.SLOTS


def test_rr_waits_report_reads_wrapped_32_bit_clocks(capsys):
    """rr_waits' report: waits in us a round at the clock the stamps measure, round 0 apart, with
    %clock and %globaltimer_lo wrapping past 2**32 between rounds."""
    import torch

    waits = _load("rr_waits")
    programs, rounds, ghz = 3, 5, 1.5
    p = torch.zeros(programs, waits.ROUNDS, waits.SLOTS, dtype=torch.int64)
    for name, base in waits.BASES.items():
        for r in range(rounds):  # a round is 4 us: 6000 cycles; both counters start near their wrap
            p[:, r, base + waits.CLOCK] = (2**32 - 9000 + 6000 * r) % 2**32
            p[:, r, base + waits.TIMER] = (2**32 - 7000 + 4000 * r) % 2**32
        p[:, 0, base] = 3000  # round 0: 2 us on the first wait
        p[:, 1:rounds, base] = 1500  # then 1 us a round
        p[:, 1:rounds, base + 1] = 750
    waits.report(p, rounds)
    out = capsys.readouterr().out
    assert "consumer 0: round 0 4.000 us, a steady round 4.000 us" in out and "clock 1.50 GHz" in out, out
    assert "first half        1.000   1.000 |   2.000" in out, out
    assert "free k1 R         0.500   0.500 |   0.000" in out, out


def test_rr_probe_tells_what_a_finish_follows(capsys):
    """rr_probe --spread: when the finish times move with the rows' tokens, the "same tokens"
    correlation is 1 and the "same program" one is not; the by-SM view reads ``%smid``'s slot
    (31) and the first start (20)."""
    import torch

    probe = _load("rr_probe")
    rows, hb = 40, 2
    slow = torch.rand(rows, dtype=torch.float64) * 5  # a row's tokens' extra time, us
    progs = rows * hb

    def stamps(tokens_of_row, sms):
        p = torch.zeros(progs, 64, dtype=torch.float64)
        p[:, 20] = 1000.0
        p[:, 15] = 1000.0 + 60e3 + 1e3 * slow[tokens_of_row].repeat_interleave(hb)
        p[:, 31] = sms
        return p

    rows_ = torch.arange(rows)
    p1 = stamps(rows_, torch.arange(progs))
    p2 = stamps((rows_ - probe.SHIFT) % rows, torch.randperm(progs))  # the index rows rolled
    probe.follows(p1, p2, rows)
    line = capsys.readouterr().out
    assert "the same tokens 1.00" in line and "the same program 1.00" not in line, line
    probe.by_sm(p1, hb)
    assert "SMs 0-15: 16 programs" in capsys.readouterr().out


def test_flashmla_ab_variants_and_ptx_rewrite(monkeypatch):
    """flashmla_ab's variant strings become launch-table overrides, and its PTX rewrites give
    every cp.async copy the L2 prefetch size or an eviction policy, in a Triton cache folder of
    their own."""
    from triton import knobs

    ab = _load("flashmla_ab")
    assert ab.parse_variant("base") == {}
    assert ab.parse_variant("L2_PREFETCH=1,max_splits=2") == {"L2_PREFETCH": 1, "max_splits": 2}
    assert ab.parse_variant("kernel=wgmma_rr,BLOCK_N=128,X=-1") == {"kernel": "wgmma_rr", "BLOCK_N": 128, "X": -1}
    monkeypatch.setenv("TRITON_CACHE_DIR", "/nonexistent/cache")
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", None)
    ab._l2_prefetch_ptx(256)
    cache = os.environ["TRITON_CACHE_DIR"]
    assert cache != "/nonexistent/cache" and os.path.isdir(cache)
    os.rmdir(cache)  # empty: nothing compiled
    ptx = ("\tcp.async.cg.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x10, %r2;\n"
           "\tcp.async.mbarrier.arrive.noinc.shared.b64 [ %r3 + 0 ];\n")
    stages = {"ptx": lambda src, metadata: ptx}
    knobs.runtime.add_stages_inspection_hook(None, stages, None, None, None)
    out = stages["ptx"]("", {})
    assert "cp.async.cg.shared.global.L2::256B [ %r1 + 0 ]" in out
    assert "cp.async.mbarrier.arrive.noinc.shared.b64 [" in out  # only the copies
    assert knobs.runtime.add_stages_inspection_hook() == ("l2_prefetch_256", "l2_prefetch_256")  # triton 3.9's key
    # PTX_EVICT: each copy gets a policy made just before it (no register live across the kernel)
    ptx_regs = "\t.reg .b64 \t%rd<9>;\n" + ptx
    out = ab.evict_ptx(ptx_regs, "last")
    assert ".reg .b64 \t%evpol;" in out
    assert ("createpolicy.fractional.L2::evict_last.b64 \t%evpol, 1.0;\n\t"
            "cp.async.cg.shared.global.L2::cache_hint [ %r1 + 0 ], [ %rd1 + 0 ], 0x10, %r2, %evpol;") in out
    assert "cp.async.mbarrier.arrive.noinc.shared.b64 [ %r3 + 0 ];" in out
    assert ab.evict_ptx("\tmov.u32 %r1, 0;\n", "first") == "\tmov.u32 %r1, 0;\n"  # no copies: unchanged
    ab.apply_script_settings({"PTX_EVICT": "first"})
    os.rmdir(os.environ["TRITON_CACHE_DIR"])
    assert knobs.runtime.add_stages_inspection_hook() == ("evict_first", "evict_first")


def test_flashmla_ab_moves_wgmma_tn_rows(monkeypatch):
    """``tn_min_rows_H=ROWS`` of a variant moves where sm_90 runs wgmma_tn (16 heads x 8 rows to
    wgmma_rr, 32 x 8 to wgmma_tn) and is no launch-table override."""
    from graphattn.cuda import configs

    ab = _load("flashmla_ab")
    monkeypatch.setattr(configs, "TN_MIN_ROWS", dict(configs.TN_MIN_ROWS))
    pick = lambda heads: configs.kernel_config("flashmla", rows=8, heads=heads, topk=2048).get("kernel")  # noqa: E731
    assert (pick(16), pick(32)) == ("wgmma_tn", "wgmma_rr")
    left = ab.apply_script_settings(ab.parse_variant("tn_min_rows_16=1000000,tn_min_rows_32=1,kernel=wgmma_rr"))
    assert left == {"kernel": "wgmma_rr"}
    assert (pick(16), pick(32)) == ("wgmma_rr", "wgmma_tn")


def test_flashmla_ab_combine_keys(monkeypatch):
    """``c_KEY`` keys of a variant override the combine's launch setting (``launch_pdl`` as a
    bool), not flashmla's; ``C_SMEM`` is a script setting, applied and taken out."""
    ab = _load("flashmla_ab")
    applied = []
    monkeypatch.setattr(ab, "_combine_smem", applied.append)
    left = ab.apply_script_settings(ab.parse_variant("c_PDL=1,c_launch_pdl=1,C_SMEM=120000,max_splits=8"))
    assert applied == [120000] and left == {"c_PDL": 1, "c_launch_pdl": 1, "max_splits": 8}
    assert ab.split_combine_keys(left) == ({"max_splits": 8}, {"PDL": 1, "launch_pdl": True})
    assert ab.split_combine_keys({"c_pdl_max_programs": 0}) == ({}, {"pdl_max_programs": 0})


def test_flashmla_ab_checks_run_the_kernel_under_test():
    """Each kernel's checks are shapes where sm_90's launch table picks that kernel (a check at
    128 heads would test wgmma_rr while the variants change wgmma_tn), with splits and without."""
    from graphattn.cuda import configs

    ab = _load("flashmla_ab")
    for kernel, checks in ab.CHECKS.items():
        for rows, heads, topk in checks:
            for kv_fp8 in (False, True):
                cfg = configs.kernel_config("flashmla", rows=rows, heads=heads, topk=topk, kv_fp8=kv_fp8)
                assert cfg.get("kernel") == kernel, (kernel, rows, heads, topk, kv_fp8, cfg.get("kernel"))
    assert {h for _, h, _ in ab.CHECKS["wgmma_tn"]} == {16, 32}  # both of its head blocks
    # FP8 A/Bs of wgmma_ws (which FP8 runs at 128 heads) check 128 heads at many rows too
    fp8_ws = ab.checks_for("wgmma_ws", kv_fp8=True)
    assert fp8_ws[:len(ab.DEFAULT_CHECKS)] == ab.DEFAULT_CHECKS and ab.checks_for("wgmma_ws") == ab.CHECKS["wgmma_ws"]
    for rows, heads, topk in fp8_ws:
        cfg = configs.kernel_config("flashmla", rows=rows, heads=heads, topk=topk, kv_fp8=True)
        assert cfg.get("kernel") == "wgmma_ws", (rows, heads, topk, cfg.get("kernel"))


def test_probe_report_converts_clock64_at_the_measured_clock(capsys):
    """The probes' report converts clock64 to µs at the SM clock the stamps measure (1.75 GHz
    here, as under load), not the boost clock: a milestone 3 µs after its program's start reads 3."""
    import torch

    probe = _load("ws_probe")
    g = torch.zeros(3, 32, dtype=torch.float64)
    c = torch.zeros(3, 32, dtype=torch.float64)
    for p in range(3):  # programs start 1 µs apart; slot 20 entry, 1 a milestone, 5 the end
        for slot, ns in ((20, 0.0), (1, 3000.0), (5, 60000.0)):
            g[p, slot] = 1000.0 * p + ns
            c[p, slot] = 7000.0 * p + 1.75 * ns
    probe.report(g, c, {1: "q landed", 5: "stored"}, 20, [5])
    out = capsys.readouterr().out
    assert "measured 1.75 GHz" in out, out
    line = next(x for x in out.splitlines() if "q landed" in x)
    assert line.endswith("from its own start: median    3.00"), line


def test_dsmem_probe_compiles_for_sm90_and_its_offsets_are_the_allocators():
    """dsmem_probe's kernels compile for sm_90 (no GPU), their PTX makes the cluster writes, and
    the shared-memory offsets its inline PTX uses are those smem_offsets reads from the
    allocator (a subprocess: Gluon compiles outside the interpreter)."""
    import subprocess

    code = (
        "import sys; sys.path.insert(0, 'scripts')\n"
        "import dsmem_probe as d, smem_offsets as o\n"
        "k = d.compile_all()\n"
        "print('shared', [k[n].metadata.shared for n in ('dsmem_kernel', 'dsmem_kernel_1cta', 'exchange_kernel')])\n"
        "ptx = k['exchange_kernel'].asm['ptx']\n"
        "print('bulk', ptx.count('cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes'))\n"
        "print('st.async', 'st.async.shared::cluster.mbarrier::complete_tx::bytes'\n"
        "      in k['dsmem_kernel_1cta'].asm['ptx'])\n"
        "_, found = o.offsets(d._exchange_kernel, d.EXCHANGE_SIG, {'ASM_SEND': d.send_asm(2, d.WORDS, "
        "*d.exchange_offsets()), 'C': 2, 'WORDS': d.WORDS}, {'num_warps': 4})\n"
        "print('offsets', sorted((n, off) for n, off, _ in found))\n"
        "print('used', d.exchange_offsets(), d.SWAP_OFFSETS)\n"
        "_, found = o.offsets(d._dsmem_kernel_1cta, d.SWAP_SIG, {'ASM': d.remote_store_asm(*d.SWAP_OFFSETS), "
        "'N': d.N}, {'num_warps': 4})\n"
        "print('offsets1', sorted((n, off) for n, off, _ in found))\n")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in run.stdout.splitlines() if line.split(" ", 1)[0] in
               ("shared", "bulk", "st.async", "offsets", "offsets1", "used"))
    assert out["shared"] == "[520, 520, 131080]"
    assert out["bulk"] == "8"  # send_asm(8, ...): one copy per CTA of the cluster (the own one predicated off)
    assert out["st.async"] == "True"
    assert out["offsets"] == "[('bar', 131072), ('recv', 65536), ('stage', 0)]"  # the allocator's
    assert out["offsets1"] == "[('bar', 512), ('buf', 0)]"
    assert out["used"] == "(0, 65536, 131072) (0, 512)"  # what the probe's PTX uses: the same


def test_cluster_check_race_mode_compiles_the_merge_without_the_cluster_barrier():
    """scripts/cluster_check.py's racecheck mode (no GPU here: the compile only): after
    ``without_cluster_barrier`` the CLUSTER=2 kernels of wgmma_rr (bf16) and wgmma_ws (FP8
    tokens) compile for sm_90 with no ``barrier.cluster`` left; without it, they have them (one
    subprocess each way, as the mode runs: Triton memoises a kernel's key once it compiled it, and
    Gluon compiles outside the interpreter)."""
    import subprocess

    def counts(patched: bool) -> dict[str, int]:
        code = (
            "import sys; sys.path.insert(0, 'scripts')\n"
            "from graphattn.kernels import aot\n"
            "import cluster_check\n"
            f"if {patched}:\n"
            "    cluster_check.without_cluster_barrier()\n"
            "for name in ('flashmla_wgmma_rr', 'flashmla_wgmma_ws'):\n"
            "    job = next(j for j in aot.jobs(['sm90']) if j[0] == name and j[2].get('CLUSTER') == 2)\n"
            "    print('count', name, aot.compile_job(job).asm['ptx'].count('barrier.cluster'))\n")
        env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        lines = [x.split() for x in run.stdout.splitlines() if x.startswith("count ")]
        return {name: int(n) for _, name, n in lines}

    before, after = counts(False), counts(True)
    assert set(before) == set(after) == {"flashmla_wgmma_rr", "flashmla_wgmma_ws"}
    assert all(n > 0 for n in before.values()), before
    assert all(n == 0 for n in after.values()), after


def _racecheck_log(pairs, summary=True) -> str:
    """A racecheck log in compute-sanitizer's format: one hazard per ``((file, line), (file, line))``."""
    lines = ["========= COMPUTE-SANITIZER"]
    for (fa, la), (fb, lb) in pairs:
        lines += [f"========= Error: Race reported between Write access at _flashmla_ws_kernel+0x35d0 in {fa}:{la}",
                  f"=========     and Read access at _flashmla_ws_kernel+0xe830 in {fb}:{lb} [128 hazards]",
                  "========= "]
    if summary:
        lines.append(f"========= RACECHECK SUMMARY: {len(pairs)} hazards displayed ({len(pairs)} errors, 0 warnings)")
    return "\n".join(lines) + "\n"


def test_racecheck_triage_knows_each_mbarrier_hand_off_and_fails_on_a_new_one(tmp_path):
    """scripts/racecheck_triage.py: every hand-off it lists as known is still in the kernels' source
    (an edit to one of those statements fails here, so the list is reviewed again); a log of those
    hazards (at their current lines) and of the kernels' first lines passes, and a hazard between
    any other two statements, a log racecheck did not finish, or one where it reached its hazard
    cap, fails."""
    triage = _load("racecheck_triage")
    where = {}  # (function, statement) -> (file, line), from the kernels as committed
    for path in sorted(triage.KERNELS.glob("wgmma*.py")):
        for first, last, func, text in triage._statements(path.name)[0]:
            where.setdefault((func, text), (path.name, last))
    known = [tuple(pair) for pair in triage.KNOWN]
    missing = {s for pair in known for s in pair if s not in where}
    assert not missing, f"racecheck_triage.KNOWN names statements no kernel has any more: {missing}"
    pairs = [(where[a], where[b]) for a, b in known]
    header = next((path.name, first + 1) for path in [triage.KERNELS / "wgmma_ws.py"]
                  for first, last, func in triage._statements(path.name)[1] if func == "_flashmla_ws_kernel")
    pairs.append((header, header))

    def run(text):
        log = tmp_path / "racecheck.log"
        log.write_text(text)
        return triage.main([str(log)])

    assert run(_racecheck_log(pairs)) == 0
    new = (where[("_producer_merge", "_async_copy.wait_group(0)")], where[known[0][0]])
    assert run(_racecheck_log(pairs + [new])) == 1
    assert run(_racecheck_log(pairs, summary=False)) == 1
    capped = _racecheck_log(pairs).replace("========= RACECHECK SUMMARY", f"========= Warning: {triage._CAPPED}. "
                                           "Environment variable ...\n========= RACECHECK SUMMARY")
    assert triage._CAPPED in capped and run(capped) == 1  # hazards past racecheck's cap went unreported


def test_racecheck_kernels_plan_each_gluon_kernel_on_sm90():
    """scripts/racecheck_kernels.py's cases plan, on an H200, the kernel each names, in one split
    and in several, with bf16 kv and FP8 tokens (wgmma_tn's through its ring, through its raw
    tile and in place): so the racecheck run covers every Gluon kernel (and the early index
    loads of wgmma_rr and of wgmma_tn's FP8 tokens in place)."""
    from graphattn.common.platform import DeviceFacts
    from graphattn.cuda.configs import gluon_available
    from graphattn.cuda.platform import CudaPlatform

    if not gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect: sm_90 plans no Gluon kernel")
    launches = _load("racecheck_kernels")
    h200 = CudaPlatform(DeviceFacts("nvidia", "H200", 132, capability=(9, 0)), device="cuda:0")
    seen, early = set(), set()
    for case in launches.CASES:
        plan = launches.plan_of(case, h200)
        assert plan.kernel == case[0] and not plan.main.kwargs.get("CLUSTER"), (case, plan.main)
        seen.add((case[0], case[1], plan.splits > 1, bool(plan.main.kwargs.get("RING")),
                  bool(plan.main.kwargs.get("RAW_TILE"))))
        if plan.main.kwargs.get("IDX_EARLY"):
            early.add((case[0], case[1]))
    want = {(k, fp8, split, False, False) for k in ("wgmma_rr", "wgmma_ws", "wgmma_tn") for fp8 in (False, True)
            for split in (False, True)} - {("wgmma_rr", True, split, False, False) for split in (False, True)}
    # FP8 runs no rr; tn's ring and raw tile (and in place at 32 heads)
    want |= {("wgmma_tn", True, split, ring, not ring) for split in (False, True) for ring in (False, True)}
    assert seen == want, sorted(seen ^ want)
    assert early == {("wgmma_rr", False), ("wgmma_tn", True)}, f"the cases with IDX_EARLY: {early}"


def test_racecheck_triage_does_not_pass_an_access_without_a_source_line(tmp_path):
    """A hazard whose accesses racecheck could not place in a source line is new, not skipped."""
    triage = _load("racecheck_triage")
    log = tmp_path / "racecheck.log"
    log.write_text("========= Error: Race reported between Write access at _flashmla_ws_kernel+0x35d0\n"
                   "=========     and Read access at _flashmla_ws_kernel+0xe830 [128 hazards]\n"
                   "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    assert triage.main([str(log)]) == 1


def test_call_timeline_splits_the_profile_into_calls():
    """call_timeline: a call is the split kernel and what follows it up to the next split kernel;
    a combine launched as a PDL may start before the split kernel ends (durations and gaps from
    the kernels' own times, the last call dropped: it has no next start)."""
    tl = _load("call_timeline")
    kernels = [  # (name, start, end) in us, out of order as a profile may give them
        ("_flashmla_combine_native_kernel", 8.0, 11.0),  # started under the split (PDL)
        ("_flashmla_ws_kernel", 0.0, 9.0),
        ("_flashmla_ws_kernel", 13.0, 21.0),
        ("_flashmla_combine_native_kernel", 22.0, 24.0),
        ("_flashmla_ws_kernel", 26.0, 30.0),
    ]
    calls = tl.per_call(kernels, "_flashmla_ws_kernel")
    assert calls == [
        {"split": 9.0, "combine": 3.0, "to_combine": 2.0, "span": 11.0, "to_next": 2.0},
        {"split": 8.0, "combine": 2.0, "to_combine": 3.0, "span": 11.0, "to_next": 2.0},
    ]
    assert tl.medians(calls) == {"split": 8.5, "combine": 2.5, "to_combine": 2.5, "span": 11.0, "to_next": 2.0}
    alone = tl.per_call([("_k", 0.0, 5.0), ("_k", 7.0, 12.0), ("_k", 13.0, 14.0)], "_k")
    assert [c["combine"] for c in alone] == [0.0, 0.0] and [c["to_next"] for c in alone] == [2.0, 1.0]


def test_ncu_source_summary_finds_the_conflicted_and_the_stalled_instructions(tmp_path):
    """scripts/ncu_source.py on a small source page in ncu's CSV form: totals, the instruction
    with excessive shared wavefronts first, each stall after the instructions before it, and a
    clear error for a CSV without the SourceCounters columns."""
    ncu_source = _load("ncu_source")
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "L1 Wavefronts Shared",
              "L1 Wavefronts Shared Ideal", "L1 Wavefronts Shared Excessive"]
    rows = [["0x7f00", "      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x38448], R12", "3", "0", "0", "0"],
            ["0x7f10", "@!P0  BRA 0x7fe0", "1,431", "0", "0", "0"],
            ["0x7f20", "      STS.64 [R3], R4", "7", "4,096", "1,024", "3,072"],
            ["0x7f30", "      LDS.128 R8, [R5]", "0", "2,048", "2,048", "-"]]
    path = tmp_path / "sass.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(["Kernel Name", "_flashmla_rr_kernel"])
        writer.writerow(header)
        writer.writerows(rows)
    text = ncu_source.summary(ncu_source.read(str(path)), top=3, context=1)
    lines = text.splitlines()
    assert lines[:4] == ["L1 Wavefronts Shared: 6144", "L1 Wavefronts Shared Ideal: 3072",
                         "L1 Wavefronts Shared Excessive: 3072", "Warp Stall Sampling (All Samples): 1441"], text
    assert "STS.64 [R3], R4" in lines[5] and lines[5].split()[:3] == ["3072", "4096", "1024"], text
    stall = lines.index(next(line for line in lines if "BRA 0x7fe0" in line))
    assert lines[stall].split()[0] == "1431" and "TRYWAIT P0, [UR4+0x38448]" in lines[stall + 1], text
    bad = tmp_path / "bad.csv"
    bad.write_text('"Address","Source"\n"0x1","NOP"\n')
    with pytest.raises(SystemExit, match="SourceCounters"):
        ncu_source.read(str(bad))
