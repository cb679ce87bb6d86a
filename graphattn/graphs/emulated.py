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
any op of the segment runs, where a real graph would silently corrupt memory. An op whose result
changes shape on replay raises :class:`CapturedShapeChangedError`.

The emulator refuses what a real capture refuses, so code that passes here does not fail on a
GPU: ops that read device values back (checked on each op), and the host reads that reach no
op on the CPU (``tolist``, ``numpy``, printing, ``.cpu()``; a ``TorchFunctionMode`` active only
while a segment captures). Every tensor of an emulated capture stands for a device tensor.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..common.capture import capture_scope
from ..common.errors import CapturedShapeChangedError
from .sanitizer import (
    CompositeTensor,
    StorageTracker,
    WeakTensor,
    check_host_readback,
    host_readback_error,
    op_name,
    tensor_parts,
)


class EmulatedPool:
    """The emulator's stand-in for a graph memory pool handle (shared by segments)."""

    def __init__(self) -> None:
        self.segments = 0

    def __repr__(self) -> str:
        return f"EmulatedPool(segments={self.segments})"


@dataclass
class _RecordedOp:
    """One captured op. ``leaves`` are its flattened (args, kwargs); tensors among them are
    either held strongly (graph-owned), as :class:`WeakTensor` (borrowed) or as
    :class:`CompositeTensor` (a wrapper subclass or sparse tensor, held as its parts)."""

    func: Any
    leaves: list[Any]
    spec: Any
    outputs: list[Any]  # flattened outputs: tensors held like the leaves, other values as-is


class _RecordingMode(TorchDispatchMode):
    """Runs each op, then records it with its tensors classified by the shared tracker."""

    def __init__(self, tracker: StorageTracker, ops: list[_RecordedOp], host_reads: _HostReadMode):
        super().__init__()
        self.tracker, self.ops, self.host_reads = tracker, ops, host_reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        check_host_readback(func, args, kwargs, emulated=True)
        state = self.host_reads.state
        depth = state.inside_op
        # An op's own implementation (a Triton kernel under the interpreter) may read its CPU
        # tensors as host data; only the captured code's calls count as host reads.
        state.inside_op = depth + 1
        try:
            out = func(*args, **kwargs)
            self.tracker.observe(func, args, kwargs, out)
            name = op_name(func)
            leaves, spec = tree_flatten((args, kwargs))
            out_leaves, _ = tree_flatten(out)
            self.ops.append(
                _RecordedOp(
                    func,
                    [self._hold(x, name, "arg") for x in leaves],
                    spec,
                    [self._hold(x, name, "result") for x in out_leaves],
                )
            )
        finally:
            state.inside_op = depth
        return out

    def _hold(self, x: Any, op: str, arg: str) -> Any:
        return self.tracker.hold(x, op, arg) if isinstance(x, torch.Tensor) else x


class _HostReadState(threading.local):
    """Per thread: whether a recorded op is running (its implementation's calls are no host reads)."""

    inside_op = 0  # > 0 while a recorded op runs (a class default: see breakable._Active)


def _targets_host(args: tuple, kwargs: dict) -> bool:
    """True when a ``Tensor.to`` call names the host as a string (``"cpu"``): a device object
    may be another tensor's ``.device``, which on the emulator is the CPU for device tensors."""
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, str):
            try:
                return torch.device(a).type == "cpu"
            except RuntimeError:
                return False
    return False


# Tensor methods that read a tensor's values on the host without an aten op the dispatch mode
# could refuse (the CPU emulator's tensors need no copy), keyed to what they do and the fix.
_PLAN_FIX = ("compute host-side values before capture (backend.plan), or keep the computation on "
             "the device (torch.where, masked_fill, nonzero_static(size=...))")
