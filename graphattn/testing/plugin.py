"""pytest plugin: the backend conformance suite (``pytest --pyargs graphattn.testing``).

Registered through the ``pytest11`` entry point, so installing graphattn makes it available to
every pytest run; it only adds options and parametrizes tests that ask for the
``graphattn_case`` argument (the suite's own test module), so other test suites are unaffected.
Without entry-point autoloading, load it with ``-p graphattn.testing.plugin``.

Options:
    --attn-backend NAME   backend(s) to check; repeat or comma-separate; ``all`` = every
                          registered backend. Default: the built-in backends available here.
    --conformance-shapes  ``small`` (CPU sizes) or ``real`` (GPU sizes); default by platform.
    --conformance-dtype   ``float16``, ``bfloat16`` or ``float32``; default bf16 on a GPU and
                          fp16 under the Triton interpreter.
    --conformance-kv-dtype  ``auto`` (kv in q's dtype, the default) or ``fp8`` (656-byte FP8
                          tokens, against the reference of the dequantised cache; backends
                          that do not take the layout are skipped with their reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

CASE_ARG = "graphattn_case"
_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class ConformanceCase:
    """One parametrized case: backend name x batch spec x mode, with the shape set and dtype."""

    backend: str
    spec: Any  # graphattn.testing.specs.BatchSpec
    mode: str
    shape: Any  # graphattn.testing.specs.SuiteShape
    dtype: Any  # torch.dtype or None (pick_dtype decides)
    kv_dtype: str = "auto"  # the KV layout: "auto" or "fp8"

    @property
    def id(self) -> str:
        kv = "" if self.kv_dtype == "auto" else f"-kv_{self.kv_dtype}"
        return f"{self.backend}-{self.spec.name}-{self.mode}{kv}"

    def run(self) -> None:
        """Run the case (see :func:`graphattn.testing.checks.check_case`)."""
        from ..backends import get_backend_class
        from .checks import check_case

        check_case(get_backend_class(self.backend), self.spec, self.mode, self.shape, self.dtype,
                   kv_dtype=self.kv_dtype)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("graphattn", "graphattn attention backend conformance")
    group.addoption(
        "--attn-backend", action="append", dest="graphattn_backends", default=None,
        metavar="NAME", help="backend(s) the conformance suite checks (repeat or comma-separate; "
        "'all' = every registered backend; default: built-in backends available here)",
    )
    group.addoption(
        "--conformance-shapes", dest="graphattn_shapes", choices=("small", "real"), default=None,
        help="conformance shape set: small (CPU) or real (GPU); default by platform",
    )
    group.addoption(
        "--conformance-dtype", dest="graphattn_dtype", choices=_DTYPES, default=None,
        help="q/kv dtype of the conformance suite (default: bfloat16 on GPU, float16 on CPU)",
    )
    _add_kv_dtype_option(group)


def _add_kv_dtype_option(group: Any) -> None:
    group.addoption(
        "--conformance-kv-dtype", dest="graphattn_kv_dtype", choices=("auto", "fp8"), default="auto",
        help="KV-cache layout of the conformance suite: auto (kv in q's dtype) or fp8 (656-byte "
        "FP8 tokens, checked against the reference of the dequantised cache)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "graphattn_conformance: a graphattn backend conformance case")


def selected_backends(option_values: list[str] | None) -> list[str]:
    """Backend names from ``--attn-backend`` values (validated), or the default set."""
    from ..backends import registry

    if not option_values:
        from ..common.platform import current_platform

        platform = current_platform()
        dtype = registry.default_dtype(platform)
        return [n for n in registry.builtin_backends() if not registry.refusal_reasons(n, 16, dtype, 64, platform)]
    names = [n.strip() for v in option_values for n in v.split(",") if n.strip()]
    if "all" in names:
        return registry.backend_names()
    for name in names:
        if name not in registry.backend_names() and not registry.is_class_path(name):
            raise pytest.UsageError(str(registry._unknown(name)))
    return list(dict.fromkeys(names))


def conformance_params(backends: list[str], shape_name: str | None = None, dtype_name: str | None = None,
                       kv_dtype: str = "auto") -> list:
    """``pytest.param`` objects for backends x specs x modes, with skip marks and readable ids
    (``kv_dtype``: the KV layout every case passes, ``"auto"`` or ``"fp8"``)."""
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
                case = ConformanceCase(name, spec, mode, shape, dtype, kv_dtype)
                reason = skip_reason(cls, spec, mode, dtype, platform, kv_dtype)
                marks = [pytest.mark.graphattn_conformance]
                if reason:
                    marks.append(pytest.mark.skip(reason=reason))
                params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CASE_ARG not in metafunc.fixturenames:
        return
    opt = metafunc.config.getoption
    backends = selected_backends(opt("graphattn_backends"))
    params = conformance_params(backends, opt("graphattn_shapes"), opt("graphattn_dtype"), opt("graphattn_kv_dtype"))
    metafunc.parametrize(CASE_ARG, params)
