"""Backend names -> classes, imported lazily; ``--attn-backend``; the ``auto`` choice.

Built-in backends are dotted class paths imported on first use, so listing names or parsing
``--attn-backend`` imports no kernel. Third-party backends register either in code with
:func:`register_backend` or, without touching graphattn, through the entry-point group
``graphattn.backends`` in their own ``pyproject.toml``::

    [project.entry-points."graphattn.backends"]
    my_backend = "my_pkg.attention:MyBackend"

An explicitly named backend that cannot run here fails loudly with its reasons; only ``auto``
falls back (and says what it skipped at INFO level).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from importlib.metadata import entry_points
from typing import Union

import torch

from ..common.kv_layout import KV_AUTO
from ..common.platform import Platform, current_platform, platform_or_current
from .base import AttentionBackend, kv_kwargs

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "graphattn.backends"
ENV_VAR = "GRAPHATTN_ATTN_BACKEND"
AUTO = "auto"

_BUILTIN: dict[str, str] = {
    "dispatch": "graphattn.backends.dispatch:DispatchBackend",
    "flashmla": "graphattn.backends.flashmla:FlashMLABackend",
    "trtllm": "graphattn.backends.trtllm:TrtllmBackend",
    "flashmla_mega": "graphattn.backends.flashmla_mega:FlashMLAMegaBackend",
    "torch": "graphattn.backends.torch_ref:TorchBackend",
}
# Registered in code: a dotted path or the class itself.
_REGISTERED: dict[str, Union[str, type]] = {}
BackendSpec = Union[str, type]


def builtin_backends() -> list[str]:
    """Names of the backends that ship with graphattn."""
    return list(_BUILTIN)


def _entry_point_specs() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _all_specs() -> dict[str, BackendSpec]:
    # Precedence: in-code registration > entry point > built-in (so a user can override).
    specs: dict[str, BackendSpec] = dict(_BUILTIN)
    specs.update(_entry_point_specs())
    specs.update(_REGISTERED)
    return specs


def backend_names() -> list[str]:
    """Every registered backend name (built-in, entry points, ``register_backend``)."""
    return list(_all_specs())


def register_backend(name: str, backend: BackendSpec, override: bool = False) -> None:
    """Register ``backend`` under ``name``: a class, or ``"pkg.mod:Class"`` / ``"pkg.mod.Class"``.

    A string is imported only when the backend is first used.

    Raises:
        ValueError: ``name`` is ``auto``, empty, holds ``:`` or surrounding spaces, or is already
            registered (pass ``override=True`` to replace).
        TypeError: ``name`` is not a str, or ``backend`` neither a backend class nor a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {name!r} ({type(name).__name__})")
    if not name.strip() or ":" in name or name != name.strip():
        raise ValueError(f"backend name must be non-empty, without ':' (which marks an import path "
                         f"'pkg.mod:Class') or surrounding spaces, got {name!r}")
    if name == AUTO:
        raise ValueError(f"'{AUTO}' is reserved for the automatic choice; pick another name")
    if name in _all_specs() and not override:
        raise ValueError(
            f"attention backend '{name}' is already registered; pass override=True to replace it"
        )
    if not (isinstance(backend, str) or (isinstance(backend, type) and issubclass(backend, AttentionBackend))):
        raise TypeError(f"backend must be a subclass of graphattn.backends.AttentionBackend or a "
                        f"'pkg.mod:Class' string, got {backend!r}")
    _REGISTERED[name] = backend


def unregister_backend(name: str) -> None:
    """Remove a backend registered with :func:`register_backend` (no effect on others)."""
    _REGISTERED.pop(name, None)


def _unknown(name: str) -> ValueError:
    valid = ", ".join([AUTO] + backend_names())
    return ValueError(f"Unknown attention backend: '{name}'. Valid options are: {valid}")


def split_backend_names(values: list[str]) -> list[str]:
    """Backend names from option values (each may be comma-separated), stripped, empties
    dropped, in order (repeats kept).

    Raises:
        ValueError: ``values`` given but naming no backend (``""``, ``","``): a run that checks
            nothing must not pass.
    """
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if values and not names:
        given = " ".join(repr(v) for v in values)
        raise ValueError(f"expected a backend name ('all', a registered name or 'pkg.module:Class'), got {given}")
    return names


