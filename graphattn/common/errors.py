"""Errors raised when graph capture would become unsafe.

Every graph-safety error derives from :class:`GraphSafetyError`, so an engine can catch the
whole class in one place. Messages name the buffer, its capacity, what was asked for, and the fix.
"""

from __future__ import annotations


class GraphSafetyError(RuntimeError):
    """Base class: an operation would make a captured graph touch memory it does not own."""


class _RowCapacityError(GraphSafetyError):
    """A request for ``requested`` rows of buffer ``name``, which holds ``capacity``."""

    def __init__(self, name: str, capacity: int, requested: int):
        self.name, self.capacity, self.requested = name, capacity, requested
        super().__init__(self._message())

    def _message(self) -> str:
        raise NotImplementedError


class CapturedBufferGrowthError(_RowCapacityError):
    """A buffer that a captured graph holds was asked to grow (which would free the captured one)."""

    def _message(self) -> str:
        return (
            f"buffer '{self.name}' is held by a captured graph with capacity {self.capacity} "
            f"rows, but {self.requested} rows were requested; growing it would free the storage "
            f"the graph replays into. Fix: reserve at least {self.requested} rows (e.g. "
            f"make_metadata(max_rows={self.requested})) before the first capture, or split the "
            f"call into chunks of at most {self.capacity} rows."
        )


class CaptureCapacityError(_RowCapacityError):
    """A capture in progress needs more rows than were reserved before it began."""

    def _message(self) -> str:
        return (
            f"buffer '{self.name}' has capacity {self.capacity} rows but a graph capture "
            f"requested {self.requested} rows; buffers cannot be allocated or replaced during "
            f"capture. Fix: reserve at least {self.requested} rows before capturing (size for "
            f"the largest bucket in query rows, i.e. max(max_batch_size, max_num_tokens))."
        )


class FreedCaptureBufferError(GraphSafetyError):
    """A replay would read or write storage that was freed or moved after capture."""

    def __init__(self, name: str, op: str, detail: str):
        self.name, self.op, self.detail = name, op, detail
        super().__init__(
            f"replay refused: argument '{name}' of op '{op}' {detail} since capture, so the graph "
            f"would touch memory it no longer owns. Fix: keep captured buffers alive and in place "
            f"for the graph's lifetime (use GrowOnlyBuffer/GraphMetadata and reserve before "
            f"capture), or re-capture the graph after replacing them."
        )


__all__ = [
    "GraphSafetyError",
    "CapturedBufferGrowthError",
    "CaptureCapacityError",
    "FreedCaptureBufferError",
]


class HostReadbackError(GraphSafetyError):
    """A capture would read a device value back to the host, which a real CUDA/HIP capture
    refuses (and whose value a replay could not follow)."""


class UntrackableTensorError(GraphSafetyError):
    """A captured op received a tensor whose memory the capture cannot see, so it could not
    tell (or check) which storages the graph borrows."""


class CapturedShapeChangedError(GraphSafetyError):
    """A replayed op returned another shape (or number of results) than at capture: a real
    graph replays the captured shapes, so it would not compute what eager code computes."""

    def __init__(self, op: str, detail: str):
        self.op, self.detail = op, detail
        super().__init__(
            f"replay of op '{op}' {detail}: a graph replays the shapes it captured, so this "
            f"op's output size must not depend on tensor values or on state outside its "
            f"arguments (a custom op reading a global that changed). Fix: give the op a fixed "
            f"output size (nonzero_static(size=...), repeat_interleave(output_size=...), "
            f"torch.where instead of boolean indexing), or keep the state it reads fixed for "
            f"the graph's lifetime and re-capture after changing it."
        )
