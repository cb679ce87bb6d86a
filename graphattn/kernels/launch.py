"""Typed launch plans: one :class:`KernelSpec` per kernel path, one :class:`LaunchPlan` per shape.

A kernel path is declared once as a :class:`KernelSpec` (which custom op runs it, whether it
needs the multi-CTA counter, a split-KV workspace, a separate combine launch); backends derive
their capability data from it. Every path reads q unpadded, at any head count. A :class:`LaunchPlan`
is everything a call needs that does not depend on the tensors' contents: the kernel function,
its grid, split count and constexprs, and the combine launch. It is built once per
(platform, rows, heads, topk, workspace bound, alignment) on the host and memoised
(:func:`memoised`), so an eager call only reads it and launches.

The custom ops stay the public entry points (``torch.compile``, the capture sanitizer and the
CPU graph emulator see them through the dispatcher). :func:`direct_launch_allowed` says when a
backend may skip the dispatcher's Python overhead and run the plan itself: nothing is tracing,
compiling or watching the dispatch (no ``TorchDispatchMode`` on the stack).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch

from ..common.buffers import forget_kept_calls
from ..common.platform import current_platform, kernels_interpreted, triton_interpreter_env
from ..common.validation import env_choice


@dataclass(frozen=True)
class KernelSpec:
    """One kernel path, declared once.

    Attributes:
        name: the path name the platform's launch tables know (``flashmla``, ``trtllm``, ``mega``).
        op_name: the custom op, ``torch.ops.graphattn.<op_name>``.
        uses_counter: needs ``GraphMetadata.counter_for(rows)`` (int32 zeros, reset by the kernel).
        uses_workspace: writes split-KV partials to ``GraphMetadata.workspace_for(rows, splits)``.
        combine: merges split partials in a second launch (otherwise in the same launch, or no split).
        alignment: its kernel choice depends on whether q/kv rows are 16-byte aligned
            (:func:`aligned_16`); paths without it skip that check on every call.
    """

    name: str
    op_name: str
    uses_counter: bool
    uses_workspace: bool
    combine: bool
    alignment: bool = False

    @property
    def op(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """The registered custom op (``graphattn.kernels`` must have been imported)."""
        return getattr(torch.ops.graphattn, self.op_name)


FLASHMLA = KernelSpec("flashmla", "sparse_mla_flashmla", uses_counter=False, uses_workspace=True,
                      combine=True, alignment=True)
TRTLLM = KernelSpec("trtllm", "sparse_mla_trtllm", uses_counter=True, uses_workspace=True, combine=False)
MEGA = KernelSpec("mega", "sparse_mla_mega", uses_counter=False, uses_workspace=False, combine=False)
SPECS = {s.name: s for s in (FLASHMLA, TRTLLM, MEGA)}


# Debug switch, read once: GRAPHATTN_LAUNCHER=jit sends every launch through Triton's
# JITFunction.run (argument binding, specialisation and cache lookup on each call).
# Any other value raises (when the kernels are first imported): a typo must not leave it on.
_CACHED_LAUNCHER = env_choice("GRAPHATTN_LAUNCHER", ("cached", "jit"), "cached") != "jit"


class _Triton:
    """What a cached launch needs from Triton's runtime, looked up once on the first compiled
    launch (never on a machine where only the interpreter runs)."""

    device: Callable[[], int] | None = None
    stream: Callable[[int], int] | None = None
    knobs: Any = None
    raw_ok = False

    raw_launch_versions = ("3.6.",)  # NVIDIA launchers whose raw entry point was checked

    @classmethod
    def load(cls) -> None:
        if cls.device is None:
            import triton
            from triton import knobs
            from triton.runtime import driver

            cls.knobs = knobs.runtime
            cls.stream = driver.active.get_current_stream
            device = driver.active.get_current_device
            # Triton asks torch.cuda.current_device(), whose Python wrapper only adds a lazy
            # init that has happened by the time a kernel was compiled: ask torch's C query.
            if device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
                device = torch._C._cuda_getDevice
            cls.device = device
            cls.raw_ok = triton.__version__.startswith(cls.raw_launch_versions)

    @classmethod
    def hooked(cls) -> bool:
        """Whether a launch hook (a profiler) is registered: launches then take Triton's path.
        Triton 3.6 keeps an always-present, usually empty HookChain; older versions None."""
        hook = cls.knobs.launch_enter_hook
        return hook is not None and getattr(hook, "calls", True)

    @classmethod
    def raw_launcher(cls, launcher: Any) -> tuple[Callable[..., None], Any, Any] | None:
        """``(entry, cooperative, pdl)``: the C entry point behind an NVIDIA ``CudaLauncher``
        with no scratch memory to allocate, and its fixed launch flags; ``None`` where the
        wrapper must run (other versions, AMD, kernels with scratch memory)."""
        if not cls.raw_ok or type(launcher).__name__ != "CudaLauncher":
            return None
        if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
            return None
        launch = getattr(launcher, "launch", None)
        if launch is None:
            return None
        return launch, launcher.launch_cooperative_grid, launcher.launch_pdl


class Launch:
    """One kernel launch: ``fn[grid](*args, **kwargs)`` with fixed constexprs and options.

    Calling it goes through Triton's ``JITFunction.run`` (binding, specialisation, cache
    lookup). :meth:`specialised` returns a launcher that skips all of that for later calls
    with arguments that specialise alike; :class:`KeyedLaunch` keeps one per call key.

    Attributes (read-only by convention; plans are shared):
        fn: the ``@triton.jit`` or ``@gluon.jit`` function.
        grid: launch grid, 1 to 3 ints.
        kwargs: constexprs and Triton launch options (``num_warps`` ...).
    """

    __slots__ = ("fn", "grid", "kwargs", "_grid3", "_tail")

    def __init__(self, fn: Any, grid: tuple[int, ...], kwargs: Mapping[str, Any]):
        self.fn, self.grid, self.kwargs = fn, tuple(grid), kwargs
        self._grid3 = (self.grid + (1, 1))[:3]
        self._tail: tuple[Any, ...] | None = None  # constexpr values after the positional args

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Launch):
            return NotImplemented
        return (self.fn, self.grid, dict(self.kwargs)) == (other.fn, other.grid, dict(other.kwargs))

    def __hash__(self) -> int:
        return hash((self.fn, self.grid, tuple(sorted(self.kwargs.items()))))

    @property
    def name(self) -> str:
        """The kernel function's name, as profilers and launch errors show it."""
        return getattr(self.fn, "__name__", None) or getattr(self.fn, "_fn_name", repr(self.fn))

    def __repr__(self) -> str:
        return f"Launch({self.name}, grid={self.grid}, {dict(self.kwargs)})"

    @property
    def cluster(self) -> int:
        """CTAs per thread-block cluster: the ``CLUSTER`` constexpr (flashmla's ``wgmma_rr``
        merging two splits), else 1. ``grid[0]`` counts CTAs and is a multiple of it."""
        return self.kwargs.get("CLUSTER") or 1

    def __call__(self, *args: Any) -> Any:
        cluster, hold = self.cluster, self.kwargs.get("HOLD_SMEM", 0)
        if cluster > 1 or hold:
            # Both live in the compiled kernel's packed launch metadata (num_warps, num_ctas,
            # dynamic shared memory), which Triton 3.6's launchers read on every launch. Its
            # cache key holds every constexpr, CLUSTER and HOLD_SMEM included, so no launch
            # without them shares the object changed here.
            kernel = self.fn.warmup(*args, grid=self.grid, **self.kwargs)
            packed = getattr(kernel, "packed_metadata", None)
            if not (isinstance(packed, tuple) and len(packed) == 3):
                what = "thread-block clusters" if cluster > 1 else "a reserved shared-memory size (HOLD_SMEM)"
                raise RuntimeError(f"{self!r}: this Triton's launcher cannot launch with {what} (packed metadata "
                                   f"{packed!r}); use a launch setting without it")
            warps, ctas, shared = packed
            if hold > shared:
                # The program reserves more than its code uses: the function must allow it.
                current_platform().launch_table.allow_launch_shared_memory(kernel, hold)
                shared = hold
            kernel.packed_metadata = (warps, cluster if cluster > 1 else ctas, shared)
            if cluster > 1:
                # The kernel is one-CTA code (compiled with num_ctas=1: its program id is the
                # CTA's); the launcher takes the cluster shape from the packed num_ctas and
                # multiplies the grid by it, so the launch asks for grid[0] / cluster clusters.
                return self.fn[(self.grid[0] // cluster,) + self.grid[1:]](*args, **self.kwargs)
        return self.fn[self.grid](*args, **self.kwargs)

    def specialised(self, *args: Any) -> Callable[..., None]:
        """Launch with ``args`` through Triton (compiling if needed) and return a launcher
        ``f(*args)`` for later calls on the current device.

        ``f`` hands its arguments straight to the compiled kernel's launcher, so the caller
        must only pass arguments that Triton specialises as it did these (the same dtypes,
        16-byte alignment, and scalars in the same ``== 1`` / ``% 16`` classes):
        :class:`KeyedLaunch` keys them. Where no compiled kernel came back (the interpreter),
        ``f`` is Triton's path; with ``GRAPHATTN_LAUNCHER=jit`` too, and while a launch hook
        (a profiler) is registered ``f`` takes Triton's path for that call.
        """
        kernel = self(*args)
        function = getattr(kernel, "function", None)
        if not _CACHED_LAUNCHER or function is None or not hasattr(kernel, "run"):
            return self.__call__
        _Triton.load()
        if self._tail is None:
            params = list(self.fn.signature.parameters.values())[len(args):]
            self._tail = tuple(self.kwargs.get(p.name, p.default) for p in params)
        launcher, packed, tail = kernel.run, kernel.packed_metadata, self._tail
        g0, g1, g2 = self._grid3
        g0 //= self.cluster  # clusters: the launcher multiplies the grid by the cluster size
        device = _Triton.device()
        stream = _Triton.stream
        raw = _Triton.raw_launcher(launcher)
        if raw is not None:
            # Triton 3.6's CudaLauncher.__call__ only adds (no) scratch buffers and its launch
            # flags: (grid, stream, function, cooperative, pdl, scratch x2, packed, ...).
            entry, coop, pdl = raw
            middle: tuple[Any, ...] = (coop, pdl, None, None, packed, None, None, None)
        else:
            entry, middle = launcher, (packed, None, None, None)

        def launch(*a: Any) -> None:
            if _Triton.hooked():  # a profiler's launch hook wants to see it: Triton's own path
                self(*a)
            else:
                entry(g0, g1, g2, stream(device), function, *middle, *a, *tail)

        if raw is not None:
            # The C entry also takes a pointer argument as an int, and then neither calls
            # data_ptr() nor asks the driver whether the address is a device pointer
            # (cuPointerGetAttribute: 0.64 µs a call through ctypes on the H200's host, whose
            # no-op costs 0.33): callers whose tensors are on this GPU pass ints (KeyedLaunch.run).
            def launch_ints(*a: Any) -> None:
                entry(g0, g1, g2, stream(device), function, *middle, *a, *tail)

            launch.ints = launch_ints  # type: ignore[attr-defined]
        return launch


class KeyedLaunch:
    """One :class:`Launch`'s specialised launchers, one per call key.

    A bound call (a launch plan with its fixed arguments: the metadata's index table and
    workspace views, their strides, the plan's scalars) owns one. The key it passes must hold
    everything Triton specialises on that can differ between its calls: the current device,
    the dtypes, strides and pool size of q and kv, and whether the tensors are 16-byte aligned.
    """

    __slots__ = ("launch", "_launchers", "_ints")

    def __init__(self, launch: Launch):
        self.launch = launch
        self._launchers: dict[Any, Callable[..., None]] = {}
        self._ints: dict[Any, Callable[..., None]] = {}

    def __call__(self, key: Any, *args: Any) -> None:
        fast = self._launchers.get(key)
        if fast is not None:
            fast(*args)
            return
        if len(self._launchers) >= 16:  # many keys (fuzzing strides): start over
            self._launchers.clear()
            self._ints.clear()
        fast = self._launchers[key] = self.launch.specialised(*args)
        ints = getattr(fast, "ints", None)
        if ints is not None:
            self._ints[key] = ints

    def run(self, key: Any, tensors: tuple[Any, ...], pointers: tuple[int, ...], *rest: Any) -> None:
        """Launch a kernel whose pointer arguments come first: ``(*tensors, *rest)``, or
        ``(*pointers, *rest)`` (``pointers[i] == tensors[i].data_ptr()``) through the int
        launcher where ``key`` has one: after its first call (which passes the tensors, to
        specialise), where the checked C entry launches (not the interpreter,
        ``GRAPHATTN_LAUNCHER=jit``, AMD or Triton versions whose entry was not checked), and
        while no launch hook is registered. The caller vouches that the tensors are on the
        current GPU: the ints are not checked."""
        fast = self._ints.get(key)
        if fast is not None and not _Triton.hooked():
            fast(*pointers, *rest)
        else:
            self(key, *tensors, *rest)


def current_device_index() -> int:
    """The device Triton launches on (-1 before the first compiled launch, and on the CPU)."""
    return _Triton.device() if _Triton.device is not None else -1


def call_key(q: torch.Tensor, kv: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor) -> tuple[tuple[Any, ...], tuple[int, ...], int, tuple[int, int, int, int]]:
    """``(key, q.stride(), kv.stride(0), pointers)`` of one bound call (see
    :class:`KeyedLaunch`): the key holds the current device, q's and kv's dtypes, strides and
    pool size (exact values, so equal keys always specialise alike), whether q, kv, out and lse
    are all 16-byte aligned, and the devices q and kv are on (``get_device()``: -1 on the CPU),
    so a tensor elsewhere than the launches before it never reaches an int launcher: its first
    call passes tensors, and Triton refuses what it cannot access. The strides and the four
    ``data_ptr()`` come back so the caller does not ask for them twice (:meth:`KeyedLaunch.run`
    takes the pointers; out and lse are made on q's device or checked by the backend)."""
    qs, kvs = q.stride(), kv.stride(0)
    ptrs = (q.data_ptr(), kv.data_ptr(), out.data_ptr(), lse.data_ptr())
    aligned = (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) & 15
    key = (current_device_index(), q.dtype, kv.dtype, kv.shape[0], qs, kvs, aligned, q.get_device(), kv.get_device())
    return key, qs, kvs, ptrs


class InterpretedLaunch(Launch):
    """A :class:`Launch` in the Triton interpreter (no GPU). Triton still reads
    ``TRITON_INTERPRET`` while it runs a kernel (modules it imports lazily), so the run happens
    inside :func:`~graphattn.common.platform.triton_interpreter_env`."""

    def __call__(self, *args: Any) -> Any:
        with triton_interpreter_env():
            return self.fn[self.grid](*args, **self.kwargs)


def make_launch(fn: Any, grid: tuple[int, ...], **kwargs: Any) -> Launch:
    """A :class:`Launch` whose keyword arguments cannot change after planning (an
    :class:`InterpretedLaunch` where kernels are interpreted; GPU launches pay nothing)."""
    cls = InterpretedLaunch if kernels_interpreted() else Launch
    return cls(fn, grid, MappingProxyType(kwargs))


@dataclass(frozen=True)
class LaunchPlan:
    """How one call of a kernel path runs at one shape (immutable, memoised).

    Attributes:
        spec: the kernel path.
        rows, heads, topk: the shape planned (heads: q's, unpadded).
        splits: split-KV partials per row (1: the first launch writes ``out``/``lse`` directly).
        split_len: indices per split (a multiple of the KV tile).
        head_blocks: programs per (row, split).
        kernel: which function runs (``wgmma``, ``triton_kv_major``, ``triton``).
        main: the attention launch; ``combine``: flashmla's merge of the partials, or ``None``.
    """

    spec: KernelSpec
    rows: int
    heads: int
    topk: int
    splits: int
    split_len: int
    head_blocks: int
    kernel: str
    main: Launch
    combine: Launch | None = None

    @property
    def workspace_splits(self) -> int:
        """Splits per row of workspace the launch writes (0 when one split writes the output)."""
        return self.splits if self.splits > 1 else 0


_MEMOISED: list[Any] = []


def memoised(fn: Callable[..., LaunchPlan]) -> Callable[..., LaunchPlan]:
    """Memoise a plan builder; :func:`clear_launch_plans` forgets every memoised plan."""
    cached = functools.lru_cache(maxsize=4096)(fn)
    _MEMOISED.append(cached)
    return cached


def clear_launch_plans() -> None:
    """Forget memoised plans (after changing launch settings, e.g. ``cuda.configs.override``),
    and with them the plans backends and metadata keep (their bound calls and plan lookups are
    kept against ``common.buffers.storage_epoch``, which this advances)."""
    for cached in _MEMOISED:
        cached.cache_clear()
    forget_kept_calls()


def aligned_16(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """Whether q and kv rows are 16-byte aligned: base pointers 16-byte aligned and row strides
    that Triton specialises as multiples of 16 elements (what 16-byte async copies need)."""
    qs = q.stride()  # asked on every eager call: one stride() call, one test per kind
    return not ((q.data_ptr() | kv.data_ptr()) & 15 or (qs[0] | qs[1] | kv.stride(0)) & 15)


def direct_launch_allowed() -> bool:
    """True when a backend may run a plan without going through its custom op: not inside
    ``torch.compile`` tracing, and no ``TorchDispatchMode`` (the capture sanitizer, the CPU
    graph emulator's capture, a fake-tensor mode) on the dispatch stack, so nothing that
    watches the ops would miss one. Costs one C call."""
    return not torch.compiler.is_compiling() and not torch._C._len_torch_dispatch_stack()
