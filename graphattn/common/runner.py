"""Deprecated re-export of :mod:`graphattn.graphs.runner`, where this module moved; it goes in the
next release."""

from ..graphs.runner import GraphRunner, default_buckets  # noqa: F401
from ._moved import warn_moved

warn_moved(__name__, "graphattn.graphs.runner")
