"""Capture sanitizer: refuse a replay that would touch storage freed or moved since capture.

A captured graph replays raw addresses and keeps nothing alive. While a segment captures, a
:class:`torch.utils._python_dispatch.TorchDispatchMode` sees every aten op and every torch custom
op (Triton kernels registered with ``torch.library``) with its tensor arguments. For each tensor
it asks one question: was its *storage* created during this capture (it then belongs to the
graph's pool), or did it exist before (the graph merely borrows its address)? An op's output
counts as the pool's only when it is provably fresh: not an input's storage, and referenced by
nothing but the op's outputs (a custom op may return a workspace it keeps elsewhere). A wrapper
subclass (``__tensor_flatten__``) or sparse tensor is classified through the tensors holding
its memory; one whose memory cannot be named is refused (:class:`UntrackableTensorError`).
Borrowed storages are remembered **weakly** (``StorageWeakRef``) with their address; before a
replay, :meth:`StorageTracker.check` raises :class:`FreedCaptureBufferError` if one expired or
moved. Ops that read device values back to the host, or whose output size depends on them,
raise :class:`HostReadbackError` as a real capture fails on them.

The same :class:`StorageTracker` classifies tensors for the CPU graph emulator
(``graphs/emulated.py``), so the emulator and the sanitizer cannot disagree about what a graph
borrows.

What it cannot see: work that bypasses the torch dispatcher. A raw ``kernel[grid](...)`` Triton
launch, a ctypes/cupy call, or a C++ extension that is not a registered op receives pointers the
mode never observes. Register kernels as custom ops (``torch.library.triton_op`` or
``custom_op``) so that the sanitizer, the emulator and ``torch.compile`` see them.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from ..common.buffers import GrowOnlyBuffer
from ..common.errors import (FreedCaptureBufferError, GraphSafetyError, HostReadbackError,
                             UntrackableTensorError)
from ..common.validation import env_flag

SANITIZE_ENV = "GRAPHATTN_SANITIZE"

# Ops that read a device value back to the host: a real capture fails on them (the copy would
# have to synchronize a stream that is recording), so the emulator and sanitizer refuse them too.
# Each maps to its fix.
_PLAN = "compute it before capture (backend.plan) or keep it on the device"
_HOST_READBACK_OPS = {
    "_local_scalar_dense": _PLAN + " (torch.where instead of a Python branch)",
    "item": _PLAN,
    "equal": _PLAN,
    "is_nonzero": _PLAN + " (torch.where instead of a Python branch)",
    "allclose": _PLAN,
}
# Ops whose output size depends on tensor values: the device must report that size to the host
# before the output can be allocated, so they read back too (and a replay could not resize).
_UNIQUE_FIX = "compute the unique values before capture"
_SPARSE_FIX = "convert to a sparse layout before capture"
_DATA_DEPENDENT_OPS = {
    "nonzero": "use torch.nonzero_static(x, size=...) (a fixed-size result)",
    "masked_select": "keep the shape: torch.where(mask, x, fill) or x.masked_fill(~mask, fill)",
    "_unique": _UNIQUE_FIX,
    "_unique2": _UNIQUE_FIX,
    "unique_dim": _UNIQUE_FIX,
    "unique_consecutive": _UNIQUE_FIX,
    "unique_dim_consecutive": _UNIQUE_FIX,
    "bincount": "scatter_add_ into a tensor of fixed length made before capture",
    "_to_sparse": _SPARSE_FIX,
    "_to_sparse_csr": _SPARSE_FIX,
    "_to_sparse_csc": _SPARSE_FIX,
    "_to_sparse_bsr": _SPARSE_FIX,
    "_to_sparse_bsc": _SPARSE_FIX,
}
_MASK_FIX = "keep the shape: torch.where(mask, x, fill), x.masked_fill(mask, value), or nonzero_static"
# Indexing ops that turn a boolean (or uint8) mask into indices with ``nonzero`` first.
_INDEX_OPS = frozenset(["index"])
_INDEX_PUT_OPS = frozenset(["index_put", "index_put_", "_index_put_impl_"])
# Ops whose input is a host-made tensor the dispatcher has not seen before (``torch.tensor``):
# the storage is new, so it belongs to the capture, not to the caller.
_FRESH_INPUT_OPS = frozenset(["lift_fresh", "lift_fresh_copy"])
# Sparse layouts: the accessors of their compressed and plain index tensors.
_COMPRESSED_LAYOUTS = {
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}


def sanitize_enabled(flag: bool | None = None) -> bool:
    """Resolve a ``sanitize=`` argument: explicit flag, else ``GRAPHATTN_SANITIZE`` (off).

    Raises:
        ValueError: ``GRAPHATTN_SANITIZE`` holds something other than an on/off value.
    """
    if flag is not None:
        return bool(flag)
    return env_flag(SANITIZE_ENV)  # a typo raises: a debug switch must not silently stay off


def op_name(func: Any) -> str:
    """``aten.add_.Tensor`` style name of an ``OpOverload`` (or ``repr`` of anything else)."""
    return str(func) if hasattr(func, "_schema") else repr(func)


def host_readback_error(what: str, why: str, fix: str, emulated: bool = False) -> HostReadbackError:
    """The error for a host read-back during capture: ``what`` did it, ``why`` it needs the
    host, ``fix`` what to do instead; ``emulated``: refused by the CPU emulator, where every
    tensor stands for a device tensor."""
    where = (" (On the CPU graph emulator every tensor stands for a device tensor: a tensor that "
             "stays on the host on a GPU machine may be read there, but the graph keeps the value "
             "it read at capture, so read it before capturing.)") if emulated else ""
    return HostReadbackError(
        f"{what} {why} during graph capture; a real CUDA/HIP capture fails here (the stream "
        f"is only being recorded, so nothing can be read back from it), and a replay could "
        f"not follow a value read once at capture. Fix: {fix}.{where}"
    )


def check_host_readback(func: Any, args: tuple = (), kwargs: dict | None = None, emulated: bool = False) -> None:
    """Raise :class:`HostReadbackError` like a real capture would if ``func`` copies a device
    value to the host, or makes an output whose size depends on device values.

    On real graphs (``emulated=False``) only ops on a non-CPU tensor count: ``.item()`` of a
    CPU tensor is legal during a CUDA capture. On the emulator every tensor stands for a device
    tensor, so every read-back counts.
    """
    schema = getattr(func, "_schema", None)
    if schema is None:
        return
    base = schema.name.split("::")[-1]
    kwargs = kwargs or {}
    why, fix = "reads a device value back to the host", _HOST_READBACK_OPS.get(base)
    if fix is None:
        why, fix = "makes an output whose size depends on device values", _data_dependent_fix(
            base, schema.overload_name, args, kwargs, emulated)
    if fix is None:
        return
    if emulated or any(t.device.type != "cpu" for t in _tensors((args, kwargs))):
        raise host_readback_error(f"op '{op_name(func)}'", why, fix, emulated)


def _data_dependent_fix(base: str, overload: str, args: tuple, kwargs: dict, emulated: bool) -> str | None:
    """The fix for an op whose output size depends on values in these arguments, or None."""
    if base in _DATA_DEPENDENT_OPS:
        return _DATA_DEPENDENT_OPS[base]
    if base == "repeat_interleave" and overload in ("Tensor", "self_Tensor"):
        if kwargs.get("output_size") is None:
            return "pass repeat_interleave(..., output_size=N) (a fixed-size result)"
        return None
    if base not in _INDEX_OPS and base not in _INDEX_PUT_OPS:
        return None
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    masks = [i for i in indices or () if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
    if not masks:
        return None
    if base in _INDEX_PUT_OPS and _masked_fill_path(args, kwargs, indices, emulated):
        return None
    return _MASK_FIX


def _masked_fill_path(args: tuple, kwargs: dict, indices: Any, emulated: bool) -> bool:
    """True when ATen runs ``x[mask] = value`` as ``masked_fill_`` (no read-back): one mask as
    the only index tensor, no accumulation, a one-element host value (``canDispatchToMaskedFill``).
    On the emulator a one-element value stands for the host scalar Python indexing makes."""
    value = args[2] if len(args) > 2 else kwargs.get("values")
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    tensors = [i for i in indices if isinstance(i, torch.Tensor)]
    return (
        not accumulate
        and len(tensors) == 1
        and isinstance(value, torch.Tensor)
        and value.numel() == 1
        and (emulated or value.device.type == "cpu")
    )


def arg_names(func: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """Pair each argument with its schema name (``self``, ``other``, ``out``, ...)."""
    schema = getattr(func, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    pairs = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
    return pairs + list(kwargs.items())


def _storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    if t.device.type == "meta" or t.layout != torch.strided:
        return None
    try:
        st = t.untyped_storage()
        st.data_ptr()  # a wrapper subclass has a storage object that holds no memory
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return None
    return st


def tensor_parts(t: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """The tensors that hold the memory of a composite tensor, each with a label suffix, or
    ``None`` for a plain (strided) tensor: a wrapper subclass's inner tensors
    (``__tensor_flatten__``, as FP8 and quantised-weight wrappers implement it), a sparse
    tensor's indices and values. The kernels an op on ``t`` launches read these addresses."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [(f".{n}", getattr(t, n)) for n in names]
    if t.layout == torch.sparse_coo:
        return [("._indices()", t._indices()), ("._values()", t._values())]
    accessors = _COMPRESSED_LAYOUTS.get(t.layout)
    if accessors is not None:
        return [(f".{a}()", getattr(t, a)()) for a in accessors] + [(".values()", t.values())]
    return None


