"""The AttentionBackend contract: capabilities as class data, plan on the host, run on the device.

A backend is one class. Its capabilities are class attributes (read without an instance, so
``graphattn list`` and ``--attn-backend auto`` can decide without allocating anything), and
:meth:`AttentionBackend.refusal_reasons` turns them into the list of reasons a configuration is
refused (vLLM's ``validate_configuration`` style). Work is split FlashInfer-style:

* :meth:`~AttentionBackend.make_metadata` -- once, before any capture: reserve every buffer the
  kernel will ever touch, sized in **query rows** (``max(max_batch_size, max_num_tokens)``).
* :meth:`~AttentionBackend.plan` -- host side, **not capturable**: write the step's indices into
  the metadata's persistent storage in place (``GraphMetadata.refresh_``).
* :meth:`~AttentionBackend.forward` -- device only, **capturable**: reads only the metadata's
  persistent storage and its arguments, allocates nothing that outlives the call.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
from typing import Any, ClassVar

import torch

from ..common.kv_layout import KV_AUTO, KV_FP8, dequantize_kv, describe_kv_dtype, kv_dtype_name
from ..common.metadata import D_QK, D_V, GraphMetadata
from ..common.platform import Platform, check_platform_arg, current_platform
from ..common.validation import check_index_range, check_indices_default, check_int, check_sm_scale, is_int
from ._checks import BackendChecks


class GraphSupport(enum.IntEnum):
    """How far a backend's ``forward`` may go into a captured graph (vLLM's AttentionCGSupport).

    NEVER: eager only; engines must not capture it.
    BREAK_ONLY: runs as the eager break of a breakable graph (``eager_on_graph``), not inside a
        captured segment (e.g. a kernel that syncs with the host).
    FULL: capturable inside a full graph, and also usable as a break.
    """

    NEVER = 0
    BREAK_ONLY = 1
    FULL = 2


def kv_kwargs(kv_dtype: str) -> dict[str, str]:
    """``{"kv_dtype": kv_dtype}`` for :meth:`AttentionBackend.refusal_reasons`, or ``{}`` for the
    default ``"auto"``, so a backend that overrides it without a ``kv_dtype`` parameter (written
    before FP8 KV) keeps working for the default layout."""
    return {} if kv_dtype == KV_AUTO else {"kv_dtype": kv_dtype}


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class AttentionBackend(BackendChecks):
    """Base class of every sparse MLA attention backend.

    Computation (DeepSeek sparse MLA, one shared latent KV head, ``d_qk = 576``, ``d_v = 512``):
    ``q [rows, num_heads, 576]`` (``dtype``), ``kv [pool_tokens, 576]`` (``dtype``; V is its first
    512 columns), per-row ``indices [rows, topk]`` int32 into the pool with -1 = skip, gives
    ``out [rows, num_heads, 512]`` (``dtype``) and ``lse [rows, num_heads]`` float32 (natural log).
    A row whose indices are all -1 gives ``out = 0``, ``lse = -inf``. With ``kv_dtype="fp8"``
    kv is ``[pool_tokens, 656]`` uint8 instead: DeepSeek's 656-byte FP8 tokens
    (:mod:`graphattn.common.kv_layout`), in the platform's FP8 format; q stays ``dtype``.

    Class data (subclasses override):
        name: the ``--attn-backend`` name.
        supported_dtypes: q dtypes the backend accepts (and kv's, for ``kv_dtype="auto"``).
        supported_kv_dtypes: KV-cache layouts it accepts: ``"auto"`` (kv in q's dtype) and/or
            ``"fp8"`` (656-byte FP8 tokens).
        head_multiple: the head count must be a multiple of this (1 = any); a backend that pads
            accepts any count up to ``max_heads``.
        max_heads: largest head count accepted (``None`` = no limit).
        pads_q: q is padded through ``GraphMetadata.zero_padded_q`` to the platform's
            ``head_pad_multiple`` (the q-pad rule applies). No built-in backend pads: their
            kernels read q unpadded at any head count.
        uses_counter: the kernel uses the multi-CTA counter (the counter rule applies).
        uses_workspace: the kernel writes split-KV partials to the metadata workspace.
        unit_stride_only: q and kv need a contiguous last dim (kernels index it with stride 1).
        uses_triton: the kernel is a Triton kernel (on a machine without a GPU it runs under the
            Triton interpreter: correct but slow, for small shapes only).
        platforms: platform names (``cpu``, ``cuda``, ``hip``) it runs on.
        graph_support: a :class:`GraphSupport` level.
        description: one line for ``graphattn list``.
    """

    name: ClassVar[str] = "abstract"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16)
    supported_kv_dtypes: ClassVar[tuple[str, ...]] = (KV_AUTO,)
    head_multiple: ClassVar[int] = 1
    max_heads: ClassVar[int | None] = None
    pads_q: ClassVar[bool] = False
    uses_counter: ClassVar[bool] = False
    uses_workspace: ClassVar[bool] = False
    uses_triton: ClassVar[bool] = False
    unit_stride_only: ClassVar[bool] = False
    platforms: ClassVar[tuple[str, ...]] = ("cpu", "cuda", "hip")
    graph_support: ClassVar[GraphSupport] = GraphSupport.FULL
    description: ClassVar[str] = ""

    def __init__(
        self,
        num_heads: int,
        topk: int,
        dtype: torch.dtype,
        sm_scale: float | None = None,
        platform: Platform | None = None,
        kv_dtype: str = KV_AUTO,
    ):
        """Configure the backend; raises ``ValueError`` listing every refusal reason.

        Args:
            num_heads: query heads per row (on this rank, after tensor parallelism).
            topk: indices per row (the sparse top-k; for dense decode, the max context length).
            dtype: q dtype (and kv's with ``kv_dtype="auto"``).
            sm_scale: softmax scale; default ``d_qk ** -0.5``.
            platform: defaults to ``current_platform()``.
            kv_dtype: the KV-cache layout, ``"auto"`` (``[pool, 576]`` in ``dtype``) or ``"fp8"``
                (``[pool, 656]`` uint8 FP8 tokens, :mod:`graphattn.common.kv_layout`).
        """
        who = f"attention backend '{self.name}'"
        _check_config_types(who, num_heads, dtype, topk, platform)
        sm_scale = D_QK**-0.5 if sm_scale is None else check_sm_scale(who, sm_scale)
        self.platform = platform or current_platform()
        kv_dtype = kv_dtype_name(kv_dtype)
        reasons = self.refusal_reasons(num_heads, dtype, topk, self.platform, **kv_kwargs(kv_dtype))
        if reasons:
            raise ValueError(
                f"attention backend '{self.name}' refuses num_heads={num_heads}, topk={topk}, "
                f"dtype={dtype}, kv_dtype={kv_dtype} on platform '{self.platform.name}': " + "; ".join(reasons)
            )
        self.num_heads, self.topk, self.dtype = int(num_heads), int(topk), dtype
        self.kv_dtype = kv_dtype
        self.sm_scale = sm_scale
        # What check_metadata compares (host attributes only, so the check stays cheap).
        self._metadata_config = (self.num_heads, self.topk, self.dtype, self.padded_heads)

    # -- capabilities --------------------------------------------------------------------------
    @classmethod
    def refusal_reasons(
        cls,
        num_heads: int,
        dtype: torch.dtype,
        topk: int,
        platform: Platform | None = None,
        kv_dtype: str = KV_AUTO,
    ) -> list[str]:
        """Every reason this backend cannot run the configuration here; ``[]`` means it can.

        Reads only class data and the platform, so it is cheap and allocates nothing.
        ``kv_dtype``: the KV-cache layout (``"auto"`` or ``"fp8"``).
        """
        _check_config_types(f"attention backend '{cls.name}'", num_heads, dtype, topk, platform)
        platform = platform or current_platform()
        reasons = []
        if platform.name not in cls.platforms:
            reasons.append(f"platform '{platform.name}' not in supported {list(cls.platforms)}")
        if dtype not in cls.supported_dtypes:
            names = [str(d).replace("torch.", "") for d in cls.supported_dtypes]
            reasons.append(f"dtype {str(dtype).replace('torch.', '')} not in supported {names}")
        try:
            kv = kv_dtype_name(kv_dtype)
        except ValueError as exc:
            reasons.append(str(exc))
        else:
            if kv not in cls.supported_kv_dtypes:
                reasons.append(f"kv_dtype {describe_kv_dtype(kv)} not in supported KV layouts "
                               f"{list(cls.supported_kv_dtypes)}")
        if num_heads < 1 or num_heads % cls.head_multiple:
            reasons.append(f"num_heads={num_heads} is not a positive multiple of {cls.head_multiple}")
        if cls.max_heads is not None and num_heads > cls.max_heads:
            reasons.append(f"num_heads={num_heads} exceeds the maximum {cls.max_heads}")
        if topk < 1:
            reasons.append(f"topk={topk} must be >= 1")
        if cls.uses_triton:
            reasons.extend(cls._triton_reasons(platform))
        return reasons

    @classmethod
    def _triton_reasons(cls, platform: Platform) -> list[str]:
        reasons = []
        if importlib.util.find_spec("triton") is None:
            reasons.append("the 'triton' package is not installed (pip install triton)")
        if platform.uses_triton_interpreter and importlib.util.find_spec("numpy") is None:
            reasons.append("the Triton interpreter (no GPU here) needs numpy (pip install numpy)")
        return reasons

    @classmethod
    def notes(cls, platform: Platform | None = None) -> list[str]:
        """Caveats that do not refuse the backend (shown by ``graphattn list``)."""
        platform = platform or current_platform()
        if cls.uses_triton and platform.uses_triton_interpreter:
            return ["runs under the Triton interpreter (no GPU): correct but slow, small shapes"]
        return []

    @classmethod
    def capabilities(cls, platform: Platform | None = None) -> dict[str, object]:
        """The class data as a plain dict (for ``graphattn list`` and JSON reports)."""
        platform = platform or current_platform()
        heads = "any" if cls.head_multiple == 1 else f"multiple of {cls.head_multiple}"
        if cls.max_heads is not None:
            heads += f", <= {cls.max_heads}"
        return {
            "dtypes": [str(d).replace("torch.", "") for d in cls.supported_dtypes],
            "kv_dtypes": list(cls.supported_kv_dtypes),
            "heads": heads,
            "pads_q": cls.pads_q,
            "pad_multiple": platform.head_pad_multiple if cls.pads_q else None,
            "uses_counter": cls.uses_counter,
            "uses_workspace": cls.uses_workspace,
            "platforms": list(cls.platforms),
            "graph_support": cls.graph_support.name,
            "triton": cls.uses_triton,
        }

    # -- the three phases ----------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where this backend's tensors live."""
        return self.platform.device

    @property
    def padded_heads(self) -> int | None:
        """Head count of the q-pad buffer (``None`` when the backend does not pad, or when
        ``num_heads`` is already a multiple of the platform's ``head_pad_multiple``)."""
        if not self.pads_q:
            return None
        padded = _round_up(self.num_heads, self.platform.head_pad_multiple)
        return padded if padded != self.num_heads else None  # already a multiple: no copy

    def make_metadata(self, max_rows: int) -> GraphMetadata:
        """Reserve graph-safe buffers for up to ``max_rows`` query rows. Host side, not capturable.

        Call once per runner, before the first capture, with
        ``max_rows = max(max_batch_size, max_num_tokens)`` (rows are query tokens, not requests).
        Every bucket's graph and every eager call up to ``max_rows`` then uses slices of these
        buffers; none is ever replaced.
        """
        check_int(f"{self.name}.make_metadata", "max_rows", max_rows, 1)
        return GraphMetadata(
            max_rows, self.num_heads, self.topk, self.dtype, self.device,
            padded_heads=self.padded_heads,
        )

    def plan(
        self, metadata: GraphMetadata, indices: torch.Tensor, pad_to: int | None = None,
        check_indices: bool | None = None, pool_tokens: int | None = None,
    ) -> None:
        """Host-side setup for one step. **Not capturable**: call it outside any graph.

        Writes ``indices [rows, topk]`` int32 (-1 = skip) into ``metadata``'s persistent index
        table in place; rows ``rows:pad_to`` become -1 (the inert padding rows of a graph bucket;
        ``GraphRunner.run`` pads to its bucket itself, so engines need no ``pad_to``). After
        capture, a step with more rows than the metadata reserved is written to a temporary
        table instead (an oversized eager step, see ``GraphMetadata.oversized``). ``forward``
        then accepts up to ``max(rows, pad_to)`` q rows.

        ``check_indices``: validate the indices (default: ``GRAPHATTN_CHECK_INDICES``, read at
        import). Out-of-range indices are skipped by contract; this finds the engine bug behind
        them: values below -1 now, values at or past the pool now when ``pool_tokens`` is given,
        else at the next eager ``forward`` (which knows the pool). It synchronises: debug only.

        Raises:
            TypeError: indices not a tensor, metadata not a ``GraphMetadata``, ``pad_to`` not an int.
            ValueError: wrong dtype or shape, ``pad_to`` < rows, metadata of another backend,
                indices on another GPU than the metadata.
            IndexError: (``check_indices``) the first bad row and value.
            CaptureCapacityError: more rows than reserved, during a capture.
        """
        self.check_plan(metadata, indices, pad_to)
        if check_indices is None:
            check_indices = check_indices_default()
        if check_indices:  # before the write, and no forward runs on an earlier plan after it
            who = f"{self.name}.plan"
            pool = None if pool_tokens is None else check_int(who, "pool_tokens", pool_tokens, 1)
            try:
                check_index_range(who, indices, pool)
            except IndexError as exc:
                metadata.refuse_plan(str(exc).split(". ")[0])
                raise
        metadata.refresh_(indices, pad_to=pad_to)
        if check_indices and pool_tokens is None:
            metadata.require_index_check()  # the pool is known at the next eager forward

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention for ``q [rows, num_heads, 576]`` over ``kv [pool, 576]``. **Capturable.**

        Reads ``metadata.indices_for(rows)`` (written by :meth:`plan`). Returns
        ``out [rows, num_heads, 512]`` (q's dtype) and ``lse [rows, num_heads]`` float32.

        ``out``: optional contiguous ``(out, lse)`` of those shapes and dtypes to write into
        (they are returned). A breakable graph's attention break passes the tensors its later
        segments read, so a replay needs no copy (``eager_on_graph(forward, out="out")``).
        Third-party backends may leave it out of their signature; callers check first
        (:func:`accepts_out`).
        """
        raise NotImplementedError

    def bind_break(self, args: tuple, kwargs: dict) -> Any:
        """A breakable graph's replay call for ``forward(*args, **kwargs)`` (the ``bind`` of
        ``eager_on_graph(backend.forward, out="out", bind=backend.bind_break)``), or ``None``
        to run ``forward`` on every replay (this default).

        A replay call does what ``forward`` does on the same argument objects with the
        checks of what cannot change between replays (shapes, dtypes, devices, the output
        pair) done once, here; it still takes ``forward``'s path whenever the planned rows,
        the current device, a dispatch mode, tracing or a capture could change the outcome.
        """
        return None

    @property
    def kv_fp8(self) -> bool:
        """True when kv is passed as 656-byte FP8 tokens (``kv_dtype="fp8"``)."""
        return self.kv_dtype == KV_FP8

    def kv_rows_float(self, rows: torch.Tensor) -> torch.Tensor:
        """Gathered kv rows ``[..., 576]`` (q's dtype) or ``[..., 656]`` uint8 (FP8 tokens in the
        platform's format, dequantised into q's dtype as the kernels and the reference read
        them: :func:`~graphattn.common.kv_layout.dequantize_kv`) as float32 ``[..., 576]``.
        Capturable."""
        if self.kv_fp8:
            rows = dequantize_kv(rows, self.platform.fp8_dtype, self.dtype)
        return rows.float()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, num_heads={self.num_heads}, "
            f"topk={self.topk}, dtype={self.dtype}, kv_dtype={self.kv_dtype!r}, "
            f"platform={self.platform.name})"
        )


def _check_config_types(who: str, num_heads: Any, dtype: Any, topk: Any, platform: Any) -> None:
    """Raise ``TypeError`` unless the configuration's arguments have their types (their values
    are the refusal reasons' business)."""
    for arg, value in (("num_heads", num_heads), ("topk", topk)):
        if not is_int(value):
            raise TypeError(f"{who}: {arg} must be an int, got {value!r} ({type(value).__name__})")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{who}: dtype must be a torch.dtype (e.g. torch.bfloat16), got {dtype!r}")
    check_platform_arg(who, platform)


def accepts_out(forward: Any) -> bool:
    """Whether a backend's ``forward`` takes the ``out=`` keyword (built-in backends do)."""
    try:
        return "out" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


__all__ = ["AttentionBackend", "GraphSupport", "accepts_out", "D_QK", "D_V"]
