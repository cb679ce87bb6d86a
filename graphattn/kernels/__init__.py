"""Triton sparse MLA kernels, registered as torch custom ops in the ``graphattn`` namespace.

* :func:`sparse_mla_flashmla` (``torch.ops.graphattn.sparse_mla_flashmla``): any head count,
  split-KV partials in a caller workspace, separate combine launch.
* :func:`sparse_mla_trtllm` (``torch.ops.graphattn.sparse_mla_trtllm``): any head count,
  multi-CTA split-KV combined in one launch with a self-resetting counter.
* :func:`sparse_mla_mega` (``torch.ops.graphattn.sparse_mla_mega``): any head count, one pass,
  no workspace.
* :func:`split_plan`: the workspace/counter a path may need, to size ``GraphMetadata``.
* ``graphattn.kernels.launch``: the :class:`KernelSpec` of each path and its memoised
  :class:`LaunchPlan` per shape.

The kernel modules (and Triton with them) load on first use of an op, so the specs and plans
can be imported where Triton cannot; :func:`register_ops` loads all three. Without a GPU the
kernels run under the Triton interpreter, with ``TRITON_INTERPRET=1`` set only while triton is
first imported and kernels are defined and launched (``graphattn.kernels._jit``), never left in
the process environment; a value the caller set is left alone.
"""

from __future__ import annotations

import importlib
from typing import Any

from .launch import SPECS, KernelSpec, LaunchPlan
from .plan import PATHS, SplitPlan, split_plan

_OPS = {"sparse_mla_flashmla": "flashmla", "sparse_mla_trtllm": "trtllm", "sparse_mla_mega": "mega"}


def register_ops() -> None:
    """Import the three kernel modules, registering ``torch.ops.graphattn.*`` (idempotent)."""
    for module in _OPS.values():
        importlib.import_module(f"{__name__}.{module}")


def __getattr__(name: str) -> Any:
    if name in _OPS:
        return getattr(importlib.import_module(f"{__name__}.{_OPS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PATHS",
    "SPECS",
    "KernelSpec",
    "LaunchPlan",
    "SplitPlan",
    "register_ops",
    "sparse_mla_flashmla",
    "sparse_mla_mega",
    "sparse_mla_trtllm",
    "split_plan",
]
