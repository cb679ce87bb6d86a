"""Triage of a ``compute-sanitizer --tool racecheck`` log of flashmla's Gluon kernels: every
reported hazard must be one this file knows to be ordered, else it is new and fails.

Racecheck does not follow mbarrier ordering (``mbarrier.arrive`` / ``mbarrier.wait``, and
``cp.async`` completing on an mbarrier), so it reports each mbarrier hand-off of shared memory
between warpgroups as a hazard, and Triton's own warp-specialisation code in the kernel's
first line. :data:`KNOWN` lists those hand-offs, each by the two statements involved (their
source text and function, not line numbers, so edits elsewhere keep them known) and what orders
them; a hazard between any other pair of statements is printed as ``NEW`` and the exit status
is 1. Run with ``--print-limit 1000`` (or more): racecheck stops listing at its limit; and
with ``NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS`` above the hazards the launches make (racecheck
processes none past it; a log that says it reached it fails).

``python scripts/racecheck_triage.py racecheck.log`` (from the repository root, the tree the log
was made from: lines are read from ``graphattn/kernels``). Prints one line per distinct pair of
statements with its hazard count; exit 0 when every pair is known and the log is complete
(racecheck's summary, the hazard cap not reached), 1 otherwise.
"""
from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from functools import cache
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "graphattn" / "kernels"

# Pairs of (function, statement) that racecheck reports and an mbarrier orders. A statement is
# its source text with whitespace removed; ``<header>`` stands for a kernel's signature lines,
# where racecheck places Triton's warp-specialisation code.
_MAX_RR = "the row max exchange between wgmma_rr's consumers (m0_ready, m1_ready)"
_SUMS = "the row sums' exchange between the consumers (l_ready)"
_MAX_WS = "the row max hand-off with P (p_ready)"
_RING = "an FP8 ring slot: the producer's cp.async against the consumers' dequantisation (kv_ready, kv_free)"
_MERGE = "the consumers' staging for the producer's cluster merge (o_ready)"
_WS_RUNTIME = "Triton's warp-specialisation code (the kernel's first line)"
_MERGE_TN = "wgmma_tn's two consumers' outputs, maxima and sums, exchanged through their KV slots (l_ready)"
_RAW = ("the raw slot of wgmma_tn's RAW_TILE: the producer's cp.async against a consumer's loads into registers "
        "(kv_ready, one per consumer; kv_free)")
_GATHER_RAW = ("_gather_fp8", "_async_load(raw_dst,kv_ptr+rows_n[:,None]+cols_n[None,:],mask=valid_n[:,None])")
_GATHER_SCALES = ("_gather_fp8", "_async_load(sc_slot,scales[None,:]+blocks[:,None],mask=valid_c[None,:])")
KNOWN: dict[frozenset, str] = {
    frozenset({("_consumer_rr", "stat_m.store(m_new)"),
               ("_consumer_rr", "m_new=gl.maximum(m_new,stat_m.load(row_s))")}): _MAX_RR,
    frozenset({("_consumer_rr", "stat_m.store(m_new)"), ("_consumer_rr", "m_round=stat_m.load(row_s)")}): _MAX_RR,
    frozenset({("_normalised", "stat_l.index(WG).store(l)"),
               ("_normalised", "l=l+stat_l.index(OTHER).load(row_s)")}): _SUMS,
    frozenset({("_own_tile", "stat_m.index(WG).store(m_new)"),
               ("_other_tile", "m,l,acc=_to_max(m,l,acc,stat_m.index(1-WG).load(row_s),row_o)")}): _MAX_WS,
    frozenset({("_gather_fp8", "_async_load(raw_dst,kv_ptr+rows_n[:,None]+cols_n[None,:],mask=valid_n[:,None])"),
               ("_dequantise_block",
                "kn.slice(b*FP8_BLOCK,FP8_BLOCK,dim=1).store(_dequantised(x,scale,kn.dtype))")}): _RING,
    frozenset({("_gather_fp8", "_async_load(sc_slot,scales[None,:]+blocks[:,None],mask=valid_c[None,:])"),
               ("_dequantise_block",
                "scale=sc_rows.index(slot*4+b).slice(ROW0,ROWS).load(gl.SliceLayout(1,conv))")}): _RING,
    frozenset({("_stage_for_merge", "_f32_rows(k_nope.index(WG),BLOCK_H,BLOCK_H,HALF).index(0).store(out)"),
               ("_producer_merge", "gl.store(w_row+split*stride_ws+h[:,None]*stride_wh+(peer*HALF+d)[None,:],"
                                   "sent.index(c).load(layout),mask=(h<H)[:,None])")}): _MERGE,
    frozenset({("_stage_for_merge", "stat_m.index(0).store(lse)"),
               ("_producer_merge", "lse_me=stat_m.index(0).load(vec_l)")}): _MERGE,
    frozenset({("_consumer_t", "_merge_view(k_nope,WG,D_NOPE,BLOCK_H).store(acc)"),
               ("_consumer_t", "out=(_merge_view(k_nope,WG,D_NOPE,BLOCK_H).slice(WG*HALF+c,BLOCK_N,dim=0)"
                               ".load(s_layout)*w0[None,:]+_merge_view(k_nope,1-WG,D_NOPE,BLOCK_H)"
                               ".slice(WG*HALF+c,BLOCK_N,dim=0).load(s_layout)*w1[None,:])")}): _MERGE_TN,
    frozenset({("_consumer_t", "stats.index(2*WG).store(m)"),
               ("_consumer_t", "m1=stats.index(2-2*WG).load(col_s)")}): _MERGE_TN,
    frozenset({("_consumer_t", "stats.index(2*WG+1).store(l)"),
               ("_consumer_t", "l1=stats.index(3-2*WG).load(col_s)")}): _MERGE_TN,
    frozenset({("_gather_fp8", "_async_load(kr_bits,rope[:,None]+cols_r[None,:],"
                               "mask=gl.convert_layout(valid_n,gl.SliceLayout(1,gather_r))[:,None])"),
               ("_scores_from_raw", "ra=k_rope_bits.index(0).load(a_layout).to(dtype)")}): _RAW,
    # each scale block's bytes and scales (block b starts at column b * FP8_BLOCK, scale row b)
    **{frozenset({_GATHER_RAW, ("_scores_from_raw", f"x{b}=raw.slice({col},FP8_BLOCK,dim=1).load(REGS_LOAD)")}):
       _RAW for b, col in enumerate(("0", "FP8_BLOCK", "2*FP8_BLOCK", "3*FP8_BLOCK"))},
    **{frozenset({_GATHER_SCALES, ("_scores_from_raw", f"c{b}=k_scale_rows.index({b}).load(sc_layout)")}): _RAW
       for b in range(4)},
}
_ACCESS = re.compile(r"(Read|Write) access at (\S+?)(?:\+0x[0-9a-f]+)? in (\S+?):(\d+)")


