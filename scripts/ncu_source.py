"""Summarise Nsight Compute's per-instruction (SASS) source page of one kernel: where its
shared-memory wavefronts exceed the ideal (bank conflicts) and where its warps stall.

``ncu -i REPORT.ncu-rep --page source --csv --print-source sass > sass.csv`` (a report taken
with ``--section SourceCounters --section WarpStateStats --import-source yes``, as
``scripts/ncu_flashmla.py``'s docstring shows), then ``python scripts/ncu_source.py sass.csv
[--top 14] [--context 4]``. Prints the totals (shared wavefronts, their ideal and excess, stall
samples), the instructions with the most excessive shared wavefronts, and those with the most
stall samples, each of the latter after the ``--context`` instructions before it: a stall on a
branch is a wait whose barrier (``SYNCS.PHASECHK.TRANS64.TRYWAIT [addr]``) or load those name.
"""
from __future__ import annotations

import argparse
import csv
import sys

WAVEFRONTS = "L1 Wavefronts Shared"
IDEAL = "L1 Wavefronts Shared Ideal"
EXCESS = "L1 Wavefronts Shared Excessive"
STALLS = "Warp Stall Sampling (All Samples)"


def read(path: str) -> list[dict[str, str]]:
    """The instruction rows of ``path`` (the header is the first row that names ``Address``)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next((i for i, row in enumerate(rows) if row and row[0] == "Address"), None)
    if start is None:
        raise SystemExit(f"{path}: no 'Address' header row; is it `ncu --page source --csv --print-source sass`?")
    header = rows[start]
    missing = [k for k in (WAVEFRONTS, IDEAL, EXCESS, STALLS, "Source") if k not in header]
    if missing:
        raise SystemExit(f"{path}: no column {missing}; take the report with --section SourceCounters "
                         "--section WarpStateStats")
    return [dict(zip(header, row)) for row in rows[start + 1:] if len(row) == len(header)]


def number(row: dict[str, str], key: str) -> float:
    """``row[key]`` as a number (ncu writes thousands separators and ``-`` for none)."""
    try:
        return float(row[key].replace(",", ""))
    except ValueError:
        return 0.0


def summary(rows: list[dict[str, str]], top: int = 14, context: int = 4) -> str:
    """The report's text (see the module docstring)."""
    def line(row: dict[str, str]) -> str:
        return f"{row['Address'][-6:]}  {' '.join(row['Source'].split())[:90]}"

    out = [f"{key}: {int(sum(number(r, key) for r in rows))}" for key in (WAVEFRONTS, IDEAL, EXCESS, STALLS)]
    out.append("--- most excessive shared wavefronts (excess, all, ideal)")
    for row in sorted(rows, key=lambda r: -number(r, EXCESS))[:top]:
        if number(row, EXCESS) > 0:
            out.append(f"{int(number(row, EXCESS)):>9} {int(number(row, WAVEFRONTS)):>9} {int(number(row, IDEAL)):>9}  "
                       + line(row))
    out.append(f"--- most stall samples (and the {context} instructions before each)")
    order = sorted(range(len(rows)), key=lambda i: -number(rows[i], STALLS))[:top]
    for i in order:
        if number(rows[i], STALLS) <= 0:
            break
        out.append(f"{int(number(rows[i], STALLS)):>6}  {line(rows[i])}")
        out += [f"{'':>6}    {line(r)}" for r in rows[max(0, i - context):i]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=14, help="instructions listed per table")
    ap.add_argument("--context", type=int, default=4, help="instructions shown before each stall")
    args = ap.parse_args(argv)
    print(summary(read(args.csv), args.top, args.context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
