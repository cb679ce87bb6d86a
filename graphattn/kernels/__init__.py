"""Triton sparse MLA kernels, registered as torch custom ops in the ``graphattn`` namespace.

* :func:`sparse_mla_flashmla` (``torch.ops.graphattn.sparse_mla_flashmla``): padded heads,
  split-KV partials in a caller workspace, separate combine launch.
* :func:`sparse_mla_trtllm` (``torch.ops.graphattn.sparse_mla_trtllm``): any head count,
  multi-CTA split-KV combined in one launch with a self-resetting counter.
* :func:`sparse_mla_mega` (``torch.ops.graphattn.sparse_mla_mega``): any head count, one pass,
  no workspace.
* :func:`split_plan`: the workspace/counter a path may need, to size ``GraphMetadata``.

Without a GPU the kernels run under the Triton interpreter. Triton decides interpreter vs
compiler when a function is decorated, so ``TRITON_INTERPRET=1`` is set here (unless the
caller already set it) before any kernel module is imported.
"""

from __future__ import annotations

import os

from ..common.platform import current_platform

if current_platform().uses_triton_interpreter:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .flashmla import sparse_mla_flashmla  # noqa: E402
from .mega import sparse_mla_mega  # noqa: E402
from .plan import PATHS, SplitPlan, split_plan  # noqa: E402
from .trtllm import sparse_mla_trtllm  # noqa: E402

__all__ = [
    "PATHS",
    "SplitPlan",
    "sparse_mla_flashmla",
    "sparse_mla_mega",
    "sparse_mla_trtllm",
    "split_plan",
]