@cache
def _statements(name: str) -> tuple[list[tuple[int, int, str, str]], list[tuple[int, int, str]]]:
    """Of ``graphattn/kernels/<name>``: its simple statements ``(first, last line, function,
    text)`` and its functions' headers ``(first, last line, function)``."""
    source = (KERNELS / name).read_text()
    tree = ast.parse(source)
    stmts, headers = [], []

    def walk(node, func):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                headers.append((first, child.body[0].lineno - 1, child.name))
                walk(child, child.name)
            elif isinstance(child, ast.stmt):
                if not any(isinstance(c, ast.stmt) for c in ast.iter_child_nodes(child)):
                    text = re.sub(r"\s+", "", ast.get_source_segment(source, child) or "")
                    stmts.append((child.lineno, child.end_lineno, func, text))
                walk(child, func)

    walk(tree, "<module>")
    return stmts, headers


def statement_at(name: str, line: int) -> tuple[str, str]:
    """``(function, statement)`` of ``graphattn/kernels/<name>`` at ``line`` (``<header>`` in a
    function's signature; ``(name, "line N")`` where no statement covers it)."""
    stmts, headers = _statements(name)
    for first, last, func in headers:
        if first <= line <= last:
            return func, "<header>"
    covering = [(last - first, func, text) for first, last, func, text in stmts if first <= line <= last]
    if covering:
        _, func, text = min(covering)
        return func, text
    return name, f"line {line}"


# racecheck's warning when it has processed as many hazards as it keeps
# (NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS, 10 million by default): it reports none after that.
_CAPPED = "Maximum number of hazards reached"


def triage(log: str) -> tuple[list[tuple[int, tuple, tuple, str | None]], bool]:
    """``(pairs, finished)``: each distinct pair of statements racecheck reported (hazard count,
    the two ``(function, statement)``, what orders it or ``None``), and whether the log is
    complete: racecheck's summary is there and it did not stop at its hazard cap."""
    counts: Counter = Counter()
    first = None
    for line in log.splitlines():
        match = _ACCESS.search(line)
        if match:
            place = statement_at(match.group(3), int(match.group(4))) if (KERNELS / match.group(3)).is_file() \
                else (match.group(2), f"{match.group(3)}:{match.group(4)}")
        elif "Race reported" in line or re.search(r"and (Read|Write) access", line):
            place = ("?", line.strip("= "))  # no source line (built without line info?): never known
        else:
            continue
        if "Race reported" in line:
            first = place
        elif first is not None:
            hazards = re.search(r"\[(\d+) hazards?\]", line)
            counts[(first, place)] += int(hazards.group(1)) if hazards else 1
    pairs = []
    for (a, b), n in sorted(counts.items()):
        known = _WS_RUNTIME if a[1] == b[1] == "<header>" else KNOWN.get(frozenset({a, b}))
        pairs.append((n, a, b, known))
    return pairs, "RACECHECK SUMMARY" in log and _CAPPED not in log


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], "\nusage: racecheck_triage.py LOG", file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(errors="replace")
    pairs, finished = triage(text)
    new = 0
    for n, a, b, known in pairs:
        new += known is None
        print(f"{n:>7}  {a[0]}: {a[1][:70]}  /  {b[0]}: {b[1][:70]}  ->  {known or 'NEW'}")
    if not finished:
        print(f"racecheck stopped at its hazard cap ({_CAPPED!r}): hazards after it went unreported; raise "
              "NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS or launch less" if _CAPPED in text
              else "no RACECHECK SUMMARY in the log: racecheck did not finish")
    print(f"{len(pairs)} pairs, {new} new")
    return 0 if finished and not new else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
