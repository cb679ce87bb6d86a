"""Four calls through flashmla's heads-on-N kernel (wgmma_tn: 7-32 heads, bf16 and fp16, plain kv and FP8 tokens)
against the float64 reference, as a compute-sanitizer target:
``PYTHONPATH=. compute-sanitizer --tool memcheck python scripts/tn_one.py``."""
import sys, torch
import os; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, "tests")
from tn_smoke import check  # noqa: E402
ok = (check(16, 8, 300, torch.bfloat16, False, all_invalid=True) and check(20, 64, 130, torch.float16, True)
      and check(7, 5, 200, torch.bfloat16, True, all_invalid=True) and check(32, 64, 2048, torch.float16, False))
print("ONE ok" if ok else "ONE FAIL")
