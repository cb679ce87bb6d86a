"""The ``trtllm`` backend: one-launch multi-CTA split-KV with a self-resetting counter.

Each CTA writes its split's partial to the workspace and increments the (row, head block)
counter; the last CTA combines and resets the counter to 0. The counter is sized before any
capture for the metadata's reserved rows (``max(max_bs, max_num_tokens)``) and never replaced:
an eager call with more rows gets a temporary zeroed counter (the ``TEMPORARY`` overflow policy
of its GrowOnlyBuffer) -- the fix for the counter-rebinding bug described in docs/design.md.
"""

from __future__ import annotations

import torch

from ..common.metadata import GraphMetadata
from ._triton import TritonBackend, kernels
from .base import GraphSupport


class TrtllmBackend(TritonBackend):
    """No padding; multi-CTA split-KV in one launch, counter from ``metadata.counter_for``."""

    name = "trtllm"
    supported_dtypes = (torch.bfloat16, torch.float16)
    uses_counter = True
    uses_workspace = True
    graph_support = GraphSupport.FULL
    kernel_path = "trtllm"
    description = "TRT-LLM-style: any heads, multi-CTA split-KV, last CTA combines (one launch)"

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`AttentionBackend.forward`. Capturable (within the reserved rows)."""
        self.check_inputs(q, kv)
        self.check_metadata(metadata)
        rows = q.shape[0]
        kernels()
        counter = metadata.counter_for(rows)  # [rows, cols] int32 zeros; the kernel re-zeroes it
        ws_out, ws_lse = metadata.workspace_for(rows)
        return torch.ops.graphattn.sparse_mla_trtllm(
            q, kv, metadata.indices_for(rows), self.sm_scale, counter, ws_out, ws_lse
        )
