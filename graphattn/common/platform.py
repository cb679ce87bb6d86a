"""Platform detection: the one place (with ``cuda/`` and ``hip/``) that knows the hardware.

A platform is **(graph rules) x (launch table)**, chosen independently:

* the *graph rules* (the :class:`Platform` subclass: segment class, capture-status query) come
  from ``GRAPHATTN_PLATFORM`` (``cpu``, ``cuda`` or ``hip``), else from the hardware;
* the *launch table* (Triton launch settings) always comes from the real hardware: NVIDIA's
  table at the device's real compute capability, AMD's at its gfx arch, or the interpreter's
  table without a GPU. So ``hip`` rules forced on an sm_80 GPU keep sm_80's settings.

``current_platform()`` resolves once. The cuda and hip classes, the launch tables and the CPU
emulator's segment are found by dotted path and imported lazily, so that ``common`` imports
nothing above it (the import test in ``tests/test_imports.py`` enforces the layering).
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import sys
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import torch

PLATFORM_ENV = "GRAPHATTN_PLATFORM"
_PLATFORM_CLASSES = {
    "cpu": "graphattn.common.platform.CpuPlatform",
    "cuda": "graphattn.cuda.platform.CudaPlatform",
    "hip": "graphattn.hip.platform.HipPlatform",
}
# Launch tables by the hardware's vendor ("none": no GPU, the Triton interpreter).
_LAUNCH_TABLES = {
    "none": "graphattn.common.interpreter_configs.InterpreterLaunchTable",
    "nvidia": "graphattn.cuda.launch.NvidiaLaunchTable",
    "amd": "graphattn.hip.launch.AmdLaunchTable",
}
_EMULATED_SEGMENT = "graphattn.graphs.emulated.EmulatedGraphSegment"
# The kernel paths (graphattn.kernels.plan.PATHS), named here so launch tables can key their
# measured times by them.
KERNEL_PATHS = ("flashmla", "trtllm", "mega")


def load_dotted(path: str) -> Any:
    """The object named ``package.module.Name``, importing its module now."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class DeviceFacts:
    """What the hardware is, asked once per platform object.

    Attributes:
        vendor: ``"nvidia"``, ``"amd"``, or ``"none"`` without a GPU.
        name: the device name (``"cpu"`` without a GPU).
        compute_units: SMs (NVIDIA) or CUs (AMD); CPU cores without a GPU.
        capability: NVIDIA compute capability ``(major, minor)``; ``None`` elsewhere.
        gfx_arch: AMD architecture, e.g. ``"gfx942"`` (feature suffixes stripped); ``None`` elsewhere.
    """

    vendor: str
    name: str
    compute_units: int
    capability: tuple[int, int] | None = None
    gfx_arch: str | None = None

    @property
    def has_gpu(self) -> bool:
        """True when a real GPU is present."""
        return self.vendor != "none"


def detect_device(index: int | None = None) -> DeviceFacts:
    """Ask torch about GPU ``index`` (default: the current device); the only place besides
    ``cuda/`` and ``hip/``."""
    if not torch.cuda.is_available():
        return DeviceFacts("none", "cpu", os.cpu_count() or 1)
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    if getattr(torch.version, "hip", None):
        return DeviceFacts("amd", props.name, props.multi_processor_count,
                           gfx_arch=props.gcnArchName.split(":")[0])
    return DeviceFacts("nvidia", props.name, props.multi_processor_count,
                       capability=tuple(torch.cuda.get_device_capability(index)))


# torch's C query of the current device: no lazy-init wrapper, no sync (absent from CPU builds,
# where no tensor is on a GPU and nothing asks).
_cuda_get_device = getattr(torch._C, "_cuda_getDevice", None)
_NO_SCOPE = nullcontext()  # reusable: entering it does nothing
# torch.cuda.is_current_stream_capturing without its Python wrapper (asked on every eager call;
# ROCm builds answer with hipStreamIsCapturing under the same name).
_cuda_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)
_gpu_initialised = False  # set once torch has initialised CUDA/HIP; it never goes back


