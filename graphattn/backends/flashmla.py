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

from ..common.metadata import GraphMetadata
from ._triton import TritonBackend, kernels
from .base import GraphSupport


class FlashMLABackend(TritonBackend):
    """Pads q to ``head_pad_multiple`` heads; split-KV partials in a workspace; combine kernel."""

    name = "flashmla"
    supported_dtypes = (torch.bfloat16, torch.float16)
    pads_q = True
    uses_workspace = True
    graph_support = GraphSupport.FULL
    kernel_path = "flashmla"
    description = "FlashMLA-style: q padded to 64 heads, split-KV workspace + combine kernel"

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`AttentionBackend.forward`. Capturable.

        Returns views ``out[:, :num_heads]`` / ``lse[:, :num_heads]`` of the padded kernel output
        (non-contiguous when heads were padded).
        """
        self.check_inputs(q, kv)
        self.check_metadata(metadata)
        rows = q.shape[0]
        kernels()
        q_padded = metadata.zero_padded_q(q)  # [rows, padded_heads, 576], a slice of q_pad
        ws_out, ws_lse = metadata.workspace_for(rows)
        out, lse = torch.ops.graphattn.sparse_mla_flashmla(
            q_padded, kv, metadata.indices_for(rows), self.sm_scale, ws_out, ws_lse
        )
        return out[:, : self.num_heads], lse[:, : self.num_heads]
