"""Deprecated re-export of :mod:`graphattn.graphs.breakable` and :mod:`graphattn.graphs.segments`,
where this module moved; it goes in the next release."""

from ..graphs.breakable import BreakableGraph, eager_on_graph  # noqa: F401
from ..graphs.segments import StreamGraphSegment  # noqa: F401
from ._moved import warn_moved

warn_moved(__name__, "graphattn.graphs")
