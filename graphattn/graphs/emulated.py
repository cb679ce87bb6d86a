"""CPU graph emulator: a graph segment that bakes addresses the way a real CUDA/HIP graph does.

Capture runs the function once under a :class:`TorchDispatchMode` and records every op (aten
ops and torch custom ops alike, each as one op) with its arguments and outputs. Storages created
during the capture belong to the emulated pool and are held strongly, as a real graph's private
pool holds its memory. Storages that existed before the capture are held **weakly** (see
:class:`~graphattn.graphs.sanitizer.StorageTracker`), as a real graph holds only their address.

Replay re-executes the recorded ops on the same storages. In-place and ``out=`` ops write where
they wrote at capture; a functional op's fresh result is copied into the tensor it returned at
capture, so later ops (and the caller) read the captured addresses. A borrowed storage that was
freed or moved raises :class:`FreedCaptureBufferError` naming the buffer, op and argument, before
any op of the segment runs, where a real graph would silently corrupt memory.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..common.capture import capture_scope
from .sanitizer import StorageTracker, WeakTensor, check_host_readback


class EmulatedPool:
    """The emulator's stand-in for a graph memory pool handle (shared by segments)."""

    def __init__(self) -> None:
        self.segments = 0

    def __repr__(self) -> str:
        return f"EmulatedPool(segments={self.segments})"


@dataclass
class _RecordedOp:
    """One captured op. ``leaves`` are its flattened (args, kwargs); tensors among them are
    either held strongly (graph-owned) or as :class:`WeakTensor` (borrowed)."""

    func: Any
    leaves: list[Any]
    spec: Any
    outputs: list[Any]  # flattened outputs: tensors held like the leaves, other values as-is


def _hold(t: Any, weak: dict[int, WeakTensor]) -> Any:
    if isinstance(t, torch.Tensor) and id(t) in weak:
        return weak[id(t)]
    return t


class _RecordingMode(TorchDispatchMode):
    """Runs each op, then records it with its tensors classified by the shared tracker."""

    def __init__(self, tracker: StorageTracker, ops: list[_RecordedOp]):
        super().__init__()
        self.tracker, self.ops = tracker, ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        check_host_readback(func)
        out = func(*args, **kwargs)
        weak = self.tracker.observe(func, args, kwargs, out)
        leaves, spec = tree_flatten((args, kwargs))
        out_leaves, _ = tree_flatten(out)
        self.ops.append(
            _RecordedOp(
                func,
                [_hold(x, weak) for x in leaves],
                spec,
                [_hold(x, weak) for x in out_leaves],
            )
        )
        return out


class EmulatedGraphSegment:
    """One emulated graph segment (the ``cpu`` platform's segment class).

    Args:
        pool: an :class:`EmulatedPool` shared with other segments; a new one when ``None``.
        tracker: the :class:`StorageTracker` shared by the segments of one graph; a new one
            when ``None``.

    Protocol: ``capture_begin()`` / ``capture_end()`` around the work (inside
    :func:`capture_scope`), then ``replay()`` any number of times; ``check()`` validates every
    borrowed storage without running anything.
    """

    emulated = True

    def __init__(self, pool: EmulatedPool | None = None, tracker: StorageTracker | None = None):
        self.pool = pool if pool is not None else EmulatedPool()
        self.tracker = tracker if tracker is not None else StorageTracker()
        self.ops: list[_RecordedOp] = []
        self._stack: ExitStack | None = None
        self._captured = False

    @classmethod
    def isolated(cls, capture_error_mode: str = "thread_local") -> type:
        """This class: emulated segments have no side stream or cuBLAS workspace to keep apart
        (see ``StreamGraphSegment.isolated``)."""
        return cls

    @classmethod
    def warmup_scope(cls):
        """Context for eager warm-up runs before capture (no streams on the CPU)."""
        return ExitStack()

    @property
    def num_ops(self) -> int:
        """Ops recorded by the capture."""
        return len(self.ops)

    def capture_begin(self) -> None:
        """Start recording: enter ``capture_scope()`` and the recording dispatch mode."""
        if self._stack is not None or self._captured:
            raise RuntimeError("this segment is already capturing or captured; make a new one")
        stack = ExitStack()
        stack.enter_context(capture_scope())
        stack.enter_context(_RecordingMode(self.tracker, self.ops))
        self._stack = stack
        self.pool.segments += 1

    def capture_end(self) -> None:
        """Stop recording. The segment can now be replayed."""
        if self._stack is None:
            raise RuntimeError("capture_end() without capture_begin()")
        stack, self._stack = self._stack, None
        stack.close()
        self._captured = True

    def check(self) -> None:
        """Raise :class:`FreedCaptureBufferError` if a borrowed storage was freed or moved."""
        cache: dict[int, torch.UntypedStorage] = {}
        for op in self.ops:
            for x in op.leaves + op.outputs:
                if isinstance(x, WeakTensor):
                    x.revive(cache)

    def replay(self) -> None:
        """Re-execute the recorded ops on the captured storages."""
        if not self._captured:
            raise RuntimeError("replay() before the segment was captured")
        cache: dict[int, torch.UntypedStorage] = {}
        # Revive every borrowed tensor first, so a freed buffer stops the whole segment
        # before any op writes anything.
        resolved = [
            ([_revive(x, cache) for x in op.leaves], [_revive(x, cache) for x in op.outputs])
            for op in self.ops
        ]
        with torch.no_grad():
            for op, (leaves, outputs) in zip(self.ops, resolved):
                args, kwargs = tree_unflatten(leaves, op.spec)
                result, _ = tree_flatten(op.func(*args, **kwargs))
                _wait_for_collectives(result)
                _write_back(op, result, outputs)


def _wait_for_collectives(result: list[Any]) -> None:
    """Wait for the ``Work`` a collective returns (``c10d.allreduce_`` under ``dist.all_reduce``).

    At capture its caller waited (``work.wait()``, a method call the dispatch mode never sees);
    a real graph orders the collective before the next kernel on the stream. The emulator runs
    ops one after the other, so it waits here, where that order would hold: gloo runs the
    collective on its own thread and the next op would otherwise read the unreduced tensor.
    """
    for r in result:
        if isinstance(r, torch.ScriptObject) and hasattr(r, "wait"):
            r.wait()


def _revive(x: Any, cache: dict[int, torch.UntypedStorage]) -> Any:
    return x.revive(cache) if isinstance(x, WeakTensor) else x


def _write_back(op: _RecordedOp, result: list[Any], outputs: list[Any]) -> None:
    """Copy a re-executed op's results into the tensors it returned at capture."""
    if len(result) != len(outputs):
        raise RuntimeError(f"replay of '{op.func}' returned {len(result)} values, captured {len(outputs)}")
    for new, old in zip(result, outputs):
        if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
            continue
        if new.shape != old.shape:
            raise RuntimeError(
                f"replay of '{op.func}' returned shape {tuple(new.shape)}, captured "
                f"{tuple(old.shape)}: captured shapes are fixed"
            )
        if old.numel() == 0 or (
            new.data_ptr() == old.data_ptr() and new.stride() == old.stride()
        ):
            continue  # in-place, out= or a view: it already wrote the captured address
        old.copy_(new)
