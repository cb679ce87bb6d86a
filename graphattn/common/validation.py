"""Argument checks every layer shares: each failure says what was expected, what came, the fix.

Kept apart from the hot paths: ``forward`` only compares Python attributes; these helpers run
at construction, in ``plan()`` (host side) and where an environment switch is read.
"""

from __future__ import annotations

import math
import numbers
import os

import torch

CHECK_INDICES_ENV = "GRAPHATTN_CHECK_INDICES"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def env_flag(name: str, default: bool = False) -> bool:
    """The boolean environment switch ``name`` (unset or empty: ``default``).

    Raises:
        ValueError: a value that is neither on (1/true/yes/on) nor off (0/false/no/off), so a
            typo never silently leaves a debug switch off.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"environment variable {name}={raw!r} is not a switch: expected one of "
        f"{list(_TRUE)} (on) or {list(_FALSE[1:])} (off); fix or unset it"
    )


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """The environment variable ``name`` as one of ``choices`` (unset or empty: ``default``).

    Raises:
        ValueError: any other value (the message lists the choices).
    """
    raw = os.environ.get(name, "")
    value = raw.strip().lower() or default
    if value not in choices:
        raise ValueError(
            f"environment variable {name}={raw!r} is not one of {list(choices)}; fix or unset it"
        )
    return value


def _read_check_indices() -> bool | ValueError:
    try:
        return env_flag(CHECK_INDICES_ENV)
    except ValueError as exc:
        return exc


# Read once at import (a debug switch, like GRAPHATTN_LAUNCHER); a bad value is raised where the
# switch is used (plan), not at import, so `import graphattn` and `graphattn env` still work.
_CHECK_INDICES = _read_check_indices()


def check_indices_default() -> bool:
    """Whether ``plan()`` validates index ranges when not told: ``GRAPHATTN_CHECK_INDICES``
    as read at import. Raises the ``ValueError`` of a bad value."""
    if isinstance(_CHECK_INDICES, ValueError):
        raise ValueError(str(_CHECK_INDICES))
    return _CHECK_INDICES


def is_int(value: object) -> bool:
    """True for an integer that is not a bool (``True`` as a row count is a bug, not 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(who: str, name: str, value: object, minimum: int) -> int:
    """``value`` as an int ``>= minimum``.

    Raises:
        TypeError: not an integer (floats and bools included).
        ValueError: below ``minimum``.
    """
    if not is_int(value):
        raise TypeError(f"{who}: {name} must be an int >= {minimum}, got {value!r} "
                        f"({type(value).__name__}); pass an int")
    if value < minimum:
        raise ValueError(f"{who}: {name} must be >= {minimum}, got {value}")
    return int(value)


def check_sm_scale(who: str, sm_scale: object) -> float:
    """A softmax scale: a finite real number > 0.

    Raises:
        TypeError: not a real number (a tensor or string).
        ValueError: NaN, infinite, zero or negative (NaN would make every output NaN; <= 0
            inverts or flattens attention).
    """
    if not isinstance(sm_scale, numbers.Real) or isinstance(sm_scale, bool):
        raise TypeError(f"{who}: sm_scale must be a float, got {sm_scale!r} ({type(sm_scale).__name__}); "
                        "pass a Python float (or None for d_qk ** -0.5)")
    value = float(sm_scale)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{who}: sm_scale must be a finite float > 0, got {value}; "
                         "pass None for the default d_qk ** -0.5")
    return value


def check_index_range(who: str, indices: torch.Tensor, pool_tokens: int | None) -> None:
    """Raise ``IndexError`` naming the first row and value of ``indices [rows, topk]`` that is
    below -1 or (with ``pool_tokens``) at or past the pool. Host side: it synchronises."""
    bad = indices < -1
    if pool_tokens is not None:
        bad |= indices >= pool_tokens
    flat = bad.flatten().nonzero()
    if flat.numel() == 0:
        return
    pos = int(flat[0, 0])
    row, col = divmod(pos, indices.shape[1])
    value = int(indices[row, col])
    pool = f"[0, {pool_tokens})" if pool_tokens is not None else "[0, pool_tokens)"
    raise IndexError(
        f"{who}: indices row {row} (column {col}) holds {value}, outside {pool} and not -1 "
        f"({int(bad.sum())} bad entries in all). Out-of-range indices are skipped by contract, so "
        f"this is an engine bug: fix the index producer (-1 marks a skipped slot)"
    )
