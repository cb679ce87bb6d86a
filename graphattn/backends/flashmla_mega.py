"""The ``flashmla_mega`` backend: one program per (row, head block), one pass, no workspace.

Nothing but the index table lives in the metadata, so there is nothing to pad, count or combine;
it is the best choice when rows are many enough to fill the device on their own (large decode
batches, prefill chunks).
"""

from __future__ import annotations

import torch

from ..common.metadata import GraphMetadata
from ._triton import TritonBackend, kernels
from .base import GraphSupport


class FlashMLAMegaBackend(TritonBackend):
    """Single-pass sparse MLA: no padding, no counter, no workspace."""

    name = "flashmla_mega"
    supported_dtypes = (torch.bfloat16, torch.float16)
    graph_support = GraphSupport.FULL
    kernel_path = "mega"
    description = "single pass per (row, head block): no padding, counter or workspace"

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`AttentionBackend.forward`. Capturable."""
        self.check_inputs(q, kv)
        self.check_metadata(metadata)
        kernels()
        indices = metadata.indices_for(q.shape[0])
        return torch.ops.graphattn.sparse_mla_mega(q, kv, indices, self.sm_scale)
