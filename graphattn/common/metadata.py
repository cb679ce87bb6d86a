"""GraphMetadata: the per-step attention metadata that captured graphs hold.

One object serves every graph bucket of a runner. All storage is in :class:`GrowOnlyBuffer`
objects sized in **query rows** (a prefill chunk of N tokens is N rows), reserved before the first
capture and pinned by it; the split-KV workspace is the exception: a fixed pool of partials that
serves every row count (more rows, fewer splits per row). ``refresh_`` updates per-step tensors
in place for a replay and never replaces a tensor, the q-pad buffer, or the capture mark (HIP's
breakable-graph rule, used on CUDA too).

An *oversized* step (an eager step planned after capture with more rows than were reserved)
runs on temporaries: ``refresh_`` writes its indices into a temporary table and the q-pad and
counter slices of that step are temporaries too, so captured storage is neither replaced nor
touched. Inside a capture such a step raises :class:`CaptureCapacityError`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Hashable, Iterator

import torch

from .buffers import EpochDict, GrowOnlyBuffer, OverflowPolicy, PaddingRows
from .capture import is_capturing
from .errors import CaptureCapacityError
from .platform import indexed_device
from .validation import check_index_range

log = logging.getLogger(__name__)

D_QK = 576  # DeepSeek MLA: 512 latent ("nope") + 64 rotary dims per query/key
D_V = 512  # V is the first 512 columns of the latent KV
# Bound calls kept per metadata before they are all forgotten (each row count of each backend
# has one; an engine whose prefill chunks take every size would otherwise keep one per size).
_MAX_BOUND_CALLS = 512


class GraphMetadata:
    """Persistent, graph-safe buffers for one attention backend.

    Args:
        max_rows: query rows to reserve now (``max(max_batch_size, max_num_tokens)``).
        num_heads: query heads the caller passes.
        topk: indices per row.
        dtype: q/kv dtype (bf16 or fp16).
        device: where the buffers live (``cuda:N``; a bare ``cuda`` is the GPU current now).
        padded_heads: head count of the q-pad buffer; ``None`` when the kernel needs no padding.
        counter_cols: counters per row (one per head block); 0 when no counter is used.
        num_splits: the most split-KV partials one row may use; 0 when no workspace is used.
        workspace_heads: heads per split partial (defaults to ``padded_heads or num_heads``).
        workspace_partials: partials in the workspace pool (``split_plan(...).max_partials``);
            ``None`` gives every reserved row all ``num_splits`` (``max_rows * num_splits``).

    Fields (``R`` = reserved rows):
        q_pad: ``[R, padded_heads, d_qk]`` q dtype. Heads ``num_heads:`` are zero, written once at
            allocation and never again; policy RAISE (the q-pad rule). ``None`` without padding.
        counter: ``[R, counter_cols]`` int32, zeroed once; the kernel resets it to 0 after use;
            policy TEMPORARY (the counter rule). ``None`` without a counter.
        workspace_out: ``[P, workspace_heads, d_v]`` float32 pool of P split partials, reserved
            once (its capacity counts partials, not rows) and never grown.
        workspace_lse: ``[P, workspace_heads]`` float32 split log-sum-exps.
        indices: ``[R, topk]`` int32 KV-pool rows per query row, −1 = skip; the per-step tensor
            ``refresh_`` writes in place. Policy RAISE.
        num_rows: live rows written by the last ``refresh_`` (host int).
        num_planned_rows: rows the last ``refresh_`` wrote including padding (``max(n, pad_to)``);
            above :attr:`capacity` the step is oversized (:attr:`oversized`).
        checked_rows: rows a ``forward`` may take with no further check (host int): the planned
            rows, or 0 while something is still to check (the slow path, :meth:`check_forward`).
    """

    def __init__(
        self,
        max_rows: int,
        num_heads: int,
        topk: int,
        dtype: torch.dtype,
        device: torch.device | str,
        padded_heads: int | None = None,
        counter_cols: int = 0,
        num_splits: int = 0,
        workspace_heads: int | None = None,
        workspace_partials: int | None = None,
        d_qk: int = D_QK,
        d_v: int = D_V,
    ):
        if padded_heads is not None and padded_heads < num_heads:
            raise ValueError(f"padded_heads ({padded_heads}) must be >= num_heads ({num_heads})")
        self.num_heads, self.topk, self.dtype = num_heads, topk, dtype
        self.device = indexed_device(device)
        self.padded_heads, self.d_qk, self.d_v = padded_heads, d_qk, d_v
        self.num_splits = num_splits
        ws_heads = workspace_heads or padded_heads or num_heads
        self._captured = False
        self.num_rows = 0
        self.num_planned_rows = 0
        self.checked_rows = 0  # 0 until planned: a forward before any plan() takes the slow path
        self._planned = False
        self._capture_rows = 0  # rows a runner's capture may read unplanned (capture_rows)
        self._read_unplanned = False  # a capture read the table before any plan()
        self._pending_index_check = False  # plan(check_indices=True) without the pool size
        self._refused: str | None = None  # why the last plan() refused its indices
        self._ws_views: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._q_heads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rows -> (q_pad rows, real heads)
        self._bound = EpochDict()  # key -> bound call
        self._padding = PaddingRows()  # index-table rows a step may have written
        # The oversized step's temporary index table ([num_planned_rows, topk] int32), or None.
        self._oversized: torch.Tensor | None = None
        self._oversized_logged = False

        def buf(name, row_shape, dt, policy, fill=0, rows=0):
            return GrowOnlyBuffer(name, row_shape, dt, self.device, policy, rows, fill)

        self.q_pad = (
            buf("q_pad", (padded_heads, d_qk), dtype, OverflowPolicy.RAISE)
            if padded_heads is not None
            else None
        )
        self.counter = (
            buf("multi_cta_counter", (counter_cols,), torch.int32, OverflowPolicy.TEMPORARY)
            if counter_cols
            else None
        )
        self.workspace_out = self.workspace_lse = None
        if num_splits:
            # Sized in partials, not rows: workspace_for never asks for more than the pool holds,
            # so the pool never grows (RAISE would only fire on a bug).
            partials = max_rows * num_splits if workspace_partials is None else workspace_partials
            pool = max(1, partials)
            self.workspace_out = buf(
                "workspace_out", (ws_heads, d_v), torch.float32, OverflowPolicy.RAISE, rows=pool
            )
            self.workspace_lse = buf(
                "workspace_lse", (ws_heads,), torch.float32, OverflowPolicy.RAISE, rows=pool
            )
        self.indices = buf("indices", (topk,), torch.int32, OverflowPolicy.RAISE, fill=-1)
        self.reserve(max_rows)

    # -- buffers --------------------------------------------------------------------------
    def buffers(self) -> list[GrowOnlyBuffer]:
        """Every buffer this metadata owns."""
        bufs = [self.q_pad, self.counter, self.workspace_out, self.workspace_lse, self.indices]
        return [b for b in bufs if b is not None]

    def _row_buffers(self) -> list[GrowOnlyBuffer]:
        return [b for b in (self.q_pad, self.counter, self.indices) if b is not None]

    @property
    def capacity(self) -> int:
        """Rows every row-sized buffer can serve without growing (the workspace pool serves all)."""
        return min(b.capacity for b in self._row_buffers())

    def reserve(self, rows: int) -> None:
        """Grow every row-sized buffer to ``rows`` query rows (before capture only): all of
        them or, when one may not grow (captured), none."""
        buffers = self._row_buffers()
        for b in buffers:
            b.check_growth(int(rows))
        for b in buffers:
            b.reserve(rows)

    def nbytes(self) -> int:
        """Bytes held by all buffers."""
        return sum(b.nbytes() for b in self.buffers())

    # -- the capture mark -----------------------------------------------------------------
    @property
    def captured(self) -> bool:
        """True once any graph holds this metadata."""
        return self._captured or any(b.captured for b in self.buffers())

    @property
    def q_pad_captured(self) -> bool:
        """The q-pad mark: True once a graph holds the q-pad buffer; growth then fails.
        Always False on metadata without a q-pad buffer (``padded_heads=None``)."""
        return self.q_pad is not None and (self._captured or self.q_pad.captured)

    @property
    def oversized(self) -> bool:
        """True while the planned step has more rows than the captured buffers hold
        (``num_planned_rows > capacity`` after capture): it runs eagerly on temporaries."""
        return self._oversized is not None

    def mark_captured(self) -> None:
        """Pin every buffer (a capture calls this; it is never undone)."""
        self._captured = True
        for b in self.buffers():
            b.mark_captured()

    # -- per-call slices ------------------------------------------------------------------
    def zero_padded_q(self, q: torch.Tensor) -> torch.Tensor:
        """Copy ``q [rows, num_heads, d_qk]`` into a row slice of the q-pad buffer.

        Returns ``[rows, padded_heads, d_qk]`` whose extra heads are zero (the padding is never
        written, so it stays as allocated).
        """
        if self.q_pad is None:
            raise RuntimeError("this metadata has no q-pad buffer (padded_heads=None)")
        expected = (self.num_heads, self.d_qk)
        if q.dim() != 3 or tuple(q.shape[1:]) != expected or q.dtype != self.dtype:
            raise ValueError(
                f"zero_padded_q: expected q [rows, {expected[0]}, {expected[1]}] {self.dtype}, "
                f"got {tuple(q.shape)} {q.dtype}"
            )
        if self._oversized is not None and q.shape[0] > self.q_pad.capacity:
            padded = self._step_temporary(self.q_pad, q.shape[0])  # zero padding heads
            padded.narrow(1, 0, self.num_heads).copy_(q)
            return padded
        padded = self.q_pad.view(q.shape[0])
        heads = self._q_heads.get(q.shape[0])
        if heads is None or heads[0] is not padded:  # new row count, or the storage grew
            heads = (padded, padded.narrow(1, 0, self.num_heads))
            if not torch.compiler.is_compiling():
                self._q_heads[q.shape[0]] = heads
        heads[1].copy_(q)
        return padded

    def counter_for(self, rows: int) -> torch.Tensor:
        """``[rows, counter_cols]`` int32 zeros: captured storage, or an eager temporary."""
        if self.counter is None:
            raise RuntimeError("this metadata has no multi-CTA counter (counter_cols=0)")
        if self._oversized is not None and rows > self.counter.capacity:
            return self._step_temporary(self.counter, rows)
        return self.counter.view(rows)

    def workspace_splits(self, rows: int) -> int:
        """The most splits per row the pool holds at ``rows`` rows: ``min(num_splits, P // rows)``
        (a capacity, not a choice: the kernel's launch plan picks how many it uses, at most this).

        0 when ``rows`` exceeds the pool: the kernels then run one split, which writes ``out``
        directly (``split_plan`` sizes the pool so that this happens only where they would
        choose one split anyway).
        """
        if self.workspace_out is None:
            raise RuntimeError("this metadata has no split-KV workspace (num_splits=0)")
        return min(self.num_splits, self.workspace_out.capacity // max(rows, 1))

    def workspace_for(self, rows: int, splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Split-KV partials ``([rows, S, Hw, d_v], [rows, S, Hw])`` float32.

        ``S = splits`` (the launch plan's count; at most :meth:`workspace_splits`), or all the
        pool holds when ``None``. Views of the first ``rows * S`` partials of the pool: every row
        count shares its storage, and the same ``(rows, S)`` gets the same view objects.
        """
        most = self.workspace_splits(rows)  # raises when there is no workspace
        s = most if splits is None else splits
        if not 0 <= s <= most:
            raise ValueError(
                f"workspace_for: {s} splits x {rows} rows exceed the pool of "
                f"{self.workspace_out.capacity} partials (at most {most} splits at {rows} rows)"
            )
        key = (rows, s)
        views = self._ws_views.get(key)
        if views is None or torch.compiler.is_compiling():
            out = self.workspace_out.view(rows * s)
            lse = self.workspace_lse.view(rows * s)
            views = (out.view(rows, s, *out.shape[1:]), lse.view(rows, s, *lse.shape[1:]))
            if not torch.compiler.is_compiling():  # the pool never grows, so views stay valid
                self._ws_views[key] = views
        return views

    def indices_for(self, rows: int) -> torch.Tensor:
        """``[rows, topk]`` int32 slice of the persistent index table, or the oversized step's
        temporary table (written by ``refresh_``) when ``rows`` exceeds the captured capacity."""
        if self._oversized is not None:
            if rows == self._oversized.shape[0]:
                if is_capturing():  # a graph would bake the address of a per-step table
                    raise CaptureCapacityError(self.indices.name, self.indices.capacity, rows)
                return self._oversized
            self._check_step_rows(rows)
        return self.indices.view(rows)

    def _check_step_rows(self, rows: int) -> None:
        """An oversized step is planned: refuse a call for another row count (it would read
        the captured table's stale rows, or a table nobody wrote)."""
        if rows != self.num_planned_rows:
            raise ValueError(
                f"the planned step has {self.num_planned_rows} rows (more than the {self.capacity} "
                f"reserved: it runs on temporaries), but a call came with {rows} rows. Fix: call "
                f"backend.plan(metadata, indices) with this step's [{rows}, {self.topk}] indices first."
            )

    def _step_temporary(self, buf: GrowOnlyBuffer, rows: int) -> torch.Tensor:
        """``buf``'s scratch for the oversized step (filled like a new buffer; never stored)."""
        self._check_step_rows(rows)
        return buf.temporary(rows)

    def bound_call(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """A launch-ready call over this metadata's views, kept per ``key`` (``build()`` makes
        it on a miss; ``None`` is not kept). Every kept call is forgotten when any buffer's
        storage is replaced, so none outlives the views it holds. Host side, eager only."""
        bound = self._bound.current()
        call = bound.get(key)
        if call is None:
            call = build()
            if call is not None and self._bound.is_current():
                if len(bound) >= _MAX_BOUND_CALLS:  # prefill chunks of many sizes
                    bound.clear()
                bound[key] = call
        return call

    # -- replays --------------------------------------------------------------------------
    def refresh_(self, indices: torch.Tensor, pad_to: int | None = None) -> None:
        """Write a step's ``indices [n, topk]`` into the persistent table, in place.

        Rows ``n:pad_to`` are set to −1 (inert padding rows of a graph bucket). No tensor,
        buffer or mark is replaced; a captured table cannot grow.
        """
        if indices.dim() != 2 or indices.shape[1] != self.topk:
            raise ValueError(
                f"refresh_: expected indices [rows, {self.topk}], got {tuple(indices.shape)}"
            )
        n = indices.shape[0]
        rows = max(n, pad_to or 0)
        if self.indices.captured and rows > self.indices.capacity:
            self._refresh_oversized(indices, rows)
            return
        self._oversized = None
        table = self.indices.view(rows)
        if rows == n:
            table.copy_(indices)
        else:
            table[:n].copy_(indices)
        self._padding.pad(n, rows, self._fill_indices, self.indices.tensor)
        self.num_rows = n
        self.num_planned_rows = rows
        self._planned = True
        self._pending_index_check = False
        self._refused = None
        self.checked_rows = rows

    # -- planned rows: what forward and a runner's replay may read -------------------------
    def refuse_plan(self, reason: str) -> None:
        """Forget the last plan: ``plan()`` refused this step's indices (``reason``), so no
        ``forward`` or replay may read rows until the next ``plan()`` succeeds (the table still
        holds an earlier step's indices)."""
        self._refused = reason
        self.num_rows = self.num_planned_rows = self.checked_rows = 0
        self._pending_index_check = False
        self._oversized = None

    def require_index_check(self) -> None:
        """Check the planned indices against the pool at the next eager ``forward`` (which
        knows the pool size; ``plan(check_indices=True)`` calls this)."""
        self._pending_index_check = True
        self.checked_rows = 0  # sends the next forward down the slow path

    def check_forward(self, rows: int, pool_tokens: int, who: str) -> None:
        """The slow path of a ``forward`` of ``rows`` q rows (``rows > checked_rows``).

        Runs a pending index check (outside captures: it synchronises), and refuses more rows
        than ``plan()`` wrote, except during a runner's capture (:meth:`capture_rows`).

        Raises:
            ValueError: more q rows than planned, or no ``plan()`` yet.
            IndexError: a pending index check found an index outside ``[0, pool_tokens)``, not -1.
        """
        if self._pending_index_check and not is_capturing():
            check_index_range(who, self.indices_for(self.num_rows), pool_tokens)
            self._pending_index_check = False
            self.checked_rows = self.num_planned_rows
        if rows <= self.num_planned_rows:
            return
        if rows <= self._capture_rows:  # a capture's rows are inert: replays check their own
            self._read_unplanned = True
            return
        raise ValueError(f"{who}: {self._unplanned_message(rows, 'q has')}")

    def _unplanned_message(self, rows: int, what: str) -> str:
        if self._refused is not None:
            done = f"the last plan() refused its indices ({self._refused})"
        elif not self._planned:
            done = "plan() has not been called on this metadata"
        else:
            done = (f"the last plan() wrote {self.num_planned_rows} rows ({self.num_rows} live"
                    f"{' + padding' if self.num_planned_rows > self.num_rows else ''})")
        return (
            f"{what} {rows} rows but {done}; rows past the plan would attend over another step's "
            f"indices. Fix: call backend.plan(metadata, indices) with this step's [{rows}, "
            f"{self.topk}] indices first (before a graph replay: pad_to=runner.bucket_for(rows))"
        )

    def check_replay_rows(self, rows: int, bucket: int) -> None:
        """A runner's check before replaying ``bucket`` rows for ``rows`` live rows: the last
        plan wrote at least ``rows`` live rows and ``bucket`` rows in all. Skipped when the
        index table was never planned nor read (the runner's function does not use it).

        Raises:
            ValueError: the plan does not cover the replay.
        """
        if not (self._planned or self._read_unplanned):
            return
        if rows > self.num_rows:
            raise ValueError(f"GraphRunner.run: {self._unplanned_message(rows, 'the live inputs have')}")
        if bucket > self.num_planned_rows:
            raise ValueError(
                f"GraphRunner.run: the replay of bucket {bucket} reads {bucket} planned rows but "
                f"the last plan() wrote {self.num_planned_rows}; rows past it hold another step's "
                f"indices. Fix: plan(metadata, indices, pad_to=runner.bucket_for({rows}))"
            )

    @contextlib.contextmanager
    def capture_rows(self, rows: int) -> Iterator[None]:
        """Within the block, ``forward`` accepts up to ``rows`` q rows without a plan: a
        graph runner's warm-up and capture of a bucket run on inert inputs, and replays check
        the plan themselves (:meth:`check_replay_rows`)."""
        before, self._capture_rows = self._capture_rows, rows
        try:
            yield
        finally:
            self._capture_rows = before

    def extend_plan_(self, rows: int) -> None:
        """Pad the planned step to ``rows`` rows with inert rows (−1) in place, so a graph
        bucket of ``rows`` replays on it; a no-op when it already has that many.

        ``GraphRunner.run`` calls it with the bucket it replays, so an engine's ``plan()``
        needs no ``pad_to``. Host side, not capturable; like ``refresh_``, padding rows are
        filled only where an earlier, larger step wrote.

        Raises:
            ValueError: the planned step is oversized (it runs eagerly, on temporaries).
        """
        planned = self.num_planned_rows
        if not self._planned:
            return  # nothing planned to pad: the runner's replay check refuses the step
        if self._oversized is not None:
            raise ValueError(
                f"a graph bucket of {rows} rows is about to replay, but the planned step has "
                f"{planned} rows, more than the {self.capacity} reserved (it can only run "
                f"eagerly). Fix: call backend.plan(metadata, indices) with this step's indices first."
            )
        if rows <= planned:
            return
        self.indices.view(rows)  # grows the table before capture, as refresh_ does
        self._padding.pad(planned, rows, self._fill_indices, self.indices.tensor)
        self.num_planned_rows = rows
        if not self._pending_index_check:
            self.checked_rows = rows

    def _fill_indices(self, start: int, stop: int) -> None:
        self.indices.view(stop)[start:stop].fill_(-1)

    def _refresh_oversized(self, indices: torch.Tensor, rows: int) -> None:
        """Write an oversized step into a temporary table; the captured one is left untouched
        (so are its dirty-row records). Raises :class:`CaptureCapacityError` during a capture."""
        table = self.indices.temporary(rows)  # [rows, topk] int32, all -1
        table[: indices.shape[0]].copy_(indices)
        if not self._oversized_logged:
            self._oversized_logged = True
            log.info(
                "eager step of %d rows exceeds the %d rows reserved before capture: it runs on "
                "temporary index, q-pad and counter buffers (allocated per step; captured buffers "
                "untouched). Reserve more rows in make_metadata(max_rows) to avoid this.",
                rows, self.capacity,
            )
        self._oversized = table
        self.num_rows = indices.shape[0]
        self.num_planned_rows = rows
        self._planned = True
        self._pending_index_check = False
        self._refused = None
        self.checked_rows = rows

    def __repr__(self) -> str:
        return (
            f"GraphMetadata(rows={self.capacity}, heads={self.num_heads}, "
            f"padded_heads={self.padded_heads}, topk={self.topk}, dtype={self.dtype}, "
            f"captured={self.captured})"
        )
