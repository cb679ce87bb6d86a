"""GrowOnlyBuffer: a named device buffer that a captured graph can hold safely.

A captured graph replays raw addresses and does not keep tensors alive, so a buffer a graph
uses must never be replaced. This class makes that a property of the type:

* it grows only while no graph holds it (``reserve`` before capture),
* callers get row slices (``view``) of one storage, never copies,
* ``mark_captured()`` pins the storage for the buffer's lifetime, and
* a request beyond the pinned capacity follows a declared :class:`OverflowPolicy`.
"""

from __future__ import annotations

import enum
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from .capture import is_capturing
from .errors import CaptureCapacityError, CapturedBufferGrowthError
from .platform import indexed_device


_storage_epoch = 0  # bumped whenever any buffer replaces its storage


def storage_epoch() -> int:
    """A number that changes whenever any :class:`GrowOnlyBuffer` replaces its storage (it grew
    before capture), or :func:`forget_kept_calls` is called. Objects that keep views of buffers
    across calls (bound launch calls, backends' launch plans) compare it to know their views are
    still the live storage and their settings still current."""
    return _storage_epoch


class EpochDict:
    """A dict of things kept against :func:`storage_epoch` (bound calls, launch plans): it is
    emptied on the first use after the epoch changed, so nothing in it outlives the storage
    or the launch settings it was made for."""

    __slots__ = ("_items", "_epoch")

    def __init__(self) -> None:
        self._items: dict[Any, Any] = {}
        self._epoch = _storage_epoch

    def current(self) -> dict[Any, Any]:
        """The dict, emptied first if the epoch changed since it was last asked for."""
        if self._epoch != _storage_epoch:
            self._items.clear()
            self._epoch = _storage_epoch
        return self._items

    def is_current(self) -> bool:
        """False once the epoch changed after the last :meth:`current` (something built in
        between may hold views of replaced storage: do not keep it)."""
        return self._epoch == _storage_epoch


def forget_kept_calls() -> None:
    """Make everything kept against :func:`storage_epoch` be rebuilt on its next use, as after a
    storage change (``kernels.launch.clear_launch_plans`` calls it when launch settings change).
    Costs one rebuild per kept call; never touches any storage."""
    global _storage_epoch
    _storage_epoch += 1


class _CaptureMarks(threading.local):
    # The buffers that views newly marked during the capture being recorded on this thread, or
    # None outside one (a class default: reading it never raises).
    journal: list[GrowOnlyBuffer] | None = None


_capture_marks = _CaptureMarks()


@contextmanager
def recording_capture_marks() -> Iterator[list[GrowOnlyBuffer]]:
    """Collect, in the list this yields, every buffer that a :meth:`GrowOnlyBuffer.view` in the
    block newly marks captured, so that a capture which fails can give the marks back
    (:func:`release_capture_marks`): no graph holds those buffers then."""
    before = _capture_marks.journal
    journal: list[GrowOnlyBuffer] = []
    _capture_marks.journal = journal
    try:
        yield journal
    finally:
        _capture_marks.journal = before


