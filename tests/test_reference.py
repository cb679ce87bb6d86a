"""The float64 reference against a naive per-row, per-head loop."""

import math

import pytest
import torch

from graphattn.common import sparse_mla_reference


def naive(q, kv, indices, scale, d_v=512):
    rows, heads, _ = q.shape
    out = torch.zeros(rows, heads, d_v, dtype=torch.float64)
    lse = torch.full((rows, heads), -math.inf, dtype=torch.float64)
    for r in range(rows):
        toks = [int(i) for i in indices[r] if 0 <= int(i) < kv.shape[0]]
        if not toks:
            continue
        for h in range(heads):
            s = [float(q[r, h].double() @ kv[t].double()) * scale for t in toks]
            m = max(s)
            w = [math.exp(x - m) for x in s]
            total = sum(w)
            lse[r, h] = m + math.log(total)
            for wi, t in zip(w, toks):
                out[r, h] += wi / total * kv[t, :d_v].double()
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_reference_matches_naive_loop(dtype):
    rows, heads, topk, pool = 5, 3, 9, 40
    q = torch.randn(rows, heads, 576).to(dtype)
    kv = torch.randn(pool, 576).to(dtype)
    idx = torch.randint(0, pool, (rows, topk), dtype=torch.int32)
    idx[0, 2:5] = -1  # skipped entries
    idx[1, :] = idx[1, 0]  # duplicates count as many times as they appear
    idx[2, :] = -1  # an all-invalid row
    idx[3, 4] = pool + 3  # out of range is skipped, never read
    scale = 576**-0.5
    out, lse = sparse_mla_reference(q, kv, idx, scale, chunk_rows=2)
    ref_out, ref_lse = naive(q, kv, idx, scale)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-10)
    assert torch.all(out[2] == 0) and torch.all(torch.isneginf(lse[2]))


def test_duplicates_weigh_like_repeats():
    kv = torch.randn(4, 576, dtype=torch.float64)
    q = torch.randn(1, 2, 576, dtype=torch.float64)
    twice = sparse_mla_reference(q, kv, torch.tensor([[0, 0, 1]], dtype=torch.int32), 0.1)
    ref = naive(q, kv, torch.tensor([[0, 0, 1]]), 0.1)
    torch.testing.assert_close(twice[0], ref[0])
    once = sparse_mla_reference(q, kv, torch.tensor([[0, 1, -1]], dtype=torch.int32), 0.1)
    assert not torch.allclose(twice[0], once[0])


def test_reference_rejects_bad_shapes():
    with pytest.raises(ValueError, match="expected q"):
        sparse_mla_reference(torch.randn(2, 576), torch.randn(4, 576), torch.zeros(2, 3), 1.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        sparse_mla_reference(
            torch.randn(2, 1, 576), torch.randn(4, 576), torch.zeros(3, 3, dtype=torch.int32), 1.0
        )