def is_class_path(name: str) -> bool:
    """True for ``"pkg.module:Class"``: a backend named by its import path, unregistered."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr.isidentifier())


def _import(spec: str) -> type:
    module, sep, attr = spec.partition(":")
    if not sep:
        module, _, attr = spec.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def get_backend_class(name: str) -> type[AttentionBackend]:
    """The class registered as ``name`` (imported now if needed).

    ``name`` may also be an import path ``"pkg.module:Class"``, so an unregistered backend can be
    used or checked directly (``graphattn check --attn-backend my_pkg.attn:MyBackend``).

    Raises:
        ValueError: unknown name (the message lists the valid ones).
        TypeError: the registered object is not an :class:`AttentionBackend` subclass.
    """
    if not isinstance(name, str):
        raise TypeError(f"attention backend name must be a str (e.g. 'torch' or 'pkg.mod:Class'), "
                        f"got {name!r}")
    specs = _all_specs()
    if name not in specs and not is_class_path(name):
        raise _unknown(name)
    spec = specs.get(name, name)
    cls = _import(spec) if isinstance(spec, str) else spec
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
        raise TypeError(
            f"attention backend '{name}' ({spec!r}) is {cls!r}, expected a subclass of "
            "graphattn.backends.AttentionBackend"
        )
    return cls


def load_error(name: str) -> str | None:
    """Why ``name`` cannot be loaded as a backend class, in one line (``None``: it can).

    For command lines, which report it and exit: an unknown name (with the valid ones), a
    ``pkg.module:Class`` whose module does not import or lacks the class, or an object that is
    not an :class:`AttentionBackend` subclass. Other exceptions (a syntax error in the backend's
    module) propagate with their traceback.
    """
    try:
        get_backend_class(name)
    except (ValueError, TypeError) as exc:
        return str(exc)
    except (ImportError, AttributeError) as exc:
        hint = " (is its folder on sys.path?)" if isinstance(exc, ImportError) and is_class_path(name) else ""
        return f"cannot load attention backend '{name}': {type(exc).__name__}: {exc}{hint}"
    return None


def refusal_reasons(
    name: str, num_heads: int, dtype: torch.dtype, topk: int, platform: Platform | None = None,
    kv_dtype: str = KV_AUTO,
) -> list[str]:
    """Why backend ``name`` cannot run this configuration (KV layout ``kv_dtype``) here
    (``[]``: it can)."""
    try:
        cls = get_backend_class(name)
    except (ImportError, AttributeError) as exc:
        return [f"cannot import: {type(exc).__name__}: {exc}"]
    except TypeError as exc:  # registered, but not a backend class (a broken entry point)
        return [str(exc)]
    return cls.refusal_reasons(num_heads, dtype, topk, platform, **kv_kwargs(kv_dtype))


def available_backends(
    num_heads: int = 128,
    dtype: torch.dtype | None = None,
    topk: int = 2048,
    platform: Platform | None = None,
    kv_dtype: str = KV_AUTO,
) -> list[str]:
    """Registered names that can run the configuration (KV layout ``kv_dtype``) on
    ``platform`` (default: here).

    ``dtype`` defaults to bfloat16 on a GPU and float16 on the CPU (the Triton interpreter's
    bf16 ``tl.dot`` is broken in triton 3.9).
    """
    platform = platform_or_current("available_backends", platform)
    dtype = dtype or default_dtype(platform)
    return [n for n in backend_names() if not refusal_reasons(n, num_heads, dtype, topk, platform, kv_dtype)]


def default_dtype(platform: Platform | None = None) -> torch.dtype:
    """bfloat16 on a GPU; float16 where Triton runs in the interpreter (its bf16 dot is broken)."""
    platform = platform or current_platform()
    return torch.float16 if platform.uses_triton_interpreter else torch.bfloat16


def auto_order(num_heads: int, platform: Platform | None = None) -> list[str]:
    """Preference order of ``auto`` on this platform for ``num_heads`` (first runnable wins).

    On a GPU, ``dispatch``: it picks the kernel path per row count from the platform's measured
    kernel times (no single path wins at every batch size); then the single paths. Without a
    GPU the Triton kernels only run in the (slow) interpreter, so the torch reference comes first.
    """
    platform = platform or current_platform()
    if platform.uses_triton_interpreter:
        return ["torch", "flashmla_mega", "trtllm", "flashmla", "dispatch"]
    return ["dispatch", "flashmla", "trtllm", "flashmla_mega", "torch"]


def resolve_backend(
    name: str | None,
    num_heads: int,
    dtype: torch.dtype,
    topk: int,
    platform: Platform | None = None,
    kv_dtype: str = KV_AUTO,
) -> type[AttentionBackend]:
    """The backend class to use for ``--attn-backend name`` (``None`` or ``"auto"``: choose)
    with KV layout ``kv_dtype`` (``"auto"`` or ``"fp8"``).

    An explicit name never falls back: if it cannot run the configuration the error lists why.

    Raises:
        ValueError: unknown name, or the named backend refuses the configuration.
        RuntimeError: ``auto`` found no runnable backend (lists each candidate's reasons).
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"attention backend name must be a str or None (auto), got {name!r}")
    platform = platform_or_current("resolve_backend", platform)
    name = (name or AUTO).strip()
    if name != AUTO:
        cls = get_backend_class(name)
        reasons = cls.refusal_reasons(num_heads, dtype, topk, platform, **kv_kwargs(kv_dtype))
        if reasons:
            raise ValueError(
                f"attention backend '{name}' cannot run num_heads={num_heads}, topk={topk}, "
                f"dtype={dtype}, kv_dtype={kv_dtype} on platform '{platform.name}': " + "; ".join(reasons)
                + f". Pick another with --attn-backend (or '{AUTO}'); see `graphattn list`."
            )
        return cls
    skipped = {}
    for candidate in auto_order(num_heads, platform):
        reasons = refusal_reasons(candidate, num_heads, dtype, topk, platform, kv_dtype)
        if not reasons:
            if skipped:
                logger.info("auto attention backend: chose %s, skipped %s", candidate, skipped)
            return get_backend_class(candidate)
        skipped[candidate] = reasons
    raise RuntimeError(
        f"no attention backend can run num_heads={num_heads}, topk={topk}, dtype={dtype}, "
        f"kv_dtype={kv_dtype} on platform '{platform.name}': {skipped}"
    )


