"""Deliberately broken backends: they commit docs/design.md's two bugs, so the conformance suite
must fail on them with FreedCaptureBufferError.

* :class:`RebindingCounterBackend` -- the counter-rebinding bug: a zeroed scratch buffer sized in
  the rows planned so far, replaced by a new ``torch.zeros`` when an eager call needs more rows.
* :class:`RebindingQPadBackend` -- the q-pad bug: a padded-query buffer replaced whenever the
  row count changes, so capturing buckets largest first frees the larger buckets' buffer.

Both compute correct attention (through the torch reference); only their buffer handling is
wrong, which is exactly what graph capture turns into silent corruption.
"""

from __future__ import annotations

import torch

from graphattn.backends.torch_ref import TorchBackend
from graphattn.common.metadata import D_QK


class RebindingCounterBackend(TorchBackend):
    """Keeps its own ``[rows, heads]`` int32 scratch "counter"; ``plan`` rebinds it when a step
    has more rows than it holds (the bug: the captured one is freed)."""

    name = "broken_counter"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scratch: torch.Tensor | None = None

    def plan(self, metadata, indices, pad_to=None):
        super().plan(metadata, indices, pad_to)
        rows = max(indices.shape[0], pad_to or 0)
        if self.scratch is None or rows > self.scratch.shape[0]:
            self.scratch = torch.zeros(rows, self.num_heads, dtype=torch.int32, device=indices.device)

    def forward(self, q, kv, metadata):
        counter = self.scratch[: q.shape[0]]  # captured address
        counter.add_(1)  # "increment" ...
        counter.sub_(1)  # ... and "reset", as a split-KV kernel does
        out, lse = super().forward(q, kv, metadata)
        return out, lse + counter.float()


class RebindingQPadBackend(TorchBackend):
    """Caches a padded-q buffer and replaces it whenever the row count changes (the bug)."""

    name = "broken_qpad"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.q_pad_buffer: torch.Tensor | None = None

    def forward(self, q, kv, metadata):
        rows = q.shape[0]
        if self.q_pad_buffer is None or self.q_pad_buffer.shape[0] != rows:
            self.q_pad_buffer = torch.zeros(rows, self.num_heads, D_QK, dtype=q.dtype, device=q.device)
        self.q_pad_buffer.copy_(q)
        return super().forward(self.q_pad_buffer, kv, metadata)
