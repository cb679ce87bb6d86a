"""Errors raised when graph capture would become unsafe.

Every graph-safety error derives from :class:`GraphSafetyError`, so an engine can catch the
whole class in one place. Messages name the buffer, its capacity, what was asked for, and the fix.
"""

from __future__ import annotations


class GraphSafetyError(RuntimeError):
    """Base class: an operation would make a captured graph touch memory it does not own."""


class CapturedBufferGrowthError(GraphSafetyError):
    """A buffer that a captured graph holds was asked to grow (which would free the captured one)."""

    def __init__(self, name: str, capacity: int, requested: int):
        self.name, self.capacity, self.requested = name, capacity, requested
        super().__init__(
            f"buffer '{name}' is held by a captured graph with capacity {capacity} rows, but "
            f"{requested} rows were requested; growing it would free the storage the graph "
            f"replays into. Fix: reserve at least {requested} rows (e.g. make_metadata("
            f"max_rows={requested})) before the first capture, or split the call into chunks "
            f"of at most {capacity} rows."
        )


class CaptureCapacityError(GraphSafetyError):
    """A capture in progress needs more rows than were reserved before it began."""

    def __init__(self, name: str, capacity: int, requested: int):
        self.name, self.capacity, self.requested = name, capacity, requested
        super().__init__(
            f"buffer '{name}' has capacity {capacity} rows but a graph capture requested "
            f"{requested} rows; buffers cannot be allocated or replaced during capture. Fix: "
            f"reserve at least {requested} rows before capturing (size for the largest bucket "
            f"in query rows, i.e. max(max_batch_size, max_num_tokens))."
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
