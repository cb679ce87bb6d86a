"""flashmla (warp-specialised kernel) at small batch: time per call against the forced split count,
with the kernel table's method (graphattn.bench.kernels.measure), bf16 and FP8. Run from the
repository root on an sm_90 GPU: ``PYTHONPATH=. python scripts/split_sweep.py``."""
import sys
import torch
from graphattn.bench import kernels as kb
from graphattn.common.platform import current_platform
from graphattn.kernels.launch import clear_launch_plans
from graphattn.kernels.plan import choose_splits, path_config

plat = current_platform()
shapes = [(16, 8), (32, 8), (64, 8), (128, 8), (128, 1), (64, 1), (16, 64)]
for kv_fp8 in (False, True):
    for heads, rows in shapes:
        cfg = path_config("flashmla", rows, heads, 2048, plat, kv_fp8)
        default = choose_splits(rows, heads, 2048, cfg, plat)
        line = [f"{'fp8' if kv_fp8 else 'bf16'} {heads}x{rows}: default splits {default}:"]
        base = kb.measure(heads, rows, 2048, paths=("flashmla",), kv_fp8=kv_fp8)[0]["us"]
        line.append(f"{base:.1f}")
        for s in (4, 8, 12, 16, 24, 32):
            if s == default:
                continue
            with plat.launch_table.override("flashmla", max_splits=s, target_programs=10**6, split_cost_blocks=0):
                clear_launch_plans()
                try:
                    us = kb.measure(heads, rows, 2048, paths=("flashmla",), kv_fp8=kv_fp8)[0]["us"]
                    line.append(f"s{s} {us:.1f}")
                except Exception as e:  # noqa: BLE001
                    line.append(f"s{s} ERR {type(e).__name__}")
            clear_launch_plans()
        print(" ".join(line), flush=True)
