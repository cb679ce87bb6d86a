"""Small batch with the kernel table's method (sm_90): the heads-on-N kernel at 16 and 32 heads
per program against what the launch table picks now, and its split counts. Run from the
repository root: ``PYTHONPATH=. python scripts/tn_sweep.py``."""
import torch
from graphattn.bench import kernels as kb
from graphattn.common.platform import current_platform
from graphattn.cuda import configs
from graphattn.kernels.launch import clear_launch_plans
from graphattn.kernels.plan import choose_splits, path_config

plat = current_platform()


def us(heads, rows, fp8, topk=2048, **over):
    old = configs.KV_MAJOR_MAX_ROW_HEADS_WITH_WGMMA
    if over:
        configs.KV_MAJOR_MAX_ROW_HEADS_WITH_WGMMA = 0  # a Gluon base config to override
    try:
        with plat.launch_table.override("flashmla", **over) if over else _null():
            clear_launch_plans()
            cfg = path_config("flashmla", rows, heads, topk, plat, fp8)
            s = choose_splits(rows, heads, topk, cfg, plat)
            t = kb.measure(heads, rows, topk, paths=("flashmla",), kv_fp8=fp8)[0]["us"]
            return f"{t:.1f}(s{s},{cfg.get('kernel') or 'triton'}{cfg.get('BLOCK_H')})"
    except Exception as e:  # noqa: BLE001
        return f"ERR {type(e).__name__}: {str(e)[:80]}"
    finally:
        configs.KV_MAJOR_MAX_ROW_HEADS_WITH_WGMMA = old
        clear_launch_plans()


class _null:
    def __enter__(self): return self
    def __exit__(self, *a): return False


TN16 = dict(kernel="wgmma_tn", BLOCK_H=16)
TN32 = dict(kernel="wgmma_tn", BLOCK_H=32)
if __name__ == "__main__":
    for fp8 in (False, True):
        for heads, rows in [(16, 1), (16, 2), (16, 8), (32, 1), (32, 8), (32, 16), (64, 1), (64, 8), (128, 1), (128, 8)]:
            line = [f"{'fp8' if fp8 else 'bf16'} {heads}x{rows}: now {us(heads, rows, fp8)}",
                    f"tn16 {us(heads, rows, fp8, **TN16)}"]
            if heads > 16:
                line.append(f"tn32 {us(heads, rows, fp8, **TN32)}")
            print(" | ".join(line), flush=True)
    for heads, rows in [(16, 8), (16, 4), (32, 8)]:
        line = [f"splits tn16 {heads}x{rows}:"]
        for s in (4, 8, 16, 24, 32):
            line.append(f"s{s} {us(heads, rows, False, **TN16, max_splits=s, target_programs=10**6, split_cost_blocks=0)}")
        print(" ".join(line), flush=True)
