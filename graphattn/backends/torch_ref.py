"""The ``torch`` backend: the float32 PyTorch reference as a backend.

Pure torch ops, no host synchronisation, so it runs eagerly and inside any graph (real or
emulated) on every platform. It is slow and memory hungry (it gathers the top-k KV rows), so it
is the fallback where no Triton kernel can run and the baseline the others are measured against.

On a GPU an eager call replays a private graph of its own ops once its key repeats
(:class:`~graphattn.backends._replay.EagerGraphs`): four launches instead of ~20, the same
results. ``GRAPHATTN_TORCH_GRAPHS=0`` (read at import) turns that off.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8
from ..common.metadata import D_QK, D_V, GraphMetadata
from ..common.platform import Platform, current_platform
from ..common.validation import env_flag
from ._replay import EagerGraphs
from .base import AttentionBackend, GraphSupport

# Bytes of gathered float32 KV per chunk: bounds the transient memory of one call (the gather is
# [chunk_rows, topk, 576] float32) while keeping the number of launched ops small.
_GATHER_BUDGET_BYTES = 256 << 20
# Calls whose intermediates and statics take more run op by op: their ops keep the GPU busy
# about as long as launching them keeps the host or longer (the H200: 8 rows x 128 heads x topk
# 2048 took ~300 µs of GPU time against ~240 µs of host time op by op), and the private graphs'
# pool keeps the intermediates of its largest call reserved. Counted per row: the gathered KV
# twice over (kv's dtype or FP8 bytes, then float32; the FP8 path's dequantised copies fit in
# that), the [heads, topk] float32 scores and weights, and the static q, out and lse.
_GRAPH_BUDGET_BYTES = 128 << 20
GRAPHS_ENV = "GRAPHATTN_TORCH_GRAPHS"
# Read once at import: private graphs for eager calls on a GPU, unless off (0/false/no/off).
# Any other value raises when the backend is loaded: a typo must not silently change the path.
_EAGER_GRAPHS = env_flag(GRAPHS_ENV, default=True)
_F32_LOWEST = torch.finfo(torch.float32).min
_F32_TINY = torch.finfo(torch.float32).tiny


class TorchBackend(AttentionBackend):
    """Sparse MLA in float32 torch ops: gather, two einsums, a masked log-sum-exp."""

    name: ClassVar[str] = "torch"
    supported_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)  # FP8 tokens are dequantised after the gather
    graph_support = GraphSupport.FULL
    description = "float32 PyTorch reference (any platform, capturable, slow)"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        segment_class = self.platform.eager_graph_class() if _EAGER_GRAPHS else None
        # The private graphs of eager calls (None: every call runs its ops; no GPU, or off).
        self._graphs = EagerGraphs(segment_class, self.name) if segment_class is not None else None
        # Rows of the calls that may use them: gather and statics (q, out, lse) in budget.
        per_row = (2 * self.topk * D_QK + 2 * self.num_heads * self.topk + self.num_heads * (D_QK + D_V + 1)) * 4
        self._graph_rows = _GRAPH_BUDGET_BYTES // per_row

    @classmethod
    def notes(cls, platform: Platform | None = None) -> list[str]:
        """See :meth:`AttentionBackend.notes`; on a GPU, what an eager call does."""
        platform = platform or current_platform()
        notes = super().notes(platform)
        if platform.eager_graph_class() is not None:
            notes.append(f"eager calls replay a private graph of their ops once a call repeats "
                         f"({GRAPHS_ENV}=0: off)" if _EAGER_GRAPHS else f"eager calls run op by op ({GRAPHS_ENV}=0)")
        return notes

    def _chunk_rows(self, rows: int) -> int:
        per_row = self.topk * D_QK * 4
        return max(1, min(rows, _GATHER_BUDGET_BYTES // max(per_row, 1)))

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`AttentionBackend.forward`. Capturable: static shapes, no host syncs.

        On a GPU, an eager call (no capture, tracing, compiling or dispatch mode) of one chunk
        within the graph budget that reads the metadata's persistent index table goes through
        the backend's private graphs: the second call with a key (device, stream, q shape, kv
        and index-table address and layout) captures these very ops, later calls replay them.
        """
        self.check_call(q, kv, metadata)
        if out is not None:
            self.check_out(q, kv, out)
        rows = q.shape[0]
        indices = metadata.indices_for(rows)  # [rows, topk] int32, -1 = skip
        step = self._chunk_rows(rows)
        graphs = self._graphs
        if graphs is not None and rows <= step and rows <= self._graph_rows and not metadata.oversized:
            res = graphs.run(self._attend, q, kv, indices, out)
            if res is not None:
                return res
        if step >= rows and out is None:  # the common case: one chunk, no output copies
            o, lse = self._attend(q, kv, indices)
            return o.to(q.dtype), lse
        if out is None:
            out = (torch.empty(rows, self.num_heads, D_V, dtype=q.dtype, device=q.device),
                   torch.empty(rows, self.num_heads, dtype=torch.float32, device=q.device))
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            o, lse = self._attend(q[r0:r1], kv, indices[r0:r1])
            out[0][r0:r1].copy_(o)
            out[1][r0:r1].copy_(lse)
        return out

    def _attend(
        self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [n, H, 576], indices: [n, topk] -> out [n, H, 512] f32, lse [n, H] f32.
        # Few, large ops: an eager call pays a launch per op, so each one is chosen to do the
        # most (batched matmuls, not einsum; the softmax and lse from one max, one exp and one
        # sum).
        safe = indices.clamp(0, kv.shape[0] - 1)
        skipped = safe != indices  # -1 and anything else outside the pool: never read
        k = self.kv_rows_float(kv[safe])  # [n, topk, 576] f32 (FP8 tokens dequantised)
        # An unselected row's data must not reach the output, not even as 0 * NaN.
        k.masked_fill_(skipped[..., None], 0.0)
        s = torch.bmm(q.float(), k.transpose(1, 2)).mul_(self.sm_scale)  # [n, H, topk]
        # Masked after the product, not added as a -inf bias: a NaN or inf in q times a
        # skipped slot's zeros is NaN, and a skipped slot must contribute nothing.
        s.masked_fill_(skipped[:, None, :], float("-inf"))
        # A row with no valid index has max -inf: shift it by the lowest float instead, so it
        # gets weights exp(-inf) = 0, sum 0, lse -inf and out 0. NaN (from q or a selected KV
        # row) passes through max, clamp and exp, and so propagates, as in the kernels.
        m = s.amax(dim=-1, keepdim=True).clamp_min_(_F32_LOWEST)
        e = (s - m).exp_()
        total = e.sum(dim=-1, keepdim=True)
        lse = total.log().add_(m).squeeze(-1)
        out = torch.bmm(e.div_(total.clamp_min(_F32_TINY)), k[..., :D_V])
        return out, lse
