"""Capture sanitizer: refuse a replay that would touch storage freed or moved since capture.

A captured graph replays raw addresses and keeps nothing alive. While a segment captures, a
:class:`torch.utils._python_dispatch.TorchDispatchMode` sees every aten op and every torch custom
op (Triton kernels registered with ``torch.library``) with its tensor arguments. For each tensor
it asks one question: was its *storage* created during this capture (it then belongs to the
graph's pool), or did it exist before (the graph merely borrows its address)? Borrowed storages
are remembered **weakly** (``StorageWeakRef``) with their address; before a replay,
:meth:`StorageTracker.check` raises :class:`FreedCaptureBufferError` if one expired or moved.

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
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..common.buffers import GrowOnlyBuffer
from ..common.errors import FreedCaptureBufferError, GraphSafetyError
from ..common.validation import env_flag

SANITIZE_ENV = "GRAPHATTN_SANITIZE"

# Ops that read a device value back to the host: a real capture fails on them (the copy would
# have to synchronize a stream that is recording), so the emulator and sanitizer refuse them too.
_HOST_READBACK_OPS = frozenset(
    ["_local_scalar_dense", "item", "equal", "nonzero", "is_nonzero", "allclose"]
)
# Ops whose input is a host-made tensor the dispatcher has not seen before (``torch.tensor``):
# the storage is new, so it belongs to the capture, not to the caller.
_FRESH_INPUT_OPS = frozenset(["lift_fresh", "lift_fresh_copy"])


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


def check_host_readback(func: Any, args: tuple | None = None) -> None:
    """Raise like a real capture would if ``func`` copies a device value to the host.

    With ``args`` (real graphs), only a read-back of a non-CPU tensor counts: ``.item()`` of a
    CPU tensor is legal during a CUDA capture. Without (the emulator, whose CPU tensors stand in
    for device tensors), every read-back counts.
    """
    base = getattr(getattr(func, "_schema", None), "name", "").split("::")[-1]
    if base not in _HOST_READBACK_OPS:
        return
    if args is None or any(t.device.type != "cpu" for t in _tensors(args)):
        raise GraphSafetyError(
            f"op '{op_name(func)}' reads a device value back to the host during graph capture "
            f"(.item(), bool(tensor), nonzero, printing); a real CUDA/HIP capture fails here. "
            f"Fix: plan host-side values before capture (backend.plan) or keep them on device."
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
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return None


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
        """Classify one op's tensors; returns ``{id(tensor): WeakTensor}`` for borrowed ones."""
        name = op_name(func)
        base = name.split(".")[1] if "." in name else name
        inputs: set[int] = set()
        weak: dict[int, WeakTensor] = {}
        for arg, value in arg_names(func, args, kwargs):
            for i, t in enumerate(_tensors(value)):
                st = _storage_of(t)
                if st is None:
                    continue
                if base in _FRESH_INPUT_OPS:
                    self.add_pool(st)
                inputs.add(st._cdata)
                if not self.is_pool(st):
                    label = arg if not isinstance(value, (list, tuple)) else f"{arg}[{i}]"
                    weak[id(t)] = self.borrow(t, st, name, label)
        for t in _tensors(out):
            st = _storage_of(t)
            if st is None:
                continue
            if st._cdata not in inputs:
                self.add_pool(st)  # a fresh allocation made by the captured op
            if not self.is_pool(st):  # a view or in-place result on a borrowed storage
                weak[id(t)] = self.borrow(t, st, name, "result")
        return weak

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
        check_host_readback(func, args)
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
            st = _storage_of(obj)
            if st is not None:
                names.setdefault(st._cdata, label)
        elif isinstance(obj, GrowOnlyBuffer):
            st = _storage_of(obj.tensor)
            if st is not None:
                names[st._cdata] = obj.name  # the buffer's own name beats any path
    return names


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
