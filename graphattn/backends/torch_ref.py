"""The ``torch`` backend: the float32 PyTorch reference as a backend.

Pure torch ops, no host synchronisation, so it runs eagerly and inside any graph (real or
emulated) on every platform. It is slow and memory hungry (it gathers the top-k KV rows), so it
is the fallback where no Triton kernel can run and the baseline the others are measured against.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8
from ..common.metadata import D_QK, D_V, GraphMetadata
from .base import AttentionBackend, GraphSupport

# Bytes of gathered float32 KV per chunk: bounds the transient memory of one call (the gather is
# [chunk_rows, topk, 576] float32) while keeping the number of launched ops small.
_GATHER_BUDGET_BYTES = 256 << 20


class TorchBackend(AttentionBackend):
    """Sparse MLA in float32 torch ops: gather, two einsums, a masked log-sum-exp."""

    name: ClassVar[str] = "torch"
    supported_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)  # FP8 tokens are dequantised after the gather
    graph_support = GraphSupport.FULL
    description = "float32 PyTorch reference (any platform, capturable, slow)"

    def _chunk_rows(self, rows: int) -> int:
        per_row = self.topk * D_QK * 4
        return max(1, min(rows, _GATHER_BUDGET_BYTES // max(per_row, 1)))

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`AttentionBackend.forward`. Capturable: static shapes, no host syncs."""
        self.check_inputs(q, kv)
        rows = q.shape[0]
        indices = metadata.indices_for(rows)  # [rows, topk] int32, -1 = skip
        out = torch.empty(rows, self.num_heads, D_V, dtype=q.dtype, device=q.device)
        lse = torch.empty(rows, self.num_heads, dtype=torch.float32, device=q.device)
        step = self._chunk_rows(rows)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            o, l = self._attend(q[r0:r1], kv, indices[r0:r1])
            out[r0:r1].copy_(o)
            lse[r0:r1].copy_(l)
        return out, lse

    def _attend(
        self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [n, H, 576], indices: [n, topk] -> out [n, H, 512] f32, lse [n, H] f32
        pool = kv.shape[0]
        idx = indices.long()
        valid = (idx >= 0) & (idx < pool)  # [n, topk]
        # [n, topk, 576] f32; skipped indices read as zeros (never NaN from the pool)
        k = self.kv_rows_float(kv[idx.clamp(0, pool - 1)]).masked_fill(~valid[..., None], 0.0)
        s = torch.einsum("nhd,ntd->nht", q.float(), k) * self.sm_scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [n, H]; -inf for a row with no valid index
        # exp(-inf - -inf) is NaN for empty rows: nan_to_num turns their weights into 0.
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        out = torch.einsum("nht,ntv->nhv", p, k[..., :D_V])
        return out, lse
