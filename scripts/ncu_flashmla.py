"""flashmla calls at one shape for Nsight Compute: the kernel table's cold inputs (each row its
own tokens, input copies cycled), eager launches, so ``ncu`` can profile one of them.

``ncu --clock-control none --kernel-name regex:_flashmla --launch-skip 4 --launch-count 1
--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
python scripts/ncu_flashmla.py 128x64x2048 [--kv-fp8] [--calls 8]`` (from the repository root with
``PYTHONPATH=.``). ncu's default cache control flushes the caches before each replay of the
profiled kernel, so it reads the KV from HBM as the table's method does. For where its shared
memory conflicts and its warps stall, take the report with ``--section SourceCounters --section
WarpStateStats --import-source yes -o REPORT`` and summarise ``ncu -i REPORT.ncu-rep --page source
--csv --print-source sass`` with ``scripts/ncu_source.py``.
"""
from __future__ import annotations

import argparse

import torch

from graphattn.bench import kernels as kb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", help="HEADSxROWSxTOPK")
    ap.add_argument("--kv-fp8", action="store_true", help="656-byte FP8 KV tokens")
    ap.add_argument("--calls", type=int, default=8, help="eager calls (the first few compile and warm up)")
    args = ap.parse_args()
    heads, rows, topk = (int(x) for x in args.shape.split("x"))
    sets = kb.make_copies(rows, heads, topk, kb.cold_copies(rows, topk, args.kv_fp8), kv_fp8=args.kv_fp8)
    fn = kb.path_fn("flashmla", rows, heads, topk)
    for i in range(args.calls):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    print(f"flashmla {args.shape} ({'fp8' if args.kv_fp8 else 'bf16'} kv): {args.calls} calls done")


if __name__ == "__main__":
    main()