def _check_choice(value: str) -> str:
    if value != AUTO and value not in _all_specs() and not is_class_path(value):
        raise argparse.ArgumentTypeError(str(_unknown(value)))
    return value


def env_default_note(value: str) -> str:
    """`` (the default comes from $GRAPHATTN_ATTN_BACKEND=...)`` when ``value`` is that variable's
    value, else ``""``: an error about a name the user never typed must say where it came from."""
    from_env = os.environ.get(ENV_VAR, "").strip()
    return f" (the default comes from ${ENV_VAR}={from_env!r})" if from_env and value == from_env else ""


def add_attn_backend_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Give ``parser`` the ``--attn-backend NAME`` flag (default ``$GRAPHATTN_ATTN_BACKEND`` or auto).

    Names are validated when parsed, so a typo fails at startup with the list of valid names
    (a bad ``$GRAPHATTN_ATTN_BACKEND`` too, named as such).
    """
    from_env = os.environ.get(ENV_VAR, "").strip() or None  # set but empty: unset

    def check(value: str) -> str:
        try:
            return _check_choice(value)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc}{env_default_note(value)}") from None

    parser.add_argument(
        "--attn-backend",
        type=check,
        default=from_env if from_env is not None else AUTO,
        metavar="NAME",
        help=f"attention backend: {AUTO} or a registered name (built-in: "
        f"{', '.join(builtin_backends())}; see `graphattn list`). Default: ${ENV_VAR} or {AUTO}.",
    )
