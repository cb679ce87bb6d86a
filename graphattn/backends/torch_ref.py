"""The ``torch`` backend: the float32 PyTorch reference as a backend.

Pure torch ops, no host synchronisation, so it runs eagerly and inside any graph (real or
emulated) on every platform. It is slow and memory hungry (it gathers the top-k KV rows), so it
is the fallback where no Triton kernel can run and the baseline the others are measured against.

An eager call pays host time for every op it dispatches (about 12 µs each on an H200's host),
so :meth:`TorchBackend._attend` is written for the fewest dispatched ops: 11 for float32 q and
kv, 13 for bf16/fp16 (two dtype conversions), 3-5 more for FP8 tokens (the dequantisation);
``tests/test_launch_path.py`` pins the counts. ``logsumexp`` is one of them although ATen runs
it as ~9 kernels (max, exp, sum, log and their inf guards) from C++, which costs a launch each
but no Python or autograd dispatch.
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
    """Sparse MLA in float32 torch ops: gather, a scaled batched matmul, a masked
    log-sum-exp and softmax, a batched matmul."""

    name: ClassVar[str] = "torch"
    supported_dtypes = (torch.bfloat16, torch.float16, torch.float32)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)  # FP8 tokens are dequantised after the gather
    graph_support = GraphSupport.FULL
    description = "float32 PyTorch reference (any platform, capturable, slow)"

    def _chunk_rows(self, rows: int) -> int:
        per_row = self.topk * D_QK * 4
        return max(1, min(rows, _GATHER_BUDGET_BYTES // max(per_row, 1)))

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`AttentionBackend.forward`. Capturable: static shapes, no host syncs."""
        self.check_call(q, kv, metadata)
        if out is not None:
            self.check_out(q, out)
        rows = q.shape[0]
        indices = metadata.indices_for(rows)  # [rows, topk] int32, -1 = skip
        step = self._chunk_rows(rows)
        if step >= rows:  # the common case: one chunk, written straight into `out` if given
            return self._attend(q, kv, indices, out)
        if out is None:
            out = (torch.empty(rows, self.num_heads, D_V, dtype=q.dtype, device=q.device),
                   torch.empty(rows, self.num_heads, dtype=torch.float32, device=q.device))
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            self._attend(q[r0:r1], kv, indices[r0:r1], (out[0][r0:r1], out[1][r0:r1]))
        return out

    def _attend(
        self, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [n, H, 576], indices: [n, topk] -> out [n, H, 512] in q's dtype, lse [n, H] f32,
        # written into `out` (contiguous, checked by the caller) when given.
        n, topk = indices.shape
        safe = indices.clamp(0, kv.shape[0] - 1)  # [n, topk]: every slot can be read
        skipped = safe != indices  # -1 and anything else outside the pool: its row is not used
        # index_select takes the int32 index as it is (kv[safe] would copy it to int64 first).
        rows = kv.index_select(0, safe.reshape(-1)).view(n, topk, kv.shape[1])
        if self.kv_fp8:  # [n, topk, 656] uint8 -> [n, topk, 576] f32, unselected tokens too
            rows = self.kv_rows_float(rows)
        # No skipped slot may keep the pool's data (an unselected row's NaN or inf must not
        # reach the output, not even as 0 * NaN). One op masks and converts to float32: `where`
        # computes in float32 because its other operand is float32. Its values only need to be
        # finite (a skipped slot's score is masked and its weight is exactly 0), so they are the
        # clamped indices' bits read as float32, a view that costs no op: 0 <= index < pool,
        # and every int32 below 0x7F800000 (the bits of +inf) is a finite float32.
        k = torch.where(skipped[..., None], safe.view(torch.float32)[..., None], rows)  # [n, topk, 576]
        # Scale fused into the product; beta=0 never reads the first argument (any float32
        # tensor that broadcasts to [n, H, topk]; NaN or inf in it would not propagate).
        s = torch.baddbmm(k[:, None, :, 0], q.float(), k.transpose(1, 2), beta=0, alpha=self.sm_scale)
        # Masked after the product, not added as a -inf bias: a NaN or inf in q times a
        # skipped slot's finite values is NaN, and a skipped slot must contribute nothing.
        s.masked_fill_(skipped[:, None, :], float("-inf"))  # [n, H, topk]
        # logsumexp gives -inf for a row with no valid index (or only -inf scores), where
        # softmax gives exp(-inf - -inf) = NaN: those rows get weight 0 (out 0) instead. NaN (from
        # q or a selected KV row) passes through both, and through the == -inf test unchanged.
        # softmax normalises exp(s - max) by its sum, so the weights are as exact as the
        # scores even where |lse| is large (exp(s - lse) would lose lse's rounding). A +inf
        # score gives out NaN and lse +inf, as the float64 reference does.
        lse = torch.logsumexp(s, -1, out=None if out is None else out[1])  # [n, H]
        p = torch.softmax(s, -1).masked_fill_((lse == float("-inf"))[..., None], 0.0)
        v = k[..., :D_V]  # the skipped slots' finite values times their weight 0: exactly 0
        if out is None:
            return torch.bmm(p, v).to(q.dtype), lse
        if out[0].dtype == torch.float32:
            torch.bmm(p, v, out=out[0])
        else:
            out[0].copy_(torch.bmm(p, v))  # the conversion to q's dtype is the copy
        return out
