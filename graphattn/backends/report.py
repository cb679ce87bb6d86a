"""What people attach to a bug report: ``graphattn env`` and the ``env`` block of the bench JSON.

Versions (graphattn, python, torch with its CUDA / ROCm, triton), the device (name, compute
capability or gfx arch), the platform graphattn chose and why, and every registered backend
with whether it can run here and, if not, the registry's reasons. ``graphattn list`` shows the
same backend rows as a table.
"""

from __future__ import annotations

import os
import platform as _python_platform
import sys
from typing import Any

import torch

from ..common.platform import Platform, current_platform, platform_choice, torch_runtime
from .base import kv_kwargs
from .registry import backend_names, default_dtype, get_backend_class


def backend_row(name: str, heads: int, topk: int, dtype: torch.dtype, platform: Platform,
                kv_dtype: str = "auto") -> dict[str, Any]:
    """One backend's availability, refusal reasons and capabilities on ``platform`` (with the
    KV layout ``kv_dtype``: ``auto`` or ``fp8``)."""
    try:
        cls = get_backend_class(name)
    except Exception as exc:  # a broken third-party entry point must not hide the others
        return {"name": name, "available": False, "reasons": [f"cannot load: {type(exc).__name__}: {exc}"]}
    reasons = cls.refusal_reasons(heads, dtype, topk, platform, **kv_kwargs(kv_dtype))
    return {
        "name": name,
        "available": not reasons,
        "reasons": reasons,
        "notes": cls.notes(platform),
        "description": cls.description,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        **cls.capabilities(platform),
    }


def backend_rows(heads: int, topk: int, dtype: torch.dtype | None, platform: Platform,
                 kv_dtype: str = "auto") -> list[dict[str, Any]]:
    """:func:`backend_row` for every registered backend (``dtype`` default: the platform's)."""
    dtype = dtype or default_dtype(platform)
    return [backend_row(n, heads, topk, dtype, platform, kv_dtype) for n in backend_names()]


def _triton() -> dict[str, Any]:
    try:
        import triton
    except Exception as exc:  # a broken or missing triton is exactly what a report must show
        return {"version": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"version": getattr(triton, "__version__", "unknown"), "path": os.path.dirname(triton.__file__)}


def _device(platform: Platform) -> dict[str, Any]:
    facts = platform.facts
    cap = ".".join(map(str, facts.capability)) if facts.capability else None
    return {"vendor": facts.vendor, "name": facts.name, "compute_units": facts.compute_units,
            "compute_capability": cap, "gfx_arch": facts.gfx_arch}


def environment(version: str, heads: int = 128, topk: int = 2048, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The whole report as a JSON-ready dict; backends are checked at ``heads``/``topk``/``dtype``.

    Raises:
        ValueError: ``GRAPHATTN_PLATFORM`` names no platform.
    """
    name, why = platform_choice()
    platform = current_platform()
    dtype = dtype or default_dtype(platform)
    return {
        "graphattn": {"version": version, "path": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))},
        "python": {"version": _python_platform.python_version(), "executable": sys.executable},
        "os": _python_platform.platform(),
        "torch": torch_runtime(),
        "triton": _triton(),
        "device": _device(platform),
        "platform": {"name": name, "why": why, "triton_interpreter": platform.uses_triton_interpreter,
                     **platform.describe()},
        "backends_checked_at": {"heads": heads, "topk": topk, "dtype": str(dtype).replace("torch.", "")},
        "backends": [{k: r[k] for k in ("name", "available", "reasons")} for r in backend_rows(heads, topk, dtype, platform)],
    }


def format_environment(env: dict[str, Any]) -> str:
    """``graphattn env``'s text: one ``key: value`` line each, ready to paste into an issue."""
    t, tr, dev, plat = env["torch"], env["triton"], env["device"], env["platform"]
    arch = (f"compute capability {dev['compute_capability']}" if dev["compute_capability"]
            else f"gfx arch {dev['gfx_arch']}" if dev["gfx_arch"] else "no GPU")
    checked = env["backends_checked_at"]
    lines = [
        f"graphattn: {env['graphattn']['version']} ({env['graphattn']['path']})",
        f"python: {env['python']['version']} ({env['python']['executable']})",
        f"os: {env['os']}",
        f"torch: {t['version']} (CUDA {t['cuda'] or '-'}, ROCm {t['hip'] or '-'}, {t['gpus']} GPU(s) visible)",
        f"triton: {tr['version'] or 'not importable: ' + tr['error']}",
        f"device: {dev['name']} ({dev['vendor']}, {arch}, {dev['compute_units']} compute units)",
        f"platform: {plat['name']} ({plat['why']}); launch table {plat.get('launch_table')}; "
        f"Triton interpreter {'on' if plat['triton_interpreter'] else 'off'}",
        f"backends (checked at heads={checked['heads']} topk={checked['topk']} dtype={checked['dtype']}):",
    ]
    for row in env["backends"]:
        state = "available" if row["available"] else "unavailable: " + "; ".join(row["reasons"])
        lines.append(f"  {row['name']}: {state}")
    return "\n".join(lines)