def gpu_stream_capturing() -> bool:
    """Whether the current CUDA/HIP stream is in a real graph capture, whichever platform object
    is in use (a capture is a fact of the process's stream, not of a platform). False until
    torch has initialised the GPU (no capture can have begun; the query would initialise it);
    one C call after that. Asked on every eager call and every ``plan()``."""
    global _gpu_initialised
    if not _gpu_initialised:
        if not torch.cuda.is_initialized():
            return False
        _gpu_initialised = True
    return _cuda_is_capturing()


def current_gpu_index() -> int:
    """The current CUDA/HIP device index: where Triton launches and graphs capture. One C call
    (cudaGetDevice / hipGetDevice), no synchronisation; only asked where a GPU tensor exists."""
    return _cuda_get_device() if _cuda_get_device is not None else torch.cuda.current_device()


_cuda_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_handle(index: int) -> int:
    """The handle of GPU ``index``'s current stream (``cudaStream_t`` / ``hipStream_t`` as an
    int): one C call, no ``Stream`` object. Only asked where a tensor on that GPU exists."""
    return _cuda_raw_stream(index)


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` with its index: a bare ``"cuda"`` becomes ``cuda:<current device>``, so that
    storage made now and grown later stays on one GPU whatever the current device is then."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", current_gpu_index())
    return dev


def device_scope(device: torch.device) -> AbstractContextManager[Any]:
    """``torch.cuda.device(device)`` where ``device`` is a GPU other than the current one, else a
    no-op context: Triton launches, graph captures and capture streams follow the *current*
    device, so work for tensors on ``cuda:N`` runs with ``cuda:N`` current. Costs an int compare
    when the device is already current (the single-GPU case) and nothing on the CPU."""
    if device.type != "cuda" or device.index is None or device.index == current_gpu_index():
        return _NO_SCOPE
    return torch.cuda.device(device.index)


class LaunchTable:
    """Triton launch settings for one kind of hardware: ``kernel_config(path, **shape)``.

    Subclasses implement :meth:`settings`; this class adds temporary overrides (the kernel
    benchmark's ``--sweep``), so callers never reach into a vendor's config module.
    """

    name: str = "abstract"
    # The FP8 format this hardware converts natively, read by 656-byte FP8 KV tokens
    # (graphattn.common.kv_layout): e4m3fn on NVIDIA (sm_89+) and in the interpreter; AMD's
    # table says per gfx arch.
    fp8_dtype: torch.dtype = torch.float8_e4m3fn

    # Measured µs per call of each kernel path at (heads, rows, topk), with kv in q's dtype and
    # with 656-byte FP8 tokens; empty where nothing was measured on this hardware.
    kernel_times: Mapping[tuple[int, int, int], Mapping[str, float]] = MappingProxyType({})
    kernel_times_fp8: Mapping[tuple[int, int, int], Mapping[str, float]] = MappingProxyType({})

    def __init__(self) -> None:
        self._overrides: dict[str, dict[str, Any]] = {}

    def fastest_path(self, rows: int, heads: int, topk: int, kv_fp8: bool = False,
                     paths: tuple[str, ...] = KERNEL_PATHS) -> str | None:
        """The kernel path of ``paths`` measured fastest at the measured shape nearest to
        ``(heads, rows, topk)`` (:attr:`kernel_times`; distance in log2 of each size, ties to
        the first measured), or ``None`` where no shape was measured with one of ``paths``."""
        times = self.kernel_times_fp8 if kv_fp8 else self.kernel_times
        shape = (heads, max(rows, 1), topk)
        best, best_distance = None, math.inf
        for point, by_path in times.items():
            measured = [(us, p) for p, us in by_path.items() if p in paths]
            if not measured:
                continue
            distance = sum(math.log2(a / b) ** 2 for a, b in zip(shape, point))
            if distance < best_distance:
                best, best_distance = min(measured)[1], distance
        return best

    def settings(self, path: str, **shape: Any) -> dict[str, Any]:
        """The table's own settings for kernel ``path`` at ``rows=, heads=, topk=``."""
        raise NotImplementedError

    def kernel_config(self, path: str, **shape: Any) -> dict[str, Any]:
        """:meth:`settings` with any active :meth:`override` applied (a fresh dict)."""
        return {**self.settings(path, **shape), **self._overrides.get(path, {})}

    @contextmanager
    def override(self, path: str, **cfg: Any) -> Iterator[None]:
        """Temporarily replace keys of ``path``'s settings."""
        old = self._overrides.get(path)
        self._overrides[path] = {**(old or {}), **cfg}
        try:
            yield
        finally:
            if old is None:
                self._overrides.pop(path, None)
            else:
                self._overrides[path] = old

    def allow_launch_shared_memory(self, kernel: Any, nbytes: int) -> None:
        """Let Triton's compiled ``kernel`` launch with ``nbytes`` of dynamic shared memory per
        program, more than its code uses (a launch setting's ``HOLD_SMEM``). This table's
        hardware has no such launch: raises ``NotImplementedError``."""
        raise NotImplementedError(
            f"launch table {self.name!r} cannot reserve shared memory for a launch (HOLD_SMEM={nbytes}); "
            "its settings must not ask for it")

    def describe(self) -> dict[str, Any]:
        """The table's identity for logs and ``graphattn list``."""
        return {"launch_table": self.name}


def select_launch_table(facts: DeviceFacts, has_gpu: bool) -> LaunchTable:
    """The launch table of the real hardware (the interpreter's when kernels are interpreted)."""
    if not has_gpu:
        return load_dotted(_LAUNCH_TABLES["none"])()
    if facts.vendor == "amd":
        return load_dotted(_LAUNCH_TABLES["amd"])(arch=facts.gfx_arch)
    return load_dotted(_LAUNCH_TABLES["nvidia"])(capability=facts.capability)


class Platform:
    """What the rest of graphattn may ask about the hardware.

    Args:
        facts: the device (default: :func:`detect_device`, asked on first use).
        launch_table: the Triton launch settings (default: :func:`select_launch_table`).
        device: where tensors live; default ``cuda`` (the current GPU, whichever it is when a
            tensor is made) or ``cpu``. :meth:`on_device` makes one bound to ``cuda:N``.

    Attributes:
        name: ``"cpu"``, ``"cuda"`` or ``"hip"`` (the graph rules).
        head_pad_multiple: the head count a backend that pads q (``pads_q``) pads to a
            multiple of (no built-in kernel needs padded q).

    Device facts are computed once per object (kernels ask on every launch);
    ``reset_platform_cache()`` gives a fresh object.
    """

    name: str = "abstract"
    head_pad_multiple: int = 64

    def __init__(self, facts: DeviceFacts | None = None, launch_table: LaunchTable | None = None,
                 device: torch.device | str | None = None):
        self._facts, self._launch_table = facts, launch_table
        self._device = torch.device(device) if device is not None else None

    @functools.cached_property
    def facts(self) -> DeviceFacts:
        """The hardware this process runs on."""
        return self._facts or detect_device()

    @functools.cached_property
    def device(self) -> torch.device:
        """The torch device tensors live on (``cuda`` for both NVIDIA and AMD GPUs; ``cuda:N``
        for a platform made by :meth:`on_device`)."""
        if self._device is not None:
            return self._device
        return torch.device("cuda") if self.facts.has_gpu else torch.device("cpu")

    def on_device(self, device: torch.device | str | int) -> "Platform":
        """These graph rules on one device: a platform of the same class whose ``device`` is
        ``cuda:N`` (current or not; a bare ``cuda`` means the current one), with that GPU's
        facts. A backend made with it keeps its metadata there, and graphs on it capture and
        replay there (one per tensor-parallel rank). On the CPU only ``cpu`` is accepted.

        Raises:
            ValueError: another kind of device than this platform's, or an index this process
                does not see.
        """
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if dev.type != self.device.type:
            raise ValueError(
                f"platform '{self.name}' keeps tensors on {self.device.type!r}, got device {dev}; "
                f"use a {self.device.type} device" + ("" if self.has_gpu else " (there is no GPU here)")
            )
        if dev.type != "cuda":
            return self
        dev = indexed_device(dev)
        count = torch.cuda.device_count()
        if not 0 <= dev.index < count:
            raise ValueError(
                f"device {dev} does not exist: this process sees {count} GPU(s) (cuda:0..cuda:{count - 1}); "
                "check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES"
            )
        return type(self)(self._facts or detect_device(dev.index), self._launch_table, device=dev)

    @functools.cached_property
    def has_gpu(self) -> bool:
        """True when a real GPU is present (kernels compile; graphs are real graphs)."""
        return self.device.type == "cuda"

    @functools.cached_property
    def uses_triton_interpreter(self) -> bool:
        """True when Triton kernels must run under ``TRITON_INTERPRET=1`` (no GPU)."""
        return not self.has_gpu

    @functools.cached_property
    def launch_table(self) -> LaunchTable:
        """Triton launch settings of the real hardware (independent of the graph rules)."""
        return self._launch_table or select_launch_table(self.facts, self.has_gpu)

    @functools.cached_property
    def _compute_units(self) -> int:
        return self.facts.compute_units if self.has_gpu else os.cpu_count() or 1

    @functools.cached_property
    def fp8_dtype(self) -> torch.dtype:
        """The FP8 format of 656-byte KV tokens here: the real hardware's (its launch table's),
        ``float8_e4m3fn`` on NVIDIA and gfx950, ``float8_e4m3fnuz`` on gfx942."""
        return self.launch_table.fp8_dtype

    def num_compute_units(self) -> int:
        """Streaming multiprocessors (NVIDIA) or compute units (AMD); CPU cores on the CPU."""
        return self._compute_units

    def is_stream_capturing(self) -> bool:
        """Whether the current stream is in a real graph capture (torch's own query)."""
        return self.has_gpu and _cuda_is_capturing()

    def synchronize(self) -> None:
        """Wait for all queued work of this platform's device (the current GPU for ``cuda``)."""
        if self.has_gpu:
            torch.cuda.synchronize(self.device)

    def empty_cache(self) -> None:
        """Return cached allocator blocks to the device (a flush between replays in tests)."""
        if self.has_gpu:
            torch.cuda.empty_cache()

    def graph_segment_class(self) -> type:
        """The class that captures and replays one graph segment on this platform."""
        raise NotImplementedError

    def eager_graph_class(self) -> type | None:
        """The segment class of the real device graphs an eager call may capture once and then
        replay instead of launching its ops one by one (the ``torch`` backend does), or ``None``
        where graphs are not real: without a GPU the emulator's replay re-runs every op. Its
        user captures with the class's ``isolated()`` subclasses (side streams of their own, not
        the one a ``GraphRunner`` captures on)."""
        return self.graph_segment_class() if self.has_gpu else None

    def kernel_config(self, path: str, **shape: Any) -> dict[str, Any]:
        """Triton launch settings for kernel ``path`` at the given problem shape."""
        return self.launch_table.kernel_config(path, **shape)

    def fastest_path(self, rows: int, heads: int, topk: int, kv_fp8: bool = False,
                     paths: tuple[str, ...] = KERNEL_PATHS) -> str | None:
        """The kernel path measured fastest here near this shape (:meth:`LaunchTable.fastest_path`;
        ``None``: not measured on this hardware)."""
        return self.launch_table.fastest_path(rows, heads, topk, kv_fp8, paths)

    def describe(self) -> dict[str, Any]:
        """Device facts for logs and ``graphattn list``."""
        return {
            "platform": self.name,
            "device": str(self.device),
            "compute_units": self.num_compute_units(),
            "head_pad_multiple": self.head_pad_multiple,
            "fp8_dtype": str(self.fp8_dtype).replace("torch.", ""),
            **self.launch_table.describe(),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device})"


def emulated_segment_class() -> type:
    """The CPU graph emulator's segment class (``graphattn.graphs.emulated``), imported lazily."""
    return load_dotted(_EMULATED_SEGMENT)


class CpuPlatform(Platform):
    """No GPU: kernels run under the Triton interpreter, graphs on the CPU emulator."""

    name = "cpu"

    @functools.cached_property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def graph_segment_class(self) -> type:
        return emulated_segment_class()


def _check_name(name: str) -> None:
    if name not in _PLATFORM_CLASSES:
        raise ValueError(
            f"{PLATFORM_ENV}={name!r} is not a platform; expected one of "
            f"{sorted(_PLATFORM_CLASSES)} (or leave it unset to detect the hardware)"
        )


def _resolve(name: str) -> Platform:
    _check_name(name)
    return load_dotted(_PLATFORM_CLASSES[name])()


def detect_platform_name() -> str:
    """The platform the hardware implies, ignoring ``GRAPHATTN_PLATFORM``."""
    if not torch.cuda.is_available():
        return "cpu"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


@functools.lru_cache(maxsize=None)
def current_platform() -> Platform:
    """The platform for this process, resolved once (``GRAPHATTN_PLATFORM`` overrides)."""
    return _resolve(os.environ.get(PLATFORM_ENV, "").strip().lower() or detect_platform_name())


def check_platform_arg(who: str, platform: Any) -> None:
    """Raise ``TypeError`` unless ``platform`` is a graphattn :class:`Platform` or ``None`` (the
    caller's default, :func:`current_platform`); ``who`` names the caller in the message."""
    if platform is not None and not isinstance(platform, Platform):
        raise TypeError(f"{who}: platform must be a graphattn Platform or None, got {platform!r}; "
                        "use graphattn.common.current_platform() or leave it out")


def platform_or_current(who: str, platform: Any) -> Platform:
    """``platform`` checked by :func:`check_platform_arg`, or :func:`current_platform` for None."""
    check_platform_arg(who, platform)
    return platform or current_platform()


INTERPRET_ENV = "TRITON_INTERPRET"


@functools.lru_cache(maxsize=None)
def kernels_interpreted() -> bool:
    """Whether Triton kernels run in the interpreter in this process (no GPU to compile for).

    Decided once, like Triton's own choice, which cannot change after triton is imported; a
    later ``GRAPHATTN_PLATFORM`` change (tests) does not move it.
    """
    try:
        return current_platform().uses_triton_interpreter
    except ValueError:  # a bad GRAPHATTN_PLATFORM: current_platform() raises where it is used
        return not torch.cuda.is_available()


@contextmanager
def triton_interpreter_env() -> Iterator[None]:
    """``TRITON_INTERPRET=1`` for the duration, where kernels cannot be compiled (no GPU).

    Triton reads the variable when ``triton.language`` is first imported and when
    ``@triton.jit`` decorates a kernel; graphattn does both inside this scope
    (:func:`import_triton`, ``graphattn.kernels._jit``), so nothing else in the process sees
    the variable: an unrelated test run or a ``torch.compile`` keeps its own setting. A value
    the caller set (``TRITON_INTERPRET=0`` to compile ahead of time) is left alone.
    """
    if INTERPRET_ENV in os.environ or not kernels_interpreted():
        yield
        return
    os.environ[INTERPRET_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(INTERPRET_ENV, None)


def import_triton() -> None:
    """Import triton now, in the mode graphattn's kernels need, if nothing has imported it yet.

    Without a GPU its own ``tl.*`` helpers must be interpreted functions too, and torch imports
    triton as a side effect (``torch._dynamo``, which graph capture touches), so the first
    import must not be left to chance; ``graphattn.common`` calls this on import.
    """
    if "triton" in sys.modules or not kernels_interpreted():
        return
    with triton_interpreter_env():
        try:
            import triton.language  # noqa: F401
        except ImportError:  # no triton: only the torch backend runs (graphattn list says why)
            pass


def platform_choice() -> tuple[str, str]:
    """``(name, why)``: the platform ``current_platform()`` resolves to and the reason.

    Raises:
        ValueError: ``GRAPHATTN_PLATFORM`` names no platform.
    """
    forced = os.environ.get(PLATFORM_ENV, "").strip().lower()
    if forced:
        _check_name(forced)
        return forced, f"forced by {PLATFORM_ENV}={forced} (hardware: {detect_platform_name()})"
    name = detect_platform_name()
    if name == "cpu":
        return name, "no usable GPU: torch.cuda.is_available() is False"
    return name, f"detected a GPU with a {'ROCm' if name == 'hip' else 'CUDA'} build of torch"


def torch_runtime() -> dict[str, Any]:
    """torch's version, its CUDA and ROCm versions (``None`` where the build has none) and the
    number of GPUs it sees: for bug reports (``graphattn env``)."""
    return {"version": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def reset_platform_cache() -> None:
    """Forget the resolved platform (tests that change ``GRAPHATTN_PLATFORM`` call this)."""
    current_platform.cache_clear()