_HOST_READ_CALLS = {
    torch.Tensor.tolist: ("Tensor.tolist()", "copies a device tensor to host memory", _PLAN_FIX),
    torch.Tensor.numpy: ("Tensor.numpy()", "copies a device tensor to host memory", _PLAN_FIX),
    torch.Tensor.__array__: ("numpy.asarray(tensor)", "copies a device tensor to host memory", _PLAN_FIX),
    torch.Tensor.__repr__: ("printing a tensor", "copies a device tensor to host memory",
                            "print or log shapes and dtypes during capture, values after a replay"),
    torch.Tensor.__format__: ("formatting a tensor", "copies a device tensor to host memory",
                              "print or log shapes and dtypes during capture, values after a replay"),
    torch.Tensor.cpu: ("Tensor.cpu()", "copies a device tensor to host memory",
                       "copy into a preallocated device tensor and read it after the replay"),
    torch.Tensor.to: ("Tensor.to('cpu')", "copies a device tensor to host memory",
                      "copy into a preallocated device tensor and read it after the replay"),
}


class _HostReadMode(TorchFunctionMode):
    """Refuses, during an emulated capture, the host reads that reach no aten op on the CPU:
    ``tolist``, ``numpy``, printing, ``.cpu()`` (a no-op there, a device-to-host copy on a GPU).
    A real capture fails on each; without this the emulator would bake the value it read."""

    def __init__(self) -> None:
        super().__init__()
        self.state = _HostReadState()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            refused = _HOST_READ_CALLS.get(func) if not self.state.inside_op else None
        except TypeError:  # an unhashable callable: none of the refused methods
            refused = None
        if refused is not None and (func is not torch.Tensor.to or _targets_host(args, kwargs)):
            raise host_readback_error(*refused, emulated=True)
        return func(*args, **kwargs)


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
        """Start recording: enter ``capture_scope()``, the recording dispatch mode and the
        mode that refuses host reads no aten op shows."""
        if self._stack is not None or self._captured:
            raise RuntimeError("this segment is already capturing or captured; make a new one")
        stack = ExitStack()
        stack.enter_context(capture_scope())
        host_reads = _HostReadMode()
        stack.enter_context(_RecordingMode(self.tracker, self.ops, host_reads))
        stack.enter_context(host_reads)
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
                if isinstance(x, (WeakTensor, CompositeTensor)):
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
        # A real graph replays without autograd. Inference mode, not just no_grad: a capture
        # made under torch.inference_mode() holds inference tensors, which an in-place write
        # outside inference mode refuses; normal tensors are written the same either way.
        with torch.inference_mode():
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
    return x.revive(cache) if isinstance(x, (WeakTensor, CompositeTensor)) else x


def _plain_parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding ``t``'s values: ``t``, or a composite tensor's parts."""
    parts = tensor_parts(t)
    return [t] if parts is None else [q for _, p in parts for q in _plain_parts(p)]


def _write_back(op: _RecordedOp, result: list[Any], outputs: list[Any]) -> None:
    """Copy a re-executed op's results into the tensors it returned at capture."""
    if len(result) != len(outputs):
        raise CapturedShapeChangedError(op_name(op.func), f"returned {len(result)} values, captured {len(outputs)}")
    for new, old, held in zip(result, outputs, op.outputs):
        if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
            continue
        if new.shape != old.shape:
            raise CapturedShapeChangedError(
                op_name(op.func), f"returned shape {tuple(new.shape)}, captured {tuple(old.shape)}"
            )
        if isinstance(held, CompositeTensor):
            _write_back_parts(op, _plain_parts(new), _plain_parts(old))
        elif old.numel() and (new.data_ptr() != old.data_ptr() or new.stride() != old.stride()):
            old.copy_(new)  # else in-place, out= or a view: it already wrote the captured address


def _write_back_parts(op: _RecordedOp, new: list[torch.Tensor], old: list[torch.Tensor]) -> None:
    """:func:`_write_back` for a composite result: part by part, into the captured parts."""
    if len(new) != len(old):
        raise CapturedShapeChangedError(op_name(op.func), f"returned a tensor of {len(new)} parts, captured {len(old)}")
    for n, o in zip(new, old):
        if n.shape != o.shape:  # a sparse result with another number of values
            raise CapturedShapeChangedError(
                op_name(op.func), f"returned a part of shape {tuple(n.shape)}, captured {tuple(o.shape)}"
            )
        if o.numel() and (n.data_ptr() != o.data_ptr() or n.stride() != o.stride()):
            o.copy_(n)
