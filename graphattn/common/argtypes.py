"""argparse ``type=`` functions of graphattn's command lines: checked numbers and paths.

Each raises ``argparse.ArgumentTypeError`` with what was expected and what came; argparse puts
the option's name in front (``argument --iters: expected an integer >= 1, got '0'``), so a bad
value is refused at startup instead of being replaced by a default or failing after a long run.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import NoReturn


# Seeds get small offsets added (one generator per batch size); torch takes 64-bit seeds.
MAX_SEED = 2**62


def _int(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts and sizes: heads, top-k, layers, iterations)."""
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (warm-up steps)."""
    return _int(text, 0)


def seed(text: str) -> int:
    """An RNG seed: an integer in ``[0, 2**62]``."""
    return _int(text, 0, MAX_SEED)


def positive_float(text: str) -> float:
    """A finite number > 0 (rates such as bytes/s)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """Distinct comma-separated integers >= 1, e.g. ``1,2,4,8`` (kept in the given order)."""
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct values, got {text!r}")
    return values


def choice_list(choices: tuple[str, ...]):
    """A ``type=`` for a non-empty comma-separated subset of ``choices`` (a tuple, in the given order)."""

    def parse(text: str) -> tuple[str, ...]:
        picked = tuple(m.strip() for m in text.split(",") if m.strip())
        if not picked or any(m not in choices for m in picked):
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated subset of {','.join(choices)}, got {text!r}")
        return tuple(dict.fromkeys(picked))

    return parse


def _first_existing(path: str) -> str:
    """``path`` or its nearest ancestor that exists (``/`` at worst)."""
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _check_anchor(path: str, text: str) -> None:
    """Refuse ``path`` (a folder to make, from the argument ``text``) unless its nearest existing
    ancestor is a writable folder."""
    anchor = _first_existing(path)
    if not os.path.isdir(anchor):
        raise argparse.ArgumentTypeError(f"{anchor!r} in {text!r} is not a folder; pick another path")
    if not os.access(anchor, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {anchor!r} of {text!r} is not writable")


def _check_writable_file(text: str) -> str:
    """Refuse an empty path, a folder, and an existing file that cannot be written."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file path, got {text!r}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; expected a file path inside it")
    if os.path.lexists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not writable")
    return os.path.abspath(text)


def file_path(text: str) -> str:
    """A file path to write whose missing folders the writer creates: not empty, not a folder,
    and its nearest existing ancestor is a writable folder (``/etc/passwd/x.xml`` is refused:
    ``/etc/passwd`` is a file, no folder can be made under it).

    Checked when the command line is parsed, so a long run cannot end in a failed write.
    """
    _check_anchor(os.path.dirname(_check_writable_file(text)), text)
    return text


def new_file(text: str) -> str:
    """A file path to write: its folder must exist and be writable, and it must not be empty or
    a folder.

    Checked when the command line is parsed, so a long run cannot end in a failed write.
    """
    folder = os.path.dirname(_check_writable_file(text))
    if not os.path.isdir(folder):
        anchor = _first_existing(folder)
        if os.path.lexists(anchor) and not os.path.isdir(anchor):
            raise argparse.ArgumentTypeError(f"{anchor!r} in {text!r} is not a folder; pick another path")
        raise argparse.ArgumentTypeError(
            f"folder {folder!r} of {text!r} does not exist; create it first or pick another path")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {folder!r} of {text!r} is not writable")
    return text


def folder_path(text: str) -> str:
    """A folder to write files into, made if missing: not empty, not a file, and its nearest
    existing ancestor is a writable folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a folder path, got {text!r}")
    _check_anchor(os.path.abspath(text), text)
    return text


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``prog: error: message``), exit code 2 (the
    command line's and the benchmark modules')."""

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: message`` (one line) and exit with code 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")