def _untrackable(t: torch.Tensor, op: str, arg: str) -> UntrackableTensorError:
    kind = type(t).__name__ if type(t) is not torch.Tensor else f"layout {t.layout}"
    return UntrackableTensorError(
        f"argument '{arg}' of op '{op}' is a {kind} tensor whose memory a graph capture cannot "
        f"see: it has no storage of its own and does not say which tensors hold its data, so "
        f"the capture could not check that they stay alive (a real graph replays their "
        f"addresses). Fix: implement __tensor_flatten__/__tensor_unflatten__ on the subclass "
        f"(torch's traceable wrapper-subclass protocol, which torch.compile also needs), or "
        f"pass the plain tensors it wraps to the captured function."
    )


def _strided_storage(t: torch.Tensor, op: str, arg: str) -> torch.UntypedStorage | None:
    """``t``'s storage; ``None`` if it holds no memory (meta, fake); raises
    :class:`UntrackableTensorError` for memory it cannot name (a wrapper subclass without
    ``__tensor_flatten__``, nested or other layouts)."""
    if t.device.type == "meta":
        return None
    if t.layout != torch.strided or t.is_nested:
        raise _untrackable(t, op, arg)
    try:
        st = t.untyped_storage()
        if st.device.type == "meta":  # a fake tensor (tracing): no memory behind it
            return None
        st.data_ptr()
    except (RuntimeError, NotImplementedError):
        raise _untrackable(t, op, arg) from None  # the cause only says "invalid python storage"
    return st


