"""Named batch specs and suite shapes of the conformance suite (and its dtype tolerances, from
:mod:`graphattn.common.tolerances`).

A :class:`BatchSpec` is one scenario: a head count, a top-k, the index pattern, the row
counts of successive steps, the rows the metadata reserves and the memory layout of q and kv.
In graph modes the steps are replayed in order, so ``(4, 1, 3)`` shrinks and grows the batch
across buckets; a step larger than every bucket runs eagerly (a prefill chunk) between replays,
which is exactly when a backend that rebinds a captured buffer frees it, and a step larger than
the reserved rows runs eagerly on temporaries (an *oversized* step: README's counter-rebinding
bug replaces a counter there). Two shape sets exist: ``small`` for the CPU (Triton interpreter,
emulated graphs) and ``real`` for GPUs (DeepSeek-like heads and top-k 2048).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The tolerances moved to graphattn.common.tolerances (bench shares them); re-exported here.
from ..common.tolerances import TOLERANCES, Tolerance, tolerance  # noqa: F401

MODES = ("eager", "full", "breakable")
LAYOUTS = ("contiguous", "strided")


@dataclass(frozen=True)
class BatchSpec:
    """One conformance scenario.

    Attributes:
        name: test id (``one_row``, ``decode``, ...).
        num_heads: query heads per row.
        topk: indices per row.
        steps: query rows of successive steps (graph modes replay them in this order).
        pattern: ``random`` (distinct indices spread over the pool), ``ragged`` (each row keeps a
            different number of valid indices, the rest -1, one row has none), or
            ``duplicates`` (indices drawn with replacement from a few tokens).
        poison: hostile data the output must handle as the reference does: ``none``; ``kv``
            (indices only select tokens ``[1, pool // 2)``; token 0, where a -1 clamps to, and
            every token from ``pool // 2`` hold NaN and inf: none may reach any output); ``q``
            (NaN in q: row 0's heads, which attend nothing under ``ragged`` and give out 0 /
            lse -inf, and one head of the last row, whose out and lse must be NaN).
        reserve: query rows the metadata reserves (``make_metadata``); ``None``: the largest
            step. Fewer makes the larger steps *oversized* (graph modes reserve at least the
            largest bucket): they run eagerly on temporaries, and the replays after them must
            still find every captured buffer where it was.
        layout: ``contiguous`` (dense q and kv) or ``strided``: q a head slice of a wider q
            (``[rows, heads + 2, ...]``, heads ``1..heads``) and kv a column slice of a cache
            with padded rows, both with row padding, everything outside the views NaN (FP8:
            0xFF bytes); their last dim has stride 1 for backends that declare
            ``unit_stride_only`` (and FP8 tokens), stride 2 for the others.
        second_call: in ``breakable`` mode each step calls attention a second time, as a
            second break (a model's next layer, one row: ``-q[:1]`` on the same plan): each
            break needs its own out= pair and replay call, and the first one's outputs must
            survive the second.
    """

    name: str
    num_heads: int
    topk: int
    steps: tuple[int, ...]
    pattern: str = "random"
    poison: str = "none"
    reserve: int | None = None
    layout: str = "contiguous"
    second_call: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"spec {self.name!r}: layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.reserve is not None and self.reserve < 1:
            raise ValueError(f"spec {self.name!r}: reserve must be >= 1, got {self.reserve}")

    @property
    def max_rows(self) -> int:
        """The largest step (max(max_bs, max_num_tokens) of an engine)."""
        return max(self.steps)

    @property
    def reserved_rows(self) -> int:
        """Rows the metadata reserves: ``reserve``, else the largest step."""
        return self.max_rows if self.reserve is None else self.reserve


@dataclass(frozen=True)
class SuiteShape:
    """Sizes shared by all specs of a shape set.

    Attributes:
        name: ``small`` or ``real``.
        pool_tokens: rows of the KV pool.
        buckets: graph batch sizes (captured largest first).
        specs: the batch specs.
    """

    name: str
    pool_tokens: int
    buckets: tuple[int, ...]
    specs: tuple[BatchSpec, ...]

    def spec(self, name: str) -> BatchSpec:
        """The spec called ``name`` (``KeyError`` listing the names otherwise)."""
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(f"no batch spec {name!r} in shape set {self.name!r}; have {spec_names()}")


# CPU: the Triton interpreter runs ~30 ms per program, so rows stay <= 6 and top-k <= 40; still
# several KV blocks per row (split-KV and the counter are exercised), a bucket miss within the
# reserved rows (5 > 4) and one past them (6 > 5, oversized), each followed by a replay.
SMALL = SuiteShape(
    name="small",
    pool_tokens=128,
    buckets=(1, 4),
    specs=(
        BatchSpec("one_row", num_heads=4, topk=8, steps=(1, 1)),
        BatchSpec("decode", num_heads=16, topk=40, steps=(4, 1, 3), layout="strided", second_call=True),
        BatchSpec("prefill_chunk", num_heads=8, topk=24, steps=(5, 1, 6, 1), reserve=5),
        BatchSpec("ragged", num_heads=16, topk=40, steps=(3, 4), pattern="ragged"),
        BatchSpec("duplicates", num_heads=8, topk=16, steps=(2, 4), pattern="duplicates"),
        BatchSpec("nan_unselected_kv", num_heads=16, topk=40, steps=(3, 4), pattern="ragged", poison="kv"),
        BatchSpec("nan_q", num_heads=8, topk=24, steps=(3, 2), pattern="ragged", poison="q"),
    ),
)

# GPU: DeepSeek-V3.2-like (128 heads at TP 1, 16 at TP 8, 64 at TP 2; top-k 2048).
REAL = SuiteShape(
    name="real",
    pool_tokens=32768,
    buckets=(1, 2, 4, 8, 16, 32, 64),
    specs=(
        BatchSpec("one_row", num_heads=128, topk=2048, steps=(1, 1)),
        BatchSpec("decode", num_heads=16, topk=2048, steps=(64, 17, 1, 40, 64), layout="strided",
                  second_call=True),
        BatchSpec("prefill_chunk", num_heads=64, topk=2048, steps=(8, 300, 3, 320, 33), reserve=300),
        BatchSpec("ragged", num_heads=128, topk=2048, steps=(24, 7), pattern="ragged"),
        BatchSpec("duplicates", num_heads=16, topk=2048, steps=(5, 32), pattern="duplicates"),
        BatchSpec("nan_unselected_kv", num_heads=64, topk=2048, steps=(9, 64), pattern="ragged", poison="kv"),
        BatchSpec("nan_q", num_heads=128, topk=2048, steps=(4, 33), pattern="ragged", poison="q"),
    ),
)

SHAPES = {"small": SMALL, "real": REAL}


def spec_names() -> list[str]:
    """Spec names (the same in every shape set)."""
    return [s.name for s in SMALL.specs]


def default_shape_name(has_gpu: bool) -> str:
    """``real`` on a GPU, ``small`` where kernels run in the interpreter."""
    return "real" if has_gpu else "small"


# Query scale: logits of std ~3 (peaked, like trained attention) keep |out| around 0.1..2 even
# at top-k 2048, so a zero or mis-indexed output cannot hide under atol.
Q_STD = 3.0


def selectable_tokens(pool_tokens: int) -> int:
    """Tokens ``[1, pool // 2)`` a ``poison="kv"`` spec's indices select from (the count)."""
    return pool_tokens // 2 - 1


def make_indices(
    spec: BatchSpec, rows: int, pool_tokens: int, generator: torch.Generator, device
) -> torch.Tensor:
    """``[rows, topk]`` int32 indices of the spec's pattern (generated on the CPU, then moved)."""
    topk = spec.topk
    # Poisoned KV: only tokens [1, pool // 2) are selectable; the rest hold NaN / inf.
    first, choices = (1, selectable_tokens(pool_tokens)) if spec.poison == "kv" else (0, pool_tokens)
    if choices < topk and spec.pattern != "duplicates":
        raise ValueError(f"spec {spec.name!r}: top-k {topk} exceeds the {choices} selectable tokens")
    if spec.pattern == "duplicates":
        few = max(2, min(choices, topk // 4))
        idx = torch.randint(0, few, (rows, topk), generator=generator)
        idx = torch.randperm(choices, generator=generator)[:few][idx]  # few tokens, anywhere
    else:
        idx = torch.stack(
            [torch.randperm(choices, generator=generator)[:topk] for _ in range(rows)]
        )
    idx += first
    if spec.pattern == "ragged":
        # Row r keeps a different count of valid indices; row 0 keeps none (out 0, lse -inf).
        lengths = torch.randint(1, topk + 1, (rows,), generator=generator)
        lengths[0] = 0
        if rows > 1:
            lengths[-1] = topk
        idx[torch.arange(topk)[None, :] >= lengths[:, None]] = -1
    elif spec.pattern not in ("random", "duplicates"):
        raise ValueError(f"unknown index pattern {spec.pattern!r}")
    return idx.to(torch.int32).to(device)
