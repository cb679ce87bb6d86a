"""The attention-backend conformance suite, usable on any registered backend.

* As a pytest plugin (installed through the ``pytest11`` entry point)::

      pytest --pyargs graphattn.testing --attn-backend NAME

  or ``graphattn check --attn-backend NAME [--junitxml PATH]``.
* As functions: :func:`check_case` runs one backend x batch spec x mode against the float64
  reference and raises on any failure (wrong output, freed captured buffer, corrupted victim,
  dirty counter, moved buffer).

Imports here are lazy so that loading the plugin in every pytest run stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_case", "skip_reason", "BatchSpec", "SuiteShape", "SHAPES", "SMALL", "REAL", "MODES"]


def __getattr__(name: str) -> Any:
    if name in ("check_case", "skip_reason"):
        from . import checks

        return getattr(checks, name)
    if name in ("BatchSpec", "SuiteShape", "SHAPES", "SMALL", "REAL", "MODES"):
        from . import specs

        return getattr(specs, name)
    raise AttributeError(f"module 'graphattn.testing' has no attribute {name!r}")