def _leaf_tensors(t: torch.Tensor, op: str, arg: str) -> list[tuple[str, torch.Tensor, torch.UntypedStorage]]:
    """Every plain tensor holding ``t``'s memory with its label and storage (``t`` itself for a
    plain tensor, the parts of a composite one, recursively); none for meta tensors."""
    parts = tensor_parts(t)
    if parts is None:
        st = _strided_storage(t, op, arg)
        return [] if st is None else [(arg, t, st)]
    return [leaf for suffix, p in parts for leaf in _leaf_tensors(p, op, arg + suffix)]


@dataclass
class BorrowedStorage:
    """A storage that existed before the capture, held weakly with its address.

    Attributes:
        ref: weak reference to the C++ storage (keeps only the control block alive).
        data_ptr: address of the storage at capture.
        nbytes: size of the storage at capture.
        op, arg: the first captured op and argument that touched it (for the error message).
        name: buffer name when known (GrowOnlyBuffer name or ``Owner.attribute``), else None.
    """

    ref: StorageWeakRef
    data_ptr: int
    nbytes: int
    op: str
    arg: str
    name: str | None = None

    def problem(self) -> str | None:
        """``None`` while the storage is alive and in place; otherwise what went wrong."""
        if self.ref.expired():
            return "was freed"
        st = torch.UntypedStorage._new_with_weak_ptr(self.ref.cdata)
        if st.data_ptr() != self.data_ptr:
            return f"moved from 0x{self.data_ptr:x} to 0x{st.data_ptr():x}"
        if st.nbytes() < self.nbytes:
            return f"shrank from {self.nbytes} to {st.nbytes()} bytes"
        return None

    def revive(self) -> torch.UntypedStorage:
        """The live storage, or :class:`FreedCaptureBufferError` naming buffer, op and arg."""
        problem = self.problem()
        if problem is not None:
            raise self.error(problem)
        return torch.UntypedStorage._new_with_weak_ptr(self.ref.cdata)

    def error(self, problem: str) -> FreedCaptureBufferError:
        """The error for this storage: the buffer name when known, else the op argument."""
        detail = f"(op argument '{self.arg}', {self.nbytes} bytes at 0x{self.data_ptr:x}) {problem}"
        return FreedCaptureBufferError(self.name or self.arg, self.op, detail)


