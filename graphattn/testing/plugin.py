"""pytest plugin: the backend conformance suite (``pytest --pyargs graphattn.testing``).

Registered through the ``pytest11`` entry point, so pytest loads it in every run of an
environment where graphattn is installed. It is inert unless asked for:

* loading it imports neither torch nor triton (``graphattn`` and ``graphattn.testing`` import
  lazily); they load when a test asks for ``graphattn_case`` (the suite's own test module);
* its options are namespaced; the old unprefixed spellings are added as aliases only where no
  other plugin or ``conftest.py`` registered the same name (that one keeps it, untouched);
* it changes no environment variable, except ``TRITON_INTERPRET=1`` while the suite runs on a
  machine without a GPU (third-party Triton backends need it when they define and launch
  kernels), removed again when the session ends.

Without entry-point autoloading, load it with ``-p graphattn.testing.plugin``.

Options (aliases in brackets, where free):
    --graphattn-backend NAME  [--attn-backend] backend(s) to check; repeat or comma-separate;
                              ``all`` = every registered backend; ``pkg.module:Class`` = an
                              unregistered class. Default: the built-in backends available here.
    --graphattn-shapes SET    [--conformance-shapes] ``small`` (CPU sizes) or ``real`` (GPU
                              sizes); default by platform.
    --graphattn-dtype DTYPE   [--conformance-dtype] ``float16``, ``bfloat16`` or ``float32``;
                              default bf16 on a GPU and fp16 under the Triton interpreter.
    --graphattn-kv-dtype KV   [--conformance-kv-dtype] ``auto`` (kv in q's dtype, the default)
                              or ``fp8`` (656-byte FP8 tokens, against the reference of the
                              cache dequantised into q's dtype; backends that do not take the
                              layout are skipped with their reason).
    --graphattn-device DEVICE [--conformance-device] where the suite's tensors, metadata and
                              graphs live, e.g. ``cuda:1`` (current device or not; the current
                              one stays as it is). Default: the platform's device.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from typing import Any, Generator

import pytest

CASE_ARG = "graphattn_case"
_DTYPES = ("float16", "bfloat16", "float32")
GROUP = "graphattn"
# option -> argparse keywords; each option's old spelling is its alias.
OPTIONS: dict[str, dict[str, Any]] = {
    "--graphattn-backend": dict(
        action="append", dest="graphattn_backends", default=None, metavar="NAME",
        help="backend(s) the graphattn conformance suite checks (repeat or comma-separate; 'all' = "
        "every registered backend; 'pkg.module:Class'; default: built-in backends available here)"),
    "--graphattn-shapes": dict(
        dest="graphattn_shapes", choices=("small", "real"), default=None,
        help="graphattn conformance shape set: small (CPU) or real (GPU); default by platform"),
    "--graphattn-dtype": dict(
        dest="graphattn_dtype", choices=_DTYPES, default=None,
        help="q/kv dtype of the graphattn conformance suite (default: bfloat16 on GPU, float16 on CPU)"),
    "--graphattn-kv-dtype": dict(
        dest="graphattn_kv_dtype", choices=("auto", "fp8"), default="auto",
        help="KV-cache layout of the graphattn conformance suite: auto (kv in q's dtype) or fp8 "
        "(656-byte FP8 tokens, checked against the reference of the cache dequantised into q's dtype)"),
    "--graphattn-device": dict(
        dest="graphattn_device", default=None, metavar="DEVICE",
        help="device of the graphattn conformance suite, e.g. cuda:1 (any index, current or not; "
        "default: the platform's device)"),
}
ALIASES = {"--attn-backend": "--graphattn-backend", "--conformance-shapes": "--graphattn-shapes",
           "--conformance-dtype": "--graphattn-dtype", "--conformance-kv-dtype": "--graphattn-kv-dtype",
           "--conformance-device": "--graphattn-device"}
_INTERPRETER_SCOPE = pytest.StashKey[contextlib.ExitStack]()


@dataclass(frozen=True)
class ConformanceCase:
    """One parametrized case: backend name x batch spec x mode, with the shape set and dtype."""

    backend: str
    spec: Any  # graphattn.testing.specs.BatchSpec
    mode: str
    shape: Any  # graphattn.testing.specs.SuiteShape
    dtype: Any  # torch.dtype or None (pick_dtype decides)
    kv_dtype: str = "auto"  # the KV layout: "auto" or "fp8"
    device: str | None = None  # e.g. "cuda:1"; None: the platform's device

    @property
    def id(self) -> str:
        kv = "" if self.kv_dtype == "auto" else f"-kv_{self.kv_dtype}"
        return f"{self.backend}-{self.spec.name}-{self.mode}{kv}"

    def run(self) -> None:
        """Run the case (see :func:`graphattn.testing.checks.check_case`)."""
        from ..backends import get_backend_class
        from .checks import check_case

        check_case(get_backend_class(self.backend), self.spec, self.mode, self.shape, self.dtype,
                   platform=device_platform(self.device), kv_dtype=self.kv_dtype)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the namespaced options (the old spellings come later, if free)."""
    group = parser.getgroup(GROUP, "graphattn attention backend conformance")
    for name, kwargs in OPTIONS.items():
        group.addoption(name, **kwargs)


def _taken_option_names(parser: pytest.Parser) -> set[str] | None:
    """Every option name registered so far (``None`` if this pytest hides them)."""
    try:
        groups = [parser._anonymous, *parser._groups]
        return {name for group in groups for opt in group.options for name in opt.names()}
    except AttributeError:
        return None


