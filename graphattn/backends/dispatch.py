"""The ``dispatch`` backend (what ``--attn-backend auto`` runs on a GPU): the fastest kernel path
per row count.

The fastest kernel path depends on the shape and the GPU: on the H200 flashmla measures fastest
at every shape of the kernel table since its warp-specialised kernel, while before it trtllm and
flashmla_mega were 25% faster at 16 heads x 512 rows (docs/benchmarks.md, "Kernels"); other
GPUs are measured apart or not at all. This backend picks, **at plan
time and per row count**, the path the platform measured fastest at the nearest measured shape
(``Platform.fastest_path``, from the launch table's ``kernel_times``). A graph bucket captured at
``rows`` therefore holds one path, the one planned for ``rows``; a replay never switches.

Graph safety is unchanged: the metadata holds everything every path may use (the index table,
trtllm's counter, a split-KV workspace pool sized for the larger of flashmla's and trtllm's
split plans), reserved before any capture and never replaced. Where the platform measured
nothing (AMD, GPUs other than sm_90) the choice falls back to trtllm at <= 16 heads and flashmla
above, the static order ``auto`` used before.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8
from ..common.metadata import GraphMetadata
from ..kernels.launch import FLASHMLA, MEGA, SPECS, TRTLLM, KernelSpec, LaunchPlan
from ._triton import TritonBackend
from .base import GraphSupport
from .flashmla import FlashMLABackend
from .flashmla_mega import FlashMLAMegaBackend
from .trtllm import TrtllmBackend

# Heads at or below which the unmeasured fallback takes trtllm (its 16-head tile pads nothing).
FEW_HEADS = 16


class DispatchBackend(TritonBackend):
    """flashmla, trtllm or flashmla_mega, chosen per row count from measured kernel times."""

    name = "dispatch"
    supported_dtypes = (torch.bfloat16, torch.float16)
    supported_kv_dtypes = (KV_AUTO, KV_FP8)
    kernel_specs = (FLASHMLA, TRTLLM, MEGA)
    graph_support = GraphSupport.FULL
    description = "auto's GPU choice: the path measured fastest per row count (flashmla, trtllm, mega)"

    # The single-path backends' plan builders, applied to this backend (which loads every
    # kernel module they read).
    _builders: ClassVar[dict[str, Callable[..., LaunchPlan]]] = {
        FLASHMLA.name: FlashMLABackend._build_plan,
        TRTLLM.name: TrtllmBackend._build_plan,
        MEGA.name: FlashMLAMegaBackend._build_plan,
    }

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._paths: dict[int, str] = {}  # rows -> path, decided once per row count

    def path_for(self, rows: int) -> str:
        """The kernel path (``flashmla``, ``trtllm`` or ``mega``) a call of ``rows`` query rows
        runs: the platform's fastest at the nearest measured shape, else the fallback."""
        path = self._paths.get(rows)
        if path is None:
            path = self.platform.fastest_path(rows, self.num_heads, self.topk, self.kv_fp8, tuple(self._builders))
            if path is None:
                path = TRTLLM.name if self.num_heads <= FEW_HEADS else FLASHMLA.name
            self._paths[rows] = path
        return path

    def _build_plan(self, rows: int, aligned: bool, ws_splits: int) -> LaunchPlan:
        return self._builders[self.path_for(rows)](self, rows, aligned, ws_splits)

    def _spec_for(self, metadata: GraphMetadata, q: torch.Tensor, kv: torch.Tensor) -> KernelSpec:
        # The path depends on the row count alone (not on alignment, which torch.compile cannot
        # trace): the custom op then plans the same path the launch plan has.
        return SPECS[self.path_for(q.shape[0])]