@dataclass
class WeakTensor:
    """A tensor of a borrowed storage, held weakly: storage + offset/size/stride/dtype."""

    storage: BorrowedStorage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def revive(self, cache: dict[int, torch.UntypedStorage] | None = None) -> torch.Tensor:
        """A tensor on the live storage (raises if it was freed or moved)."""
        key = id(self.storage)
        st = cache.get(key) if cache is not None else None
        if st is None:
            st = self.storage.revive()
            if cache is not None:
                cache[key] = st
        t = torch.empty(0, dtype=self.dtype, device=self.device)
        return t.set_(st, self.offset, self.size, self.stride)


@dataclass
class CompositeTensor:
    """A composite tensor (wrapper subclass, sparse layout) held as its parts, each graph-owned
    (the tensor), a :class:`WeakTensor` or a :class:`CompositeTensor`; never the tensor itself,
    which would keep borrowed parts alive. A wrapper re-pointed at new parts after capture is
    rebuilt on the captured ones, as a real graph replays the captured addresses.

    Attributes:
        kind: ``"wrapper"`` (rebuilt by ``__tensor_unflatten__``), ``"coo"`` or ``"compressed"``.
        cls, layout, size, stride: what the rebuilt tensor needs.
        parts: the parts, in ``tensor_parts`` order.
        meta: a wrapper's ``(attribute names, flatten context)``; a COO tensor's coalesced flag.
    """

    kind: str
    cls: type
    layout: torch.layout
    size: tuple[int, ...]
    stride: tuple[int, ...] | None
    parts: list[Any]
    meta: Any = None

    def revive(self, cache: dict[int, torch.UntypedStorage] | None = None) -> torch.Tensor:
        """The tensor rebuilt on the captured parts (raises if a borrowed one was freed or moved)."""
        parts = [p.revive(cache) if isinstance(p, (WeakTensor, CompositeTensor)) else p for p in self.parts]
        if self.kind == "wrapper":
            names, ctx = self.meta
            return self.cls.__tensor_unflatten__(dict(zip(names, parts)), ctx, self.size, self.stride)
        if self.kind == "coo":
            return torch.sparse_coo_tensor(*parts, self.size, is_coalesced=self.meta, check_invariants=False)
        return torch.sparse_compressed_tensor(*parts, self.size, layout=self.layout, check_invariants=False)


