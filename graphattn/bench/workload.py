"""A synthetic DeepSeek-like sparse-MLA decode workload: shapes, inputs and the cost model.

Each decode step runs attention in every layer for ``rows`` query tokens (one per request);
every layer has its own KV pool and its own q, and the step's top-k indices (distinct, random
over the pool, so the KV comes from memory rather than cache) are planned once per step and
shared by the layers, as an engine shares one metadata object. Only ``measure_layers`` layers
are materialised; per-step figures scale the per-layer time by ``num_layers``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8, TOKEN_BYTES, kv_dtype_name, quantize_kv
from ..common.metadata import D_QK, D_V
from ..common.platform import Platform

# Query scale: logits of std ~3 (peaked, like trained attention), so outputs stay O(0.1..2) at
# top-k 2048 and the reference check is meaningful.
Q_STD = 3.0
# The H200 roofline ceilings measured on our machine (docs/design.md, "Measured hardware
# facts"): device-to-device copy, read + write counted, and a bf16 matmul on random data.
H200_BYTES_PER_S = 4.2e12
H200_FLOP_PER_S = 790e12


def attention_bytes(rows: int, heads: int, topk: int, elt: int = 2, kv_token_bytes: int | None = None) -> int:
    """Bytes one sparse-MLA call must move: each row's top-k KV rows read once for all heads,
    q in and out back, real heads only (padding is not useful work); ``elt`` bytes per q/out
    value, ``kv_token_bytes`` per KV token (default ``576 * elt``; 656 for FP8 tokens)."""
    kv_token = kv_token_bytes if kv_token_bytes is not None else D_QK * elt
    return rows * (topk * kv_token + heads * (D_QK + D_V) * elt)


def attention_flops(rows: int, heads: int, topk: int) -> float:
    """``2 * rows * heads * topk * (576 for QK^T + 512 for PV)``."""
    return 2.0 * rows * heads * topk * (D_QK + D_V)


@dataclass(frozen=True)
class DecodeWorkload:
    """Shapes of the benchmark.

    Attributes:
        num_heads: query heads per row (per rank: 128 at TP 1, 16 at TP 8).
        topk: indices per row (DeepSeek-V3.2 sparse attention: 2048).
        pool_tokens: KV pool rows per layer.
        batch_sizes: rows per step to measure (each is a graph bucket).
        num_layers: layers of the model (per-step figures = per layer x this).
        measure_layers: layers actually materialised and timed.
        dtype: q dtype (and kv's with ``kv_dtype="auto"``).
        kv_dtype: KV layout: ``"auto"`` (``[pool, 576]`` in ``dtype``) or ``"fp8"`` (656-byte
            FP8 tokens, in the platform's format).
        seed: RNG seed of the synthetic data.
    """

    num_heads: int = 128
    topk: int = 2048
    pool_tokens: int = 262144
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    num_layers: int = 61
    measure_layers: int = 4
    dtype: torch.dtype = field(default=torch.bfloat16)
    seed: int = 0
    kv_dtype: str = KV_AUTO

    def __post_init__(self) -> None:
        problems = []
        try:
            kv_dtype_name(self.kv_dtype)
        except ValueError as exc:
            problems.append(str(exc))
        if self.num_heads < 1 or self.topk < 1:
            problems.append(f"heads and topk must be >= 1 (got {self.num_heads}, {self.topk})")
        if self.pool_tokens < self.topk:
            problems.append(f"pool_tokens ({self.pool_tokens}) must be >= topk ({self.topk}): "
                            "indices are distinct tokens of the pool")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            problems.append(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if not 1 <= self.measure_layers <= self.num_layers:
            problems.append(f"measure_layers must be in [1, num_layers={self.num_layers}], "
                            f"got {self.measure_layers}")
        if problems:
            raise ValueError("invalid decode workload: " + "; ".join(problems))

    @classmethod
    def default_for(cls, platform: Platform) -> "DecodeWorkload":
        """Realistic shapes on a GPU; small ones on the CPU (finishes in seconds on 2 cores)."""
        if platform.has_gpu:
            return cls()
        return cls(num_heads=16, topk=64, pool_tokens=2048, batch_sizes=(1, 2, 4, 8),
                   num_layers=4, measure_layers=2, dtype=torch.float16)

    @property
    def max_rows(self) -> int:
        """Rows the metadata reserves (the largest batch)."""
        return max(self.batch_sizes)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["dtype"] = str(self.dtype).replace("torch.", "")
        d["batch_sizes"] = list(self.batch_sizes)
        return d

    # -- inputs -------------------------------------------------------------------------------
    def make_kv(self, device: torch.device, generator: torch.Generator) -> list[torch.Tensor]:
        """``measure_layers`` KV pools, each ``[pool_tokens, 576]`` of ``dtype``, or with
        ``kv_dtype="fp8"`` ``[pool_tokens, 656]`` uint8 FP8 tokens (random values quantised)."""
        if kv_dtype_name(self.kv_dtype) == KV_FP8:
            return [quantize_kv(_randn((self.pool_tokens, D_QK), torch.float32, device, generator))
                    for _ in range(self.measure_layers)]
        return [_randn((self.pool_tokens, D_QK), self.dtype, device, generator) for _ in range(self.measure_layers)]

    def make_q(self, rows: int, device: torch.device, generator: torch.Generator) -> list[torch.Tensor]:
        """One ``[rows, num_heads, 576]`` q per measured layer."""
        return [_randn((rows, self.num_heads, D_QK), self.dtype, device, generator, Q_STD)
                for _ in range(self.measure_layers)]

    def make_indices(self, rows: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        """``[rows, topk]`` int32: per row, ``topk`` distinct random tokens of the pool."""
        keys = torch.rand(rows, self.pool_tokens, generator=generator, device=generator.device)
        return keys.topk(self.topk, dim=1).indices.to(device=device, dtype=torch.int32)

    # -- cost model ----------------------------------------------------------------------------
    def bytes_per_layer(self, rows: int) -> int:
        """Bytes one layer must move (:func:`attention_bytes`; 656 per KV token with FP8)."""
        elt = torch.empty((), dtype=self.dtype).element_size()
        kv_token = TOKEN_BYTES if kv_dtype_name(self.kv_dtype) == KV_FP8 else None
        return attention_bytes(rows, self.num_heads, self.topk, elt, kv_token)

    def flops_per_layer(self, rows: int) -> float:
        """Flops of one layer (:func:`attention_flops`)."""
        return attention_flops(rows, self.num_heads, self.topk)


def _randn(shape, dtype, device, generator, std: float = 1.0) -> torch.Tensor:
    t = torch.randn(*shape, generator=generator, device=generator.device) * std
    return t.to(device=device, dtype=dtype)


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded generator on ``device`` (data is generated where it is used)."""
    return torch.Generator(device=device).manual_seed(seed)
