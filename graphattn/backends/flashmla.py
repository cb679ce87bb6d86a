"""The ``flashmla`` backend: a split-KV kernel plus a separate combine kernel.

FlashMLA's sparse decode kernel processes heads in blocks (64 per program in the sm_90 Gluon
kernel; with attention tensor parallelism, e.g. 128 heads / TP 8 = 16 per rank, sm_90 runs a
kernel with the heads on the MMA's N side, 16 or 32 per program, instead). Where the last block
is partly empty the kernels read q ``[rows, num_heads, 576]`` as it comes and mask the heads
past ``num_heads`` (loaded as zeros, never stored), so nothing pads q or narrows the outputs and
the metadata holds no q-pad buffer. Its graph-safe state is the split-KV workspace pool and the
index table.
"""

from __future__ import annotations

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8
from ..kernels.launch import FLASHMLA, LaunchPlan
from ._triton import TritonBackend
from .base import GraphSupport


class FlashMLABackend(TritonBackend):
    """Any head count, q unpadded; split-KV partials in a workspace; combine kernel."""

    name = "flashmla"
    supported_dtypes = (torch.bfloat16, torch.float16)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)  # FP8 tokens: the Gluon kernel on sm_90, else Triton tiles
    kernel_spec = FLASHMLA
    graph_support = GraphSupport.FULL
    description = "FlashMLA-style: any heads (q unpadded), split-KV workspace + combine kernel"

    def _build_plan(self, rows: int, aligned: bool, ws_splits: int) -> LaunchPlan:
        return self._modules["flashmla"].plan_flashmla(
            rows, self.num_heads, self.topk, ws_splits, aligned, self.kv_fp8, self.platform)