def _composite(t: torch.Tensor, parts: list[Any]) -> CompositeTensor:
    """A :class:`CompositeTensor` for ``t`` holding ``parts`` (``tensor_parts`` order)."""
    size = tuple(t.shape)
    if is_traceable_wrapper_subclass(t):
        names, ctx = t.__tensor_flatten__()
        try:
            stride = tuple(t.stride())
        except (RuntimeError, NotImplementedError):  # layouts without strides (jagged)
            stride = None
        return CompositeTensor("wrapper", type(t), t.layout, size, stride, parts, (names, ctx))
    if t.layout == torch.sparse_coo:
        return CompositeTensor("coo", type(t), t.layout, size, None, parts, t.is_coalesced())
    return CompositeTensor("compressed", type(t), t.layout, size, None, parts)


def _only_held_by(st: torch.UntypedStorage, holders: int) -> bool:
    """True when nothing but ``holders`` references (tensors and storage objects the caller
    holds) keeps ``st`` alive: no tensor made before the op shares it."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return use_count is None or use_count(st._cdata) <= holders  # a torch without it: as before


class StorageTracker:
    """Classifies the tensors captured ops touch: graph-owned (pool) or borrowed (weak).

    One tracker serves every segment of one BreakableGraph, so a tensor made in segment 1 and
    read in segment 2 counts as graph-owned. A storage is graph-owned when a captured op
    returned it without it being any input's storage (a fresh allocation); everything else was
    borrowed from before the capture. Classification is by *storage*, never by tensor object:
    a view made during capture of an older buffer is still borrowed.
    """

    def __init__(self) -> None:
        self._pool: dict[int, StorageWeakRef] = {}  # cdata -> ref (the ref pins the cdata)
        self._borrowed: dict[int, BorrowedStorage] = {}  # cdata -> record

    def is_pool(self, st: torch.UntypedStorage) -> bool:
        """True if ``st`` was created during a capture of this graph."""
        return st._cdata in self._pool

    def add_pool(self, st: torch.UntypedStorage) -> None:
        """Declare ``st`` graph-owned (fresh allocations, break outputs). A storage already
        borrowed stays borrowed: holding it strongly would hide its being freed."""
        if st._cdata not in self._borrowed:
            self._pool.setdefault(st._cdata, StorageWeakRef(st))

    def borrow(self, t: torch.Tensor, st: torch.UntypedStorage, op: str, arg: str) -> WeakTensor:
        """Remember a borrowed storage weakly; return a weak handle to tensor ``t`` on it."""
        rec = self._borrowed.get(st._cdata)
        if rec is None:
            rec = BorrowedStorage(StorageWeakRef(st), st.data_ptr(), st.nbytes(), op, arg)
            self._borrowed[st._cdata] = rec
        return WeakTensor(rec, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> dict[int, WeakTensor]:
        """Classify one op's tensors; returns ``{id(tensor): WeakTensor}`` for borrowed ones
        (for a composite tensor, its borrowed parts, keyed by part).

        An output storage is graph-owned only when it is provably fresh: no input's storage,
        and referenced by nothing but this op's outputs. An op that returns memory something
        else still holds (a backend's workspace kept on an attribute, returned by a custom
        op) borrows it, so it is checked like any other borrowed buffer.

        Raises:
            UntrackableTensorError: a tensor whose memory it cannot see (a wrapper subclass
                without ``__tensor_flatten__``, a nested or other unknown layout).
        """
        name = op_name(func)
        base = name.split(".")[1] if "." in name else name
        inputs: set[int] = set()
        weak: dict[int, WeakTensor] = {}
        keep = []  # parts stay alive until classified, so their ids stay distinct
        for arg, value in arg_names(func, args, kwargs):
            for i, t in enumerate(_tensors(value)):
                label = arg if not isinstance(value, (list, tuple)) else f"{arg}[{i}]"
                leaves = _leaf_tensors(t, name, label)
                keep.append(leaves)
                for lbl, p, st in leaves:
                    if base in _FRESH_INPUT_OPS:
                        self.add_pool(st)
                    inputs.add(st._cdata)
                    if not self.is_pool(st):
                        weak[id(p)] = self.borrow(p, st, name, lbl)
        outs = [(t, _leaf_tensors(t, name, "result")) for t in _tensors(out)]
        # Per output storage: the output tensors and storage objects on it (its fresh refs).
        holders: dict[int, set[int]] = {}
        for t, leaves in outs:
            for _, p, st in leaves:
                holders.setdefault(st._cdata, set()).update((id(p), id(st)))
        for t, leaves in outs:
            # A composite's parts are also held by the composite itself (a sparse accessor even
            # returns a new alias), so for them only the input test applies.
            plain = len(leaves) == 1 and leaves[0][1] is t
            for lbl, p, st in leaves:
                fresh = st._cdata not in inputs and (not plain or _only_held_by(st, len(holders[st._cdata])))
                if fresh:
                    self.add_pool(st)  # a fresh allocation made by the captured op
                if not self.is_pool(st):  # a view, in-place result, or memory held elsewhere
                    weak[id(p)] = self.borrow(p, st, name, lbl)
        return weak

    def hold(self, t: torch.Tensor, op: str, arg: str) -> Any:
        """How a recording keeps tensor ``t`` of an op :meth:`observe` classified: ``t`` itself
        when graph-owned (or without memory), a :class:`WeakTensor` when borrowed, a
        :class:`CompositeTensor` for a wrapper subclass or sparse tensor."""
        parts = tensor_parts(t)
        if parts is None:
            st = _strided_storage(t, op, arg)
            return t if st is None or self.is_pool(st) else self.borrow(t, st, op, arg)
        return _composite(t, [self.hold(p, op, arg + suffix) for suffix, p in parts])

    def assign_names(self, names: dict[int, str]) -> None:
        """Attach buffer names (``{storage cdata: name}``) to borrowed storages lacking one."""
        for cdata, rec in self._borrowed.items():
            if rec.name is None and cdata in names:
                rec.name = names[cdata]

    def borrowed(self) -> list[BorrowedStorage]:
        """Every borrowed storage, in first-use order."""
        return list(self._borrowed.values())

    def borrowed_cdata(self) -> set[int]:
        """Identities of borrowed storages (valid while their weak refs live)."""
        return set(self._borrowed)

    def check(self) -> None:
        """Raise :class:`FreedCaptureBufferError` for the first borrowed storage not in place."""
        for rec in self._borrowed.values():
            problem = rec.problem()
            if problem is not None:
                raise rec.error(problem)

    def end_capture(self) -> None:
        """Drop pool identities (only needed while capturing); borrowed records stay."""
        self._pool.clear()


def _tensors(value: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(value)
    return [x for x in flat if isinstance(x, torch.Tensor)]


class CaptureSanitizer(TorchDispatchMode):
    """Dispatch mode active while a real graph segment captures: feeds a :class:`StorageTracker`.

    Every op still runs normally (it is being captured by the device graph); the mode only
    records which borrowed storages it touched and refuses host read-backs.
    """

    def __init__(self, tracker: StorageTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        check_host_readback(func, args, kwargs)
        out = func(*args, **kwargs)
        self.tracker.observe(func, args, kwargs, out)
        return out


# -- buffer names ---------------------------------------------------------------------------
_MAX_NAME_SCAN = 4096  # objects visited per scan: bounded, since it runs at every capture
_LEAVES = (str, bytes, int, float, bool, complex, torch.dtype, torch.device)


def collect_buffer_names(roots: Iterable[tuple[str, Any]], depth: int = 4) -> dict[int, str]:
    """Map storages reachable from ``roots`` to readable names: ``{storage cdata: name}``.

    Walks ``(label, object)`` roots through function closures, bound methods, partials,
    containers and object attributes. A :class:`~graphattn.common.buffers.GrowOnlyBuffer` is
    named by its own ``name``; a tensor attribute by ``Owner.attr``; an argument by its label.
    Names are what the error of a freed buffer shows (e.g. ``multi_cta_counter``).
    """
    names: dict[int, str] = {}
    for label, obj in walk_objects(roots, depth, descend=lambda o: not isinstance(o, GrowOnlyBuffer)):
        if isinstance(obj, torch.Tensor):
            for part_label, part in _named_parts(label, obj):
                st = _storage_of(part)
                if st is not None:
                    names.setdefault(st._cdata, part_label)
        elif isinstance(obj, GrowOnlyBuffer):
            st = _storage_of(obj.tensor)
            if st is not None:
                names[st._cdata] = obj.name  # the buffer's own name beats any path
    return names


def _named_parts(label: str, t: torch.Tensor, depth: int = 4) -> list[tuple[str, torch.Tensor]]:
    """``t`` with its label, or a composite tensor's parts labelled ``label.part``."""
    try:
        parts = tensor_parts(t) if depth > 0 else None
    except (RuntimeError, NotImplementedError, AttributeError):  # names are best effort
        parts = None
    if parts is None:
        return [(label, t)]
    return [named for suffix, p in parts for named in _named_parts(label + suffix, p, depth - 1)]


