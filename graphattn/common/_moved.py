"""The warning a deprecated re-export module gives when it is imported."""

from __future__ import annotations

import warnings


def warn_moved(old: str, new: str) -> None:
    """Warn that module ``old`` moved to ``new`` and that its re-exports go in the next release."""
    # stacklevel 3: past this function and the shim module, at the importing line.
    warnings.warn(f"{old} is deprecated; import from {new} (the re-export goes in the next release)",
                  DeprecationWarning, stacklevel=3)
