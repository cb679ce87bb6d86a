"""Deprecated re-export of :mod:`graphattn.graphs.emulated`, where this module moved; it goes in the
next release."""

from ..graphs.emulated import EmulatedGraphSegment, EmulatedPool  # noqa: F401
from ._moved import warn_moved

warn_moved(__name__, "graphattn.graphs.emulated")
