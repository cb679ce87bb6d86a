"""Shared plumbing of the Triton backends: lazy kernel import and metadata checks.

The kernels are imported on first use, not when the registry lists names, so ``graphattn list``
and ``--attn-backend`` parsing work (and report why) on a machine where Triton cannot load.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import ClassVar

from ..common.metadata import GraphMetadata
from .base import AttentionBackend


def kernels() -> ModuleType:
    """``graphattn.kernels`` (importing it registers the ``torch.ops.graphattn`` custom ops)."""
    return importlib.import_module("graphattn.kernels")


def split_plan(path: str, num_heads: int, topk: int):
    """``graphattn.kernels.split_plan``: the workspace/counter bound of a kernel path."""
    return importlib.import_module("graphattn.kernels.plan").split_plan(path, num_heads, topk)


class TritonBackend(AttentionBackend):
    """Base of the backends whose ``forward`` is one ``torch.ops.graphattn`` Triton op."""

    uses_triton = True
    kernel_path: ClassVar[str] = ""  # the graphattn.kernels path whose workspace plan sizes the metadata

    def make_metadata(self, max_rows: int) -> GraphMetadata:
        """Reserve the q-pad buffer (padding backends), the counter and the split-KV workspace
        that :func:`split_plan` says this backend's kernel may use, for ``max_rows`` query rows.

        Host side, not capturable; see :meth:`AttentionBackend.make_metadata`.
        """
        plan = split_plan(self.kernel_path, self.padded_heads or self.num_heads, self.topk)
        return GraphMetadata(
            max_rows, self.num_heads, self.topk, self.dtype, self.device,
            padded_heads=self.padded_heads, **plan.metadata_kwargs(),
        )

    def check_metadata(self, metadata: GraphMetadata) -> None:
        """Refuse metadata made for another configuration (cheap: Python attributes only)."""
        got = (metadata.num_heads, metadata.topk, metadata.dtype, metadata.padded_heads)
        want = (self.num_heads, self.topk, self.dtype, self.padded_heads)
        if got != want:
            raise ValueError(
                f"{self.name}: metadata was made for (num_heads, topk, dtype, padded_heads)="
                f"{got}, this backend needs {want}. Fix: use backend.make_metadata(max_rows)."
            )
        if self.uses_counter and metadata.counter is None:
            raise ValueError(f"{self.name}: metadata has no multi-CTA counter; use make_metadata")
        if self.uses_workspace and metadata.workspace_out is None:
            raise ValueError(f"{self.name}: metadata has no split-KV workspace; use make_metadata")
