"""Typed launch plans: one :class:`KernelSpec` per kernel path, one :class:`LaunchPlan` per shape.

A kernel path is declared once as a :class:`KernelSpec` (which custom op runs it, whether it
needs the multi-CTA counter, a split-KV workspace, heads padded to the platform's multiple, a
separate combine launch); backends derive their capability data from it. A :class:`LaunchPlan`
is everything a call needs that does not depend on the tensors' contents: the kernel function,
its grid, split count and constexprs, and the combine launch. It is built once per
(platform, rows, heads, topk, workspace bound, alignment) on the host and memoised
(:func:`memoised`), so an eager call only reads it and launches.

The custom ops stay the public entry points (``torch.compile``, the capture sanitizer and the
CPU graph emulator see them through the dispatcher). :func:`direct_launch_allowed` says when a
backend may skip the dispatcher's Python overhead and run the plan itself: nothing is tracing,
compiling or watching the dispatch (no ``TorchDispatchMode`` on the stack).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch

from ..common.platform import kernels_interpreted, triton_interpreter_env


@dataclass(frozen=True)
class KernelSpec:
    """One kernel path, declared once.

    Attributes:
        name: the path name the platform's launch tables know (``flashmla``, ``trtllm``, ``mega``).
        op_name: the custom op, ``torch.ops.graphattn.<op_name>``.
        uses_counter: needs ``GraphMetadata.counter_for(rows)`` (int32 zeros, reset by the kernel).
        uses_workspace: writes split-KV partials to ``GraphMetadata.workspace_for(rows, splits)``.
        pads_heads: needs ``heads % platform.head_pad_multiple == 0`` (q padded by the metadata).
        combine: merges split partials in a second launch (otherwise in the same launch, or no split).
        alignment: its kernel choice depends on whether q/kv rows are 16-byte aligned
            (:func:`aligned_16`); paths without it skip that check on every call.
    """

    name: str
    op_name: str
    uses_counter: bool
    uses_workspace: bool
    pads_heads: bool
    combine: bool
    alignment: bool = False

    @property
    def op(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """The registered custom op (``graphattn.kernels`` must have been imported)."""
        return getattr(torch.ops.graphattn, self.op_name)


FLASHMLA = KernelSpec("flashmla", "sparse_mla_flashmla", uses_counter=False, uses_workspace=True,
                      pads_heads=True, combine=True, alignment=True)
TRTLLM = KernelSpec("trtllm", "sparse_mla_trtllm", uses_counter=True, uses_workspace=True,
                    pads_heads=False, combine=False)
MEGA = KernelSpec("mega", "sparse_mla_mega", uses_counter=False, uses_workspace=False,
                  pads_heads=False, combine=False)
SPECS = {s.name: s for s in (FLASHMLA, TRTLLM, MEGA)}


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``fn[grid](*args, **kwargs)`` with fixed constexprs and options."""

    fn: Any  # a @triton.jit or @gluon.jit function
    grid: tuple[int, ...]
    kwargs: Mapping[str, Any]  # constexprs and Triton launch options

    def __call__(self, *args: Any) -> Any:
        return self.fn[self.grid](*args, **self.kwargs)


class InterpretedLaunch(Launch):
    """A :class:`Launch` in the Triton interpreter (no GPU). Triton still reads
    ``TRITON_INTERPRET`` while it runs a kernel (modules it imports lazily), so the run happens
    inside :func:`~graphattn.common.platform.triton_interpreter_env`."""

    def __call__(self, *args: Any) -> Any:
        with triton_interpreter_env():
            return self.fn[self.grid](*args, **self.kwargs)


def make_launch(fn: Any, grid: tuple[int, ...], **kwargs: Any) -> Launch:
    """A :class:`Launch` whose keyword arguments cannot change after planning (an
    :class:`InterpretedLaunch` where kernels are interpreted; GPU launches pay nothing)."""
    cls = InterpretedLaunch if kernels_interpreted() else Launch
    return cls(fn, grid, MappingProxyType(kwargs))


@dataclass(frozen=True)
class LaunchPlan:
    """How one call of a kernel path runs at one shape (immutable, memoised).

    Attributes:
        spec: the kernel path.
        rows, heads, topk: the shape planned (heads as the kernel sees them, i.e. padded).
        splits: split-KV partials per row (1: the first launch writes ``out``/``lse`` directly).
        split_len: indices per split (a multiple of the KV tile).
        head_blocks: programs per (row, split).
        kernel: which function runs (``wgmma``, ``triton_kv_major``, ``triton``).
        main: the attention launch; ``combine``: flashmla's merge of the partials, or ``None``.
    """

    spec: KernelSpec
    rows: int
    heads: int
    topk: int
    splits: int
    split_len: int
    head_blocks: int
    kernel: str
    main: Launch
    combine: Launch | None = None

    @property
    def workspace_splits(self) -> int:
        """Splits per row of workspace the launch writes (0 when one split writes the output)."""
        return self.splits if self.splits > 1 else 0


_MEMOISED: list[Any] = []


def memoised(fn: Callable[..., LaunchPlan]) -> Callable[..., LaunchPlan]:
    """Memoise a plan builder; :func:`clear_launch_plans` forgets every memoised plan."""
    cached = functools.lru_cache(maxsize=4096)(fn)
    _MEMOISED.append(cached)
    return cached


def clear_launch_plans() -> None:
    """Forget memoised plans (after changing launch settings, e.g. ``cuda.configs.override``)."""
    for cached in _MEMOISED:
        cached.cache_clear()


def aligned_16(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """Whether q and kv rows are 16-byte aligned: base pointers 16-byte aligned and row strides
    that Triton specialises as multiples of 16 elements (what 16-byte async copies need)."""
    return (q.data_ptr() % 16 == 0 and kv.data_ptr() % 16 == 0
            and q.stride(0) % 16 == 0 and q.stride(1) % 16 == 0 and kv.stride(0) % 16 == 0)


def direct_launch_allowed() -> bool:
    """True when a backend may run a plan without going through its custom op: not inside
    ``torch.compile`` tracing, and no ``TorchDispatchMode`` (the capture sanitizer, the CPU
    graph emulator's capture, a fake-tensor mode) on the dispatch stack, so nothing that
    watches the ops would miss one. Costs one C call."""
    return not torch.compiler.is_compiling() and not torch._C._len_torch_dispatch_stack()
