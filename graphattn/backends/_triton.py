"""Shared plumbing of the Triton backends: capabilities from the kernel path's spec, launch
plans memoised per row count, and the direct launch that skips the custom-op dispatcher.

The kernels are imported when a backend is constructed, not when the registry lists names, so
``graphattn list`` and ``--attn-backend`` parsing work (and report why) on a machine where
Triton cannot load.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import torch

from ..common.buffers import EpochDict, storage_epoch
from ..common.capture import is_capturing
from ..common.metadata import GraphMetadata
from ..common.platform import current_gpu_index, current_platform
from ..common.validation import check_int
from ..kernels.launch import KernelSpec, LaunchPlan, aligned_16, direct_launch_allowed
from ..kernels.plan import SplitPlan, split_plan
from .base import AttentionBackend


class TritonBackend(AttentionBackend):
    """Base of the backends whose ``forward`` is one Triton kernel path.

    Subclasses set ``kernel_spec`` (or ``kernel_specs``, every path a backend may choose per
    row count, as ``dispatch`` does, with ``_spec_for``) and ``_build_plan``; ``uses_counter``
    and ``uses_workspace`` follow from the specs, and each launch runs the path of its plan.
    The kernels read q as it comes, at any head count, so no Triton backend pads q (``pads_q``
    stays False) or narrows its outputs. ``plan()`` writes the step's indices and builds (or
    finds) the step's :class:`LaunchPlan`. ``forward()`` checks Python attributes, then, with
    no tracing, compiling, dispatch mode or graph capture active, runs the bound call the
    metadata keeps for (backend, rows, alignment): the plan with its index, counter and
    workspace views and their strides bound (the kernel module's ``bind_<path>``), launching
    through specialised launchers. Otherwise it calls the custom op, so ``torch.compile``, the
    capture sanitizer, the CPU graph emulator and capture marking see every kernel.
    """

    uses_triton = True
    unit_stride_only = True
    kernel_spec: ClassVar[KernelSpec]
    kernel_specs: ClassVar[tuple[KernelSpec, ...]]  # every path forward may run
    _alignment: ClassVar[bool] = False  # some path's kernel choice depends on 16-byte alignment

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("kernel_spec")
        specs = cls.__dict__.get("kernel_specs") or ((spec,) if spec is not None else None)
        if specs:
            cls.kernel_specs = specs
            cls.uses_counter = any(s.uses_counter for s in specs)
            cls.uses_workspace = any(s.uses_workspace for s in specs)
            cls._alignment = any(s.alignment for s in specs)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._modules = {s.name: importlib.import_module(f"graphattn.kernels.{s.name}") for s in self.kernel_specs}
        self._binds = {name: getattr(m, f"bind_{name}") for name, m in self._modules.items()}
        self._plans = EpochDict()  # (rows, aligned, workspace splits) -> LaunchPlan
        self._last_planned: tuple[int, int, int] | None = None  # (id(metadata), rows, epoch)

    def make_metadata(self, max_rows: int) -> GraphMetadata:
        """Reserve the counter and the split-KV workspace that :func:`split_plan` says this
        backend's kernel may use, and the index table, for ``max_rows`` query rows.

        Host side, not capturable; see :meth:`AttentionBackend.make_metadata`.
        """
        check_int(f"{self.name}.make_metadata", "max_rows", max_rows, 1)
        plans = [split_plan(s.name, self.num_heads, self.topk, self.platform, self.kv_fp8) for s in self.kernel_specs]
        plan = SplitPlan(*(max(values) for values in zip(*plans)))  # room for every path
        return GraphMetadata(max_rows, self.num_heads, self.topk, self.dtype, self.device,
                             **plan.metadata_kwargs())

    def plan(
        self, metadata: GraphMetadata, indices: torch.Tensor, pad_to: int | None = None,
        check_indices: bool | None = None, pool_tokens: int | None = None,
    ) -> None:
        """See :meth:`AttentionBackend.plan`; also builds the launch plan of the rows the next
        ``forward`` gets (``max(rows, pad_to)``), so ``forward`` only looks it up."""
        super().plan(metadata, indices, pad_to, check_indices, pool_tokens)
        # A decode loop plans the same rows on the same metadata step after step: the memoised
        # plan is looked up again (~1 µs: the workspace's split count, the key) only when either
        # changes or the storage epoch moved. Keyed by id(): holding the metadata would keep its
        # buffers alive; an id reused by a later metadata only skips this prebuild (forward
        # builds the plan when it is missing).
        key = (id(metadata), metadata.num_planned_rows, storage_epoch())
        if key != self._last_planned:
            self.launch_plan(metadata, key[1])
            self._last_planned = key

    def launch_plan(self, metadata: GraphMetadata, rows: int, aligned: bool = True) -> LaunchPlan:
        """The memoised :class:`LaunchPlan` for ``rows`` query rows on ``metadata``'s workspace
        (``aligned``: q and kv rows 16-byte aligned). Host side; cheap after the first call."""
        ws = metadata.workspace_splits(rows) if self.uses_workspace else 0
        plans = self._plans.current()  # emptied after clear_launch_plans() or a storage change
        key = (rows, aligned, ws)
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = self._build_plan(rows, aligned, ws)
        return plan

    def _build_plan(self, rows: int, aligned: bool, ws_splits: int) -> LaunchPlan:
        raise NotImplementedError

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, metadata: GraphMetadata,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`AttentionBackend.forward`. Capturable (within the reserved rows).

        The kernel reads ``q`` as it is and writes ``out [rows, num_heads, 512]`` /
        ``lse [rows, num_heads]`` (contiguous); with ``out`` the bound call writes into it
        directly, while the custom op's results (under a capture, tracing or a dispatch mode)
        are copied into it.
        """
        self.check_call(q, kv, metadata)
        if out is not None:
            self.check_out(q, kv, out)
        index = q.get_device()
        if index >= 0 and not torch.compiler.is_compiling() and index != current_gpu_index():
            # Triton launches on the current device and its stream, and the bound call's
            # launchers are keyed by it: make q's device current (only when it is not already).
            # Under torch.compile the custom op does this itself when it runs (dynamo cannot
            # trace the device query, so it is only asked here in eager mode).
            with torch.cuda.device(index):
                return self.forward(q, kv, metadata, out)
        call = self.bound_call(metadata, q, kv)
        if call is not None:
            res = call(q, kv, out)
        else:
            if self.kv_fp8 and not torch.compiler.is_compiling():
                self._check_op_fp8_format()
            spec = self._spec_for(metadata, q, kv)
            res = spec.op(q, kv, *self._fixed_args(metadata, q.shape[0], None, spec))
        if out is None:
            return res
        if res[0] is out[0]:
            return out  # the very object passed: a breakable graph's break sees it is done
        out[0].copy_(res[0])
        out[1].copy_(res[1])
        return out

    def _check_op_fp8_format(self) -> None:
        """The custom ops read FP8 tokens in ``current_platform()``'s format (they cannot carry
        a platform): refuse a backend made for another format there, which would read its cache
        as the wrong FP8 type (NaN or wrong values, silently)."""
        here = current_platform().fp8_dtype
        if self.platform.fp8_dtype != here:
            raise ValueError(
                f"{self.name}: this backend reads FP8 tokens as {self.platform.fp8_dtype} (its platform "
                f"{self.platform.name}), but under a capture, torch.compile or a dispatch mode the "
                f"kernels run as custom ops, which read them as this process's platform does "
                f"({here}); make the backend on current_platform() (leave platform= out), or set "
                f"GRAPHATTN_PLATFORM so that both agree"
            )

    def _spec_for(self, metadata: GraphMetadata, q: torch.Tensor, kv: torch.Tensor) -> KernelSpec:
        """The kernel path whose custom op a call runs: the backend's one path (a backend with
        several overrides this with the choice its launch plans make, traceable by dynamo)."""
        return self.kernel_specs[0]

    def _fixed_args(self, metadata: GraphMetadata, rows: int, splits: int | None, spec: KernelSpec) -> list[Any]:
        """``spec``'s kernel arguments after q and kv: indices, scale, [counter], [workspace
        views of ``splits`` splits, all the pool holds when ``None``]."""
        args: list[Any] = [metadata.indices_for(rows), self.sm_scale]
        if spec.uses_counter:
            args.append(metadata.counter_for(rows))
        if spec.uses_workspace:
            args.extend(metadata.workspace_for(rows, splits))
        return args

    def bound_call(self, metadata: GraphMetadata, q: torch.Tensor, kv: torch.Tensor) -> Any:
        """The metadata's bound call for this launch (``call(q, kv) -> (out, lse)``), or
        ``None`` where the custom op must run instead: while tracing, compiling, a dispatch
        mode or a graph capture is active (a capture must see the views, which marks the
        buffers), or beyond the reserved rows (temporaries are never kept). ``call`` takes an
        optional third argument, ``(out, lse)`` to write into."""
        if not direct_launch_allowed() or is_capturing():
            return None
        rows = q.shape[0]
        return self._kept_call(metadata, rows, aligned_16(q, kv) if self._alignment else True)

    def _kept_call(self, metadata: GraphMetadata, rows: int, aligned: bool) -> Any:
        """The metadata's bound call for (this backend, rows, alignment), built on a miss."""
        return metadata.bound_call((self, rows, aligned), lambda: self._new_bound_call(metadata, rows, aligned))

    def bind_break(self, args: tuple, kwargs: dict) -> Any:
        """See :meth:`AttentionBackend.bind_break`: with ``out`` given, a call that re-checks
        only the planned rows, the device, dispatch modes, tracing and capture (each a C call
        or an int compare), then runs the metadata's bound call into ``out``; otherwise (and
        whenever one of those says so) ``forward`` itself runs."""
        names = ("q", "kv", "metadata")
        out = kwargs.get("out")
        if out is None or len(args) > 3 or set(kwargs) - {*names[len(args):], "out"}:
            return None  # no output to write into, or a call this does not recognise
        values = [*args, *(kwargs[n] for n in names[len(args):] if n in kwargs)]
        if len(values) != 3:
            return None
        q, kv, metadata = values
        self.check_call(q, kv, metadata)  # what replays then skip: it cannot change
        self.check_out(q, kv, out)
        rows, index = q.shape[0], q.get_device()
        aligned = aligned_16(q, kv) if self._alignment else True
        forward, kept_call = self.forward, self._kept_call

        def replay() -> Any:
            if (rows > metadata.checked_rows or not direct_launch_allowed() or is_capturing()
                    or (index >= 0 and index != current_gpu_index())):
                return forward(q, kv, metadata, out)
            call = kept_call(metadata, rows, aligned)
            if call is None:
                return forward(q, kv, metadata, out)
            call(q, kv, out)
            return out

        return replay

    def _new_bound_call(self, metadata: GraphMetadata, rows: int, aligned: bool) -> Any:
        if rows > metadata.capacity:
            return None
        plan = self.launch_plan(metadata, rows, aligned)
        args = self._fixed_args(metadata, rows, plan.workspace_splits, plan.spec)
        self._check_room(plan, args)
        return self._binds[plan.spec.name](plan, *args)

    def _check_room(self, plan: LaunchPlan, args: list[Any]) -> None:
        """Refuse metadata whose counter or workspace is smaller than ``plan`` writes (made by
        hand, or by another backend's ``make_metadata``): the bound call skips the custom ops'
        checks, and a kernel would write past the buffers. Once per bound call."""
        rest = args[2:]
        if plan.spec.uses_counter:
            counter, rest = rest[0], rest[1:]
            if counter.shape[1] < plan.head_blocks:
                self._room_error(f"{counter.shape[1]} counter columns a row", f"{plan.head_blocks} (one a head block)")
        if plan.spec.uses_workspace and plan.workspace_splits:
            ws_out = rest[0]
            if ws_out.shape[1] < plan.workspace_splits or ws_out.shape[2] < plan.heads:
                self._room_error(f"workspace partials of {ws_out.shape[1]} splits x {ws_out.shape[2]} heads",
                                 f"{plan.workspace_splits} splits x {plan.heads} heads")

    def _room_error(self, has: str, needs: str) -> None:
        raise ValueError(f"{self.name}: the metadata holds {has}, this launch needs {needs}; make "
                         f"the metadata with this backend's make_metadata(max_rows)")