def release_capture_marks(buffers: Sequence[GrowOnlyBuffer]) -> None:
    """Unpin buffers that a failed capture marked (the list :func:`recording_capture_marks`
    yielded): the failed graph is never replayed, so they may grow again. Only for buffers no
    other graph marked; a buffer marked before the capture is never in that list."""
    for buf in buffers:
        buf._captured = False


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[first, end)`` that tensor ``t``'s elements reach, for any shape, strides and
    dtype: ``first`` is ``t.data_ptr()`` and ``end`` is one past the last byte of the element
    furthest from it (gaps between strided elements fall inside; a zero stride adds nothing; a
    0-dim tensor spans one element). Torch strides are >= 0, so ``first`` is the lowest byte.
    An empty tensor gives ``(0, 0)``: a range that overlaps no other."""
    if t.numel() == 0:
        return 0, 0
    first = t.data_ptr()
    reach = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return first, first + (reach + 1) * t.element_size()


class PaddingRows:
    """Which leading rows of a padded table may hold live data, so that padding rows are filled
    only where an earlier, larger step wrote: a steady batch size then costs one copy per step,
    not a copy and a fill.

    Every row at or past :attr:`rows` of :attr:`storage` holds the pad value (from allocation or
    an earlier fill). Another storage (the table grew) starts clean: it was filled when allocated.
    """

    __slots__ = ("rows", "storage")

    def __init__(self) -> None:
        self.rows = 0
        self.storage: Any = None

    def pad(self, live: int, stop: int, fill: Callable[[int, int], None], storage: Any = None) -> None:
        """Rows ``[0, live)`` may hold live data (they were just written, or are left as they
        were); make rows ``[live, stop)`` hold the pad value, calling ``fill(start, end)`` for the
        part an earlier step may have written, and record it."""
        dirty = self.rows if storage is self.storage else 0
        if dirty > live:
            fill(live, min(stop, dirty))
        self.rows = dirty if dirty > stop else live
        self.storage = storage

    def wrote(self, rows: int, storage: Any = None) -> None:
        """Record that rows ``[0, rows)`` may now hold live data, written elsewhere than through
        :meth:`pad` (an eager step on the table itself), so the next :meth:`pad` refills them."""
        dirty = self.rows if storage is self.storage else 0
        self.rows = max(dirty, rows)
        self.storage = storage


class OverflowPolicy(str, enum.Enum):
    """What a captured buffer does when asked for more rows than it holds.

    RAISE: raise :class:`CapturedBufferGrowthError` (the q-pad rule: growing would free it).
    TEMPORARY: an eager call gets a fresh buffer filled like a new one, which the graph never
        sees (the counter rule); inside a capture it raises :class:`CaptureCapacityError`.
    """

    RAISE = "raise"
    TEMPORARY = "temporary"


class GrowOnlyBuffer:
    """A named buffer of ``[capacity, *row_shape]`` whose storage a graph may hold.

    Args:
        name: shown in every error about this buffer.
        row_shape: shape of one row, e.g. ``(padded_heads, 576)``.
        dtype, device: of the storage (a bare ``"cuda"`` is the GPU current now: growth and
            temporaries stay there whichever device is current later).
        policy: overflow policy once captured (see :class:`OverflowPolicy`).
        rows: initial capacity in rows (allocated now when > 0).
        fill: value every element holds at allocation (0 for padding and counters,
            -1 for index tables). It is written once, never again by this class.
    """

    def __init__(
        self,
        name: str,
        row_shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str,
        policy: OverflowPolicy | str = OverflowPolicy.RAISE,
        rows: int = 0,
        fill: float = 0,
    ):
        self.name = name
        self.row_shape = tuple(int(d) for d in row_shape)
        self.dtype = dtype
        self.device = indexed_device(device)
        self.policy = OverflowPolicy(policy)
        self.fill = fill
        self._captured = False
        self._data = self._allocate(0)
        self._views: dict[int, torch.Tensor] = {}
        self.reserve(rows)

    @property
    def capacity(self) -> int:
        """Rows the current storage holds."""
        return self._data.shape[0]

    @property
    def captured(self) -> bool:
        """True once a graph holds this buffer; its storage is then fixed for good."""
        return self._captured

    @property
    def tensor(self) -> torch.Tensor:
        """The whole storage, ``[capacity, *row_shape]``."""
        return self._data

    def data_ptr(self) -> int:
        """Address of row 0 (stable after ``mark_captured``)."""
        return self._data.data_ptr()

    def nbytes(self) -> int:
        """Bytes held by the storage."""
        return self._data.numel() * self._data.element_size()

    def _allocate(self, rows: int) -> torch.Tensor:
        return torch.full((rows, *self.row_shape), self.fill, dtype=self.dtype, device=self.device)

    def reserve(self, rows: int) -> None:
        """Grow to at least ``rows`` rows. Only before capture; a no-op if already large enough.

        Raises:
            CapturedBufferGrowthError: the buffer is captured and ``rows`` exceeds its capacity.
            CaptureCapacityError: a capture is in progress and ``rows`` exceeds the capacity.
        """
        rows = int(rows)
        if not self.check_growth(rows):
            return
        global _storage_epoch
        self._data = self._allocate(rows)
        self._views = {}
        _storage_epoch += 1

    def check_growth(self, rows: int) -> bool:
        """Whether :meth:`reserve` of ``rows`` would grow the buffer; raises what it would raise
        (so that several buffers can be checked before any of them grows).

        Raises:
            ValueError: ``rows`` < 0.
            CapturedBufferGrowthError: the buffer is captured and ``rows`` exceeds its capacity.
            CaptureCapacityError: a capture is in progress and ``rows`` exceeds the capacity.
        """
        if rows < 0:
            raise ValueError(f"buffer '{self.name}': rows must be >= 0, got {rows}")
        if rows <= self.capacity:
            return False
        if self._captured:
            raise CapturedBufferGrowthError(self.name, self.capacity, rows)
        if is_capturing():
            raise CaptureCapacityError(self.name, self.capacity, rows)
        return True

    def view(self, rows: int) -> torch.Tensor:
        """A ``[rows, *row_shape]`` slice of the storage (never a copy).

        Before capture it grows on demand. A view taken during a capture marks the buffer
        captured, since the graph now holds its address. Past the captured capacity the
        overflow policy applies (a TEMPORARY buffer returns a fresh, filled tensor).
        """
        compiling = torch.compiler.is_compiling()
        # The hot path (every plan() and eager call): one view object per row count, kept
        # until the storage is replaced; a dict lookup, not a slice.
        view = None if compiling else self._views.get(rows)
        if view is not None:
            if not self._captured and is_capturing():
                self._mark_by_capture()  # the graph now holds this storage's address
            return view
        rows = int(rows)
        if rows < 0:
            raise ValueError(f"buffer '{self.name}': rows must be >= 0, got {rows}")
        # torch.compile traces shapes, not captures (and cannot trace the platform query);
        # a graph taken of the compiled code marks the metadata through its runner.
        capturing = False if compiling else is_capturing()
        if rows > self.capacity:
            if capturing:
                raise CaptureCapacityError(self.name, self.capacity, rows)
            if not self._captured:
                self.reserve(rows)
            elif self.policy is OverflowPolicy.TEMPORARY:
                return self._allocate(rows)
            else:
                raise CapturedBufferGrowthError(self.name, self.capacity, rows)
        if capturing and not self._captured:
            self._mark_by_capture()
        if compiling:
            return self._data[:rows]
        view = self._views[rows] = self._data[:rows]
        return view

    def temporary(self, rows: int) -> torch.Tensor:
        """A fresh ``[rows, *row_shape]`` tensor filled like a new allocation, which is never
        this buffer's storage (an oversized eager step's scratch; whatever the policy).

        Raises:
            CaptureCapacityError: a capture is in progress (a graph would bake its address).
        """
        rows = int(rows)
        if is_capturing():
            raise CaptureCapacityError(self.name, self.capacity, rows)
        return self._allocate(rows)

    def mark_captured(self) -> None:
        """Pin the storage: from now on it is never freed or replaced by this object."""
        self._captured = True

    def _mark_by_capture(self) -> None:
        # Journaled, so that a capture that then fails can release the mark: otherwise a
        # buffer no graph holds would refuse to grow for good.
        self._captured = True
        journal = _capture_marks.journal
        if journal is not None:
            journal.append(self)

    def __repr__(self) -> str:
        return (
            f"GrowOnlyBuffer({self.name!r}, rows={self.capacity}, row_shape={self.row_shape}, "
            f"dtype={self.dtype}, policy={self.policy.value}, captured={self._captured})"
        )
