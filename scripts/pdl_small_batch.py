"""flashmla's combine as a programmatic dependent launch at 2-8 rows against the launch table's setting
(kernel table method, sm_90). Run from the repository root: ``PYTHONPATH=. python scripts/pdl_small_batch.py``."""
from graphattn.bench import kernels as kb
from graphattn.common.platform import current_platform
from graphattn.kernels.launch import clear_launch_plans
plat = current_platform()
for fp8 in (False, True):
    for heads, rows in [(16, 8), (16, 4), (32, 8), (64, 8), (128, 8), (128, 2)]:
        clear_launch_plans()
        off = kb.measure(heads, rows, 2048, paths=("flashmla",), kv_fp8=fp8)[0]["us"]
        with plat.launch_table.override("flashmla_combine", PDL=1, launch_pdl=True):
            clear_launch_plans()
            on = kb.measure(heads, rows, 2048, paths=("flashmla",), kv_fp8=fp8)[0]["us"]
        clear_launch_plans()
        off2 = kb.measure(heads, rows, 2048, paths=("flashmla",), kv_fp8=fp8)[0]["us"]
        print(f"{'fp8' if fp8 else 'bf16'} {heads}x{rows}: table {off:.1f} / {off2:.1f}, PDL {on:.1f}", flush=True)
