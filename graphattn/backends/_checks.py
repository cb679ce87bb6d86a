"""The argument checks of :class:`~graphattn.backends.base.AttentionBackend` (a mixin, so the
contract's file stays about the contract): each failure says what was expected, what came, and
the fix. ``check_call`` is on the eager hot path, so it compares Python attributes only.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..common.buffers import byte_span
from ..common.kv_layout import TOKEN_BYTES, check_fp8_kv
from ..common.metadata import D_QK, D_V, GraphMetadata
from ..common.validation import check_int


class BackendChecks:
    """Checks of ``plan`` / ``forward`` arguments; needs the backend's ``name``, ``num_heads``,
    ``dtype``, ``kv_dtype``, ``uses_counter``, ``uses_workspace``, ``unit_stride_only``,
    ``device`` and ``_metadata_config`` (set by ``AttentionBackend.__init__``)."""

    name: ClassVar[str]
    unit_stride_only: ClassVar[bool]
    uses_counter: ClassVar[bool]
    uses_workspace: ClassVar[bool]
    num_heads: int
    dtype: torch.dtype
    kv_dtype: str
    _metadata_config: tuple

    def check_plan(self, metadata: GraphMetadata, indices: torch.Tensor, pad_to: int | None) -> None:
        """Everything :meth:`plan` checks before writing (host side)."""
        try:  # the hot path: one comparison chain; the messages below only when it fails
            fast = (indices.dtype == torch.int32 and indices.dim() == 2
                    and indices.shape[1] == metadata.topk and not indices.is_meta
                    and (pad_to is None or (type(pad_to) is int and pad_to >= indices.shape[0]))
                    and isinstance(metadata, GraphMetadata))
        except AttributeError:
            fast = False
        if fast:
            self.check_metadata(metadata)
            self._check_plan_device(metadata, indices)
            return
        who = f"{self.name}.plan"
        if not isinstance(metadata, GraphMetadata):
            raise TypeError(f"{who}: metadata must be a GraphMetadata, got {type(metadata).__name__}; "
                            "use backend.make_metadata(max_rows)")
        if not isinstance(indices, torch.Tensor):
            raise TypeError(f"{who}: indices must be an int32 tensor [rows, topk], got "
                            f"{type(indices).__name__}; use torch.as_tensor(indices, dtype=torch.int32)")
        if indices.dtype != torch.int32:  # ValueError, as plan() has always raised here
            raise ValueError(f"{who}: indices must be int32, got {indices.dtype}; use indices.to(torch.int32)")
        if indices.dim() != 2 or indices.shape[1] != metadata.topk:
            raise ValueError(f"{who}: indices must be [rows, topk={metadata.topk}], got "
                             f"{tuple(indices.shape)}")
        if indices.device.type == "meta":
            raise ValueError(f"{who}: indices are on the meta device (no data); pass real indices "
                             f"on {metadata.device}")
        if pad_to is not None:
            check_int(who, "pad_to", pad_to, indices.shape[0])
        self.check_metadata(metadata)
        self._check_plan_device(metadata, indices)

    def _check_plan_device(self, metadata: GraphMetadata, indices: torch.Tensor) -> None:
        index = indices.get_device()  # host indices are fine: plan copies them in
        if index >= 0 and index != metadata.indices.tensor.get_device():
            raise ValueError(
                f"{self.name}.plan: indices are on {indices.device} but the metadata is on "
                f"{metadata.indices.tensor.device}; make the indices on the metadata's device "
                f"(or on the host), or use that device's metadata"
            )

    def check_out(self, q: torch.Tensor, kv: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Raise ``ValueError`` unless ``out`` is a contiguous ``(out [rows, num_heads, 512]``
        in q's dtype, ``lse [rows, num_heads]`` float32) pair on q's device whose memory
        overlaps neither the other, q nor kv, and that does not need a gradient."""
        rows = q.shape[0]
        try:
            o, lse = out
            device = q.device  # one comparison chain, asked on every call that passes out
            ok = (o.shape == (rows, self.num_heads, D_V) and o.dtype == q.dtype
                  and lse.shape == (rows, self.num_heads) and lse.dtype == torch.float32
                  and o.is_contiguous() and lse.is_contiguous()
                  and o.device == device and lse.device == device)
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            got = [(tuple(t.shape), t.dtype, str(t.device)) if isinstance(t, torch.Tensor) else type(t).__name__
                   for t in (out if isinstance(out, (tuple, list)) else [out])]
            raise ValueError(
                f"{self.name}: out must be (out [{rows}, {self.num_heads}, {D_V}] {q.dtype}, "
                f"lse [{rows}, {self.num_heads}] float32), contiguous, on {q.device}; got {got}"
            )
        if q.requires_grad or kv.requires_grad or o.requires_grad or lse.requires_grad:
            self._check_no_grad(q, kv, o, lse)
        if torch.compiler.is_compiling():
            return  # fake tensors have no addresses; the eager call checks them
        so, sl = o.untyped_storage().data_ptr(), lse.untyped_storage().data_ptr()
        sq, sk = q.untyped_storage().data_ptr(), kv.untyped_storage().data_ptr()
        if so in (sl, sq, sk) or sl in (sq, sk):  # one allocation: compare the bytes they reach
            self._check_overlap(o, lse, q, kv)

    def _check_overlap(self, o: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> None:
        names, spans = ("out", "lse", "q", "kv"), [byte_span(t) for t in (o, lse, q, kv)]
        for i, j in ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3)):
            (a0, a1), (b0, b1) = spans[i], spans[j]
            if a0 < b1 and b0 < a1:
                raise ValueError(
                    f"{self.name}: out= memory overlaps: {names[i]} (bytes {a0:#x}-{a1:#x}) and "
                    f"{names[j]} ({b0:#x}-{b1:#x}) share storage, so the kernel would overwrite "
                    f"what it reads or writes elsewhere; pass out and lse in buffers of their own"
                )

    def _check_no_grad(self, *tensors: torch.Tensor) -> None:
        """Refuse tensors that need a gradient while autograd records: the backends are
        inference-only (their kernels have no backward)."""
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            raise ValueError(
                f"{self.name}: an input or output needs a gradient (requires_grad=True) and autograd "
                "is on, but attention backends are inference-only (no backward); call forward "
                "under torch.inference_mode() or torch.no_grad(), or pass detached tensors"
            )

    def check_metadata(self, metadata: GraphMetadata) -> None:
        """Refuse metadata made for another configuration (cheap: Python attributes only)."""
        try:
            got = (metadata.num_heads, metadata.topk, metadata.dtype, metadata.padded_heads)
        except AttributeError:
            raise TypeError(f"{self.name}: metadata must be a GraphMetadata, got "
                            f"{type(metadata).__name__}; use backend.make_metadata(max_rows)") from None
        want = self._metadata_config
        if got != want:
            raise ValueError(
                f"{self.name}: metadata was made for (num_heads, topk, dtype, padded_heads)="
                f"{got}, this backend needs {want}. Fix: use backend.make_metadata(max_rows)."
            )
        if self.uses_counter and metadata.counter is None:
            raise ValueError(f"{self.name}: metadata has no multi-CTA counter; make it with this "
                             "backend's make_metadata(max_rows)")
        if self.uses_workspace and metadata.workspace_out is None:
            raise ValueError(f"{self.name}: metadata has no split-KV workspace; make it with this "
                             "backend's make_metadata(max_rows)")

    def check_call(self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata) -> None:
        """Everything ``forward`` checks before it computes (Python attributes only, so it costs
        about a microsecond and is free inside a capture): shapes and dtypes, one device,
        matching metadata, and no more q rows than ``plan()`` wrote."""
        try:
            self.check_inputs(q, kv)
        except AttributeError:  # zero cost unless raised: no isinstance on the hot path
            raise TypeError(f"{self.name}: q and kv must be tensors, got {type(q).__name__} and "
                            f"{type(kv).__name__}") from None
        if self.unit_stride_only and (q.stride()[-1] != 1 or kv.stride()[-1] != 1):
            raise ValueError(
                f"{self.name}: q and kv need a contiguous last dim (stride 1), got q strides "
                f"{q.stride()}, kv strides {kv.stride()}; pass .contiguous()"
            )
        if q.requires_grad or kv.requires_grad:
            self._check_no_grad(q, kv)
        self.check_metadata(metadata)
        device = q.device  # the metadata's device is a plain attribute (its buffers' device)
        if kv.device != device or metadata.device != device:
            self._device_error(q, kv, metadata)
        if q.shape[0] > metadata.checked_rows:  # the slow path: unplanned rows, pending checks
            metadata.check_forward(q.shape[0], kv.shape[0], self.name)

    def _device_error(self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata) -> None:
        table = metadata.indices.tensor.device
        meta = ""
        if "meta" in (q.device.type, kv.device.type, table.type):
            meta = (" (meta tensors hold no data to attend over; under torch.compile fake "
                    "tensors are handled by the kernels' fake implementations)")
        raise ValueError(
            f"{self.name}: q is on {q.device}, kv on {kv.device}, metadata on {table}; expected "
            f"all on q's device{meta}. Fix: one backend and metadata per device (Backend(..., "
            f"platform=current_platform().on_device({str(q.device)!r})), then make_metadata) "
            f"and that device's KV cache; this backend's device is {self.device}"
        )

    def check_inputs(self, q: torch.Tensor, kv: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``q [rows, num_heads, 576]`` has this backend's dtype and
        kv its layout: ``[pool, 576]`` in that dtype, or ``[pool, 656]`` uint8 with
        ``kv_dtype="fp8"``. Reads only Python attributes, so it is free inside a capture."""
        fp8 = self.kv_fp8
        width, kv_dt = (TOKEN_BYTES, torch.uint8) if fp8 else (D_QK, self.dtype)
        qs, ks = q.shape, kv.shape
        # One comparison chain on the hot path; the messages are built only when it fails.
        if (len(qs) == 3 and qs[1] == self.num_heads and qs[2] == D_QK and q.dtype == self.dtype
                and len(ks) == 2 and ks[1] == width and kv.dtype == kv_dt and ks[0] >= 1):
            if fp8:
                check_fp8_kv(self.name, kv)
            return
        expected = (self.num_heads, D_QK)
        if q.dim() != 3 or tuple(q.shape[1:]) != expected or q.dtype != self.dtype:
            raise ValueError(
                f"{self.name}: expected q [rows, {expected[0]}, {expected[1]}] {self.dtype}, "
                f"got {tuple(q.shape)} {q.dtype}; pass q in that shape and dtype (q.to({self.dtype})), "
                f"or make the backend for q's heads and dtype (num_heads=..., dtype=q.dtype)"
            )
        if kv.dim() != 2 or kv.shape[1] != width or kv.dtype != kv_dt:
            raise ValueError(
                f"{self.name}: expected kv [pool, {width}] {kv_dt} (kv_dtype={self.kv_dtype}), got "
                f"{tuple(kv.shape)} {kv.dtype}; the backend was made for kv_dtype={self.kv_dtype!r}: "
                f"pass that cache, or make the backend with the cache's layout (kv_dtype='fp8' for "
                f"[pool, {TOKEN_BYTES}] uint8 tokens, 'auto' for [pool, {D_QK}] in q's dtype)"
            )
        raise ValueError(f"{self.name}: kv is an empty pool {tuple(kv.shape)}: expected at least "
                         "one token; pass the KV cache the indices point into")