def walk_objects(
    roots: Iterable[tuple[str, Any]], depth: int = 4, descend: Callable[[Any], bool] = lambda o: True
) -> Iterator[tuple[str, Any]]:
    """Yield ``(label, object)`` for each object reachable from ``roots``, once each.

    Follows function closures and the globals they name, bound methods, partials, containers
    and object attributes, ``depth`` steps deep and at most ``_MAX_NAME_SCAN`` objects (it runs
    at every capture). Tensors are yielded but not entered; nor is anything ``descend`` refuses.
    """
    seen: set[int] = set()
    stack = [(label, obj, depth) for label, obj in roots]
    while stack and len(seen) < _MAX_NAME_SCAN:
        label, obj, left = stack.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        yield label, obj
        if left > 0 and not isinstance(obj, torch.Tensor) and descend(obj):
            stack.extend((lbl, child, left - 1) for lbl, child in _children(label, obj))


def _children(label: str, obj: Any) -> list[tuple[str, Any]]:
    """Objects reachable from ``obj`` one step away, with the label each should carry."""
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{label}[{i}]", v) for i, v in enumerate(obj)]
    if isinstance(obj, _LEAVES) or inspect.ismodule(obj) or inspect.isclass(obj):
        return []
    if isinstance(obj, functools.partial):
        return [(label, obj.func), (label, obj.args), (label, obj.keywords)]
    if inspect.ismethod(obj):
        return [(label, obj.__func__), (label, obj.__self__)]
    if inspect.isfunction(obj):
        return _function_children(obj)
    if inspect.isbuiltin(obj) or inspect.isroutine(obj):
        return []
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return []
    owner = type(obj).__name__
    return [(f"{owner}.{k}", v) for k, v in attrs.items() if not k.startswith("__")]


def _function_children(fn: Any) -> list[tuple[str, Any]]:
    """A function's closure cells and the module globals its code names (objects only)."""
    out = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    for name in fn.__code__.co_names:
        value = fn.__globals__.get(name)
        if value is not None and not (inspect.ismodule(value) or inspect.isclass(value)):
            out.append((name, value))
    return out


def named_roots(fn: Callable, args: tuple, kwargs: dict, extra: Iterable[tuple[str, Any]] = ()):
    """The ``(label, object)`` roots of a capture: the function, its args and kwargs."""
    roots = [("fn", fn)] + [(f"arg{i}", a) for i, a in enumerate(args)]
    return roots + list(kwargs.items()) + list(extra)
