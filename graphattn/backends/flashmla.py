"""The ``flashmla`` backend: a head-padded split-KV kernel plus a separate combine kernel.

FlashMLA's sparse decode kernel processes heads in groups of the platform's
``head_pad_multiple`` (64), so with attention tensor parallelism (e.g. 128 heads / TP 8 = 16)
the query must be padded. The padding lives in the metadata's one grow-only q-pad buffer: each
call copies the real heads into a row slice of it (the padding heads were zeroed once, at
allocation) and the graph keeps that address for good -- the fix for the per-bucket
``q_pad_buffer`` bug described in docs/design.md.
"""

from __future__ import annotations

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8
from ..kernels.launch import FLASHMLA, LaunchPlan
from ._triton import TritonBackend
from .base import GraphSupport


class FlashMLABackend(TritonBackend):
    """Pads q to ``head_pad_multiple`` heads; split-KV partials in a workspace; combine kernel."""

    name = "flashmla"
    supported_dtypes = (torch.bfloat16, torch.float16)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)  # FP8 tokens: Triton tiles (not yet the Gluon kernel)
    kernel_spec = FLASHMLA
    graph_support = GraphSupport.FULL
    description = "FlashMLA-style: q padded to 64 heads, split-KV workspace + combine kernel"

    def _build_plan(self, rows: int, aligned: bool, ws_splits: int) -> LaunchPlan:
        return self._module.plan_flashmla(rows, self._kernel_heads, self.topk, ws_splits, aligned,
                                          self.kv_fp8, self.platform)