def add_free_aliases(parser: pytest.Parser) -> list[str]:
    """Register each old spelling in :data:`ALIASES` that no one else registered; returns them.

    A name another plugin or ``conftest.py`` owns stays theirs: registering it twice would make
    argparse reject their option and break their test run.
    """
    taken = _taken_option_names(parser)
    if taken is None:
        return []
    group, added = parser.getgroup(GROUP), []
    for alias, name in ALIASES.items():
        if alias in taken:
            continue
        kwargs = dict(OPTIONS[name], help=f"alias of {name}")
        try:
            group.addoption(alias, **kwargs)
        except (ValueError, argparse.ArgumentError):  # taken after all: theirs to keep
            continue
        added.append(alias)
    return added


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> Generator[None, None, None]:
    """After the initial conftests load, add the old option spellings that are still free."""
    # The aliases wait for the initial conftests: a project's own ``--attn-backend`` (added
    # there or by any plugin loaded before) must find the name free.
    yield
    add_free_aliases(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Declare the suite's marker; check ``--graphattn-backend`` names if some were given."""
    config.addinivalue_line("markers", "graphattn_conformance: a graphattn backend conformance case")
    if config.getoption("graphattn_backends"):  # asked for: a bad name fails now, as a usage error
        selected_backends(config.getoption("graphattn_backends"))
    if config.getoption("graphattn_device"):  # likewise a device this process does not have
        device_platform(config.getoption("graphattn_device"))


def device_platform(device: str | None) -> Any:
    """The current platform bound to ``device`` (``Platform.on_device``), or ``None`` for the
    platform's own device.

    Raises:
        pytest.UsageError: a device that is not one of this platform's (or does not exist).
    """
    if not device:
        return None
    import torch

    from ..common.platform import current_platform

    try:
        return current_platform().on_device(torch.device(device))
    except (ValueError, RuntimeError) as exc:  # RuntimeError: torch cannot parse the string
        raise pytest.UsageError(f"--graphattn-device {device}: {exc}") from None


def _leave_suite(config: pytest.Config) -> None:
    scope = config.stash.get(_INTERPRETER_SCOPE, None)
    if scope is not None:
        scope.close()  # TRITON_INTERPRET back to what it was (unset); closing twice is harmless


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Restore ``TRITON_INTERPRET`` if the suite set it."""
    # First, so that every other plugin's and conftest's session-end hooks see the environment
    # as it was before the suite.
    _leave_suite(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Restore ``TRITON_INTERPRET`` in a run that never finished its session."""
    _leave_suite(config)


def _enter_suite(config: pytest.Config) -> None:
    """The suite is collected: switch the Triton interpreter on until the session ends, if this
    machine needs it and the caller did not choose (see the module doc)."""
    if _INTERPRETER_SCOPE in config.stash:
        return
    from ..common.platform import current_platform, triton_interpreter_env

    try:
        current_platform()
    except ValueError as exc:  # GRAPHATTN_PLATFORM names no platform
        raise pytest.UsageError(str(exc)) from None
    scope = contextlib.ExitStack()
    scope.enter_context(triton_interpreter_env())
    config.stash[_INTERPRETER_SCOPE] = scope


def selected_backends(option_values: list[str] | None) -> list[str]:
    """Backend names from ``--graphattn-backend`` values, or the default set.

    Raises:
        pytest.UsageError: a name that is unknown or whose class cannot be loaded, or values
            that name no backend at all (``""``, ``","``).
    """
    from ..backends import registry

    if not option_values:
        from ..common.platform import current_platform

        platform = current_platform()
        dtype = registry.default_dtype(platform)
        return [n for n in registry.builtin_backends() if not registry.refusal_reasons(n, 16, dtype, 64, platform)]
    try:
        names = registry.split_backend_names(option_values)
    except ValueError as exc:  # --graphattn-backend "" or ","
        raise pytest.UsageError(f"--graphattn-backend: {exc}") from None
    if "all" in names:
        return registry.backend_names()
    names = list(dict.fromkeys(names))
    for name in names:
        error = registry.load_error(name)
        if error:
            raise pytest.UsageError(error)
    return names


def conformance_params(backends: list[str], shape_name: str | None = None, dtype_name: str | None = None,
                       kv_dtype: str = "auto", device: str | None = None) -> list:
    """``pytest.param`` objects for backends x specs x modes, with skip marks and readable ids
    (``kv_dtype``: the KV layout every case passes, ``"auto"`` or ``"fp8"``; ``device``: where
    every case runs, ``None`` for the platform's device)."""
    import torch

    from ..backends import get_backend_class
    from ..common.platform import current_platform
    from .checks import pick_dtype, skip_reason
    from .specs import MODES, SHAPES, default_shape_name

    platform = current_platform()
    shape = SHAPES[shape_name or default_shape_name(platform.has_gpu)]
    requested = getattr(torch, dtype_name) if dtype_name else None
    params = []
    for name in backends:
        cls = get_backend_class(name)
        dtype = pick_dtype(cls, platform, requested)
        for spec in shape.specs:
            for mode in MODES:
                case = ConformanceCase(name, spec, mode, shape, dtype, kv_dtype, device)
                reason = skip_reason(cls, spec, mode, dtype, platform, kv_dtype)
                marks = [pytest.mark.graphattn_conformance]
                if reason:
                    marks.append(pytest.mark.skip(reason=reason))
                params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``graphattn_case`` (only the suite's own test asks for it)."""
    if CASE_ARG not in metafunc.fixturenames:
        return
    _enter_suite(metafunc.config)
    opt = metafunc.config.getoption
    backends = selected_backends(opt("graphattn_backends"))
    params = conformance_params(backends, opt("graphattn_shapes"), opt("graphattn_dtype"), opt("graphattn_kv_dtype"),
                                opt("graphattn_device"))
    metafunc.parametrize(CASE_ARG, params)
