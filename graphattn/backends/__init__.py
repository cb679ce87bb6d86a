"""Attention backends: the contract, the registry, and the built-in backends.

Built-in backend classes are imported lazily by the registry (``get_backend_class(name)``).
"""

from .base import AttentionBackend, GraphSupport, accepts_out
from .registry import (
    AUTO,
    ENTRY_POINT_GROUP,
    ENV_VAR,
    add_attn_backend_arg,
    auto_order,
    available_backends,
    backend_names,
    builtin_backends,
    default_dtype,
    get_backend_class,
    load_error,
    refusal_reasons,
    register_backend,
    resolve_backend,
    unregister_backend,
)

__all__ = [
    "accepts_out",
    "AttentionBackend",
    "GraphSupport",
    "AUTO",
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "add_attn_backend_arg",
    "auto_order",
    "available_backends",
    "backend_names",
    "builtin_backends",
    "default_dtype",
    "get_backend_class",
    "load_error",
    "refusal_reasons",
    "register_backend",
    "resolve_backend",
    "unregister_backend",
]
