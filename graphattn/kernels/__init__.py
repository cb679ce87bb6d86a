"""Triton sparse MLA kernels, registered as torch custom ops in the ``graphattn`` namespace.

* :func:`sparse_mla_flashmla` (``torch.ops.graphattn.sparse_mla_flashmla``): padded heads,
  split-KV partials in a caller workspace, separate combine launch.
* :func:`sparse_mla_trtllm` (``torch.ops.graphattn.sparse_mla_trtllm``): any head count,
  multi-CTA split-KV combined in one launch with a self-resetting counter.
* :func:`sparse_mla_mega` (``torch.ops.graphattn.sparse_mla_mega``): any head count, one pass,
  no workspace.
* :func:`split_plan`: the workspace/counter a path may need, to size ``GraphMetadata``.

Without a GPU the kernels run under the Triton interpreter: ``import graphattn`` sets
``TRITON_INTERPRET=1`` (unless the caller set it) before any kernel is defined.
"""

from __future__ import annotations

from .flashmla import sparse_mla_flashmla
from .mega import sparse_mla_mega
from .plan import PATHS, SplitPlan, split_plan
from .trtllm import sparse_mla_trtllm

__all__ = [
    "PATHS",
    "SplitPlan",
    "sparse_mla_flashmla",
    "sparse_mla_mega",
    "sparse_mla_trtllm",
    "split_plan",
]
