"""Reference sparse MLA attention (DeepSeek style, one shared latent KV head) in float32/64.

``q [rows, heads, d_qk]``, ``kv [pool, d_qk]`` (V = ``kv[:, :d_v]``), ``indices [rows, topk]``
int32 into the pool. Index −1 (or anything outside ``[0, pool)``) is skipped and its KV row never
read (a NaN there cannot leak); duplicate indices count as many times as they appear. NaN in q
or in a selected KV row propagates into that row's out and lse. Returns ``out [rows, heads, d_v]`` and
``lse [rows, heads]`` (natural log). A row with no valid index gives out = 0 and lse = −inf.
``kv`` may also be 656-byte FP8 tokens (``[pool, 656]`` uint8, :mod:`.kv_layout`): the reference
dequantises them into q's dtype (:func:`.kv_layout.dequantize_kv`, what every attention path
reads) and attends over that cache in float64, as over a plain cache in q's dtype.
"""

from __future__ import annotations

import torch

from .kv_layout import dequantize_kv, is_fp8_kv
from .metadata import D_V


def sparse_mla_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = D_V,
    compute_dtype: torch.dtype = torch.float64,
    chunk_rows: int = 64,
    fp8_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention in ``compute_dtype``; returns ``(out, lse)`` in that dtype.

    Rows are processed ``chunk_rows`` at a time so the gathered KV stays small. FP8 ``kv``
    (uint8 ``[pool, 656]``, read as ``fp8_dtype``; default: the platform's format) is
    dequantised into q's dtype first: ``dtype(float32(fp8) * scale)``, rope in q's dtype.
    """
    if is_fp8_kv(kv):
        # [pool, 576] in q's dtype: the cache every path multiplies (each value rounded once to
        # q's dtype; float32 q keeps the float32 products), then exact from here on.
        kv = dequantize_kv(kv, fp8_dtype, q.dtype)
    if q.dim() != 3 or kv.dim() != 2 or indices.dim() != 2:
        raise ValueError(
            f"expected q [rows, heads, d], kv [pool, d], indices [rows, topk]; got "
            f"{tuple(q.shape)}, {tuple(kv.shape)}, {tuple(indices.shape)}"
        )
    if q.shape[0] != indices.shape[0] or q.shape[2] != kv.shape[1]:
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, kv {tuple(kv.shape)}, indices {tuple(indices.shape)}"
        )
    rows, heads, _ = q.shape
    out = torch.empty(rows, heads, d_v, dtype=compute_dtype, device=q.device)
    lse = torch.empty(rows, heads, dtype=compute_dtype, device=q.device)
    kv_c = kv.to(compute_dtype)
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        idx = indices[r0:r1].long()
        valid = (idx >= 0) & (idx < kv.shape[0])  # [n, topk]
        # Skipped indices are never read: their rows are zeros, whatever the pool holds there.
        k = kv_c[idx.clamp(0, kv.shape[0] - 1)].masked_fill(~valid[..., None], 0.0)  # [n, topk, d_qk]
        s = torch.einsum("nhd,ntd->nht", q[r0:r1].to(compute_dtype), k) * sm_scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [n, heads]; -inf where no valid index
        # Skipped slots get weight 0 by mask (a row with none valid: -inf - -inf = NaN there),
        # so NaN from q or a selected KV row still propagates into out and lse.
        p = torch.exp(s - row_lse[..., None]).masked_fill(~valid[:, None, :], 0.0)
        out[r0:r1] = torch.einsum("nht,ntv->nhv", p, k[..., :d_v])
        lse[r0:r1] = row_lse
    return out, lse
