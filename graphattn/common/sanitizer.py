"""Deprecated re-export of :mod:`graphattn.graphs.sanitizer`, where this module moved; it goes
in the next release."""

from ..graphs.sanitizer import CaptureSanitizer, StorageTracker, collect_buffer_names, sanitize_enabled  # noqa: F401
from ._moved import warn_moved

warn_moved(__name__, "graphattn.graphs.sanitizer")
