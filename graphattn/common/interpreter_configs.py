"""Launch settings for the Triton interpreter (no GPU: CPU platform, or cuda/hip forced on CPU).

The interpreter runs one program at a time in numpy, so tiles are small; ``target_programs``
asks for many programs so that small test shapes still exercise split-KV (several splits per
row, a combine, the trtllm counter). Keys: see ``graphattn.kernels.plan``.
"""

from __future__ import annotations

from typing import Any

from .platform import LaunchTable

# The split paths load the index tile one iteration ahead (IDX_AHEAD, as on sm_90), mega does
# not, and flashmla runs the tokens-major products (KV_MAJOR, as sm_90 does at few rows): the
# interpreter tests cover every form of the KV loop.
_SPLIT = {"BLOCK_H": 16, "BLOCK_N": 16, "IDX_AHEAD": 1, "num_warps": 4, "num_stages": 1,
          "max_splits": 4, "min_split_blocks": 1, "target_programs": 64}
_CONFIGS: dict[str, dict[str, Any]] = {
    "flashmla": {**_SPLIT, "KV_MAJOR": 1},
    # flashmla's heads-major tiles, which it runs for inputs that are not 16-byte aligned
    "flashmla_triton": _SPLIT,
    "trtllm": _SPLIT,
    "mega": {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    "flashmla_combine": {"num_warps": 4, "num_stages": 1},
}


def interpreter_config(path: str, **shape: Any) -> dict[str, Any]:
    """Interpreter launch settings for kernel ``path`` (the shape does not change them)."""
    if path not in _CONFIGS:
        raise ValueError(f"Unknown kernel path: {path!r}. Valid options are: {', '.join(_CONFIGS)}")
    return dict(_CONFIGS[path])


class InterpreterLaunchTable(LaunchTable):
    """The launch table without a GPU (any graph rules forced onto the CPU use it too)."""

    name = "interpreter"

    def settings(self, path: str, **shape: Any) -> dict[str, Any]:
        return interpreter_config(path, **shape)
