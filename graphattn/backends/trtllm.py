"""The ``trtllm`` backend: one-launch multi-CTA split-KV with a self-resetting counter.

Each CTA writes its split's partial to the workspace and increments the (row, head block)
counter; the last CTA combines and resets the counter to 0. The counter is sized before any
capture for the metadata's reserved rows (``max(max_bs, max_num_tokens)``) and never replaced:
an eager call with more rows gets a temporary zeroed counter (the ``TEMPORARY`` overflow policy
of its GrowOnlyBuffer) -- the fix for the counter-rebinding bug described in docs/design.md.
"""

from __future__ import annotations

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8
from ..kernels.launch import TRTLLM, LaunchPlan
from ._triton import TritonBackend
from .base import GraphSupport


class TrtllmBackend(TritonBackend):
    """No padding; multi-CTA split-KV in one launch, counter from ``metadata.counter_for``."""

    name = "trtllm"
    supported_dtypes = (torch.bfloat16, torch.float16)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)
    kernel_spec = TRTLLM
    graph_support = GraphSupport.FULL
    description = "TRT-LLM-style: any heads, multi-CTA split-KV, last CTA combines (one launch)"

    def _build_plan(self, rows: int, aligned: bool, ws_splits: int) -> LaunchPlan:
        return self._modules["trtllm"].plan_trtllm(
            rows, self.num_heads, self.topk, ws_splits, self.kv_fp8, self.platform)

