"""The ``flashmla_mega`` backend: one program per (row, head block), one pass, no workspace.

Nothing but the index table lives in the metadata, so there is nothing to pad, count or combine;
it is the best choice when rows are many enough to fill the device on their own (large decode
batches, prefill chunks).
"""

from __future__ import annotations

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8
from ..kernels.launch import MEGA, LaunchPlan
from ._triton import TritonBackend
from .base import GraphSupport


class FlashMLAMegaBackend(TritonBackend):
    """Single-pass sparse MLA: no padding, no counter, no workspace."""

    name = "flashmla_mega"
    supported_dtypes = (torch.bfloat16, torch.float16)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)
    kernel_spec = MEGA
    graph_support = GraphSupport.FULL
    description = "single pass per (row, head block): no padding, counter or workspace"

    def _build_plan(self, rows: int, aligned: bool, ws_splits: int) -> LaunchPlan:
        return self._modules["mega"].plan_mega(rows, self.num_heads, self.topk, self.kv_fp8, self.platform)

