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


def _nan_case():
    """Random inputs whose unselected KV rows (token 0, where a -1 would clamp, and the last,
    where an out-of-range index would) hold NaN and inf, and whose q has a NaN in row 1 head 2
    and in every head of row 2, which selects nothing."""
    rows, heads, topk, pool = 4, 3, 7, 30
    q = torch.randn(rows, heads, 576, dtype=torch.float64)
    kv = torch.randn(pool, 576, dtype=torch.float64)
    kv[0], kv[-1] = float("nan"), float("inf")
    idx = torch.randint(1, pool - 1, (rows, topk), dtype=torch.int32)
    idx[0, :3] = -1
    idx[1, 5] = pool + 4  # out of range: skipped
    idx[2, :] = -1
    q[1, 2, 10] = float("nan")
    q[2, :, 0] = float("nan")
    return q, kv, idx


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_nan_reaches_only_what_selected_it(backend):
    q, kv, idx = _nan_case()
    scale = 576**-0.5
    if backend == "reference":
        out, lse = sparse_mla_reference(q, kv, idx, scale)
    else:
        from graphattn.backends import get_backend_class

        b = get_backend_class("torch")(q.shape[1], idx.shape[1], torch.float32, platform=None)
        md = b.make_metadata(q.shape[0])
        b.plan(md, idx)
        out, lse = b.forward(q.float(), kv.float(), md)
    clean = torch.ones(q.shape[:2], dtype=torch.bool)
    clean[1, 2] = False
    clean[2] = False
    # Rows and heads without NaN in q match the naive loop over finite selected rows only.
    ref_out, ref_lse = naive(q, kv, idx, scale)
    torch.testing.assert_close(out.double()[clean], ref_out[clean], atol=1e-4, rtol=1e-4,
                               msg=lambda m: f"{backend}: unselected NaN/inf KV rows leaked: {m}")
    torch.testing.assert_close(lse.double()[clean], ref_lse[clean], atol=1e-4, rtol=1e-4,
                               msg=lambda m: f"{backend}: {m}")
    assert out[1, 2].isnan().all() and lse[1, 2].isnan(), f"{backend}: NaN in q was swallowed"
    assert (out[2] == 0).all() and (lse[2] == -math.inf).all(), (
        f"{backend}: a row with no valid index must give out 0, lse -inf even with NaN in q; "
        f"got out {out[2, :, :4]}, lse {lse[2]}")
