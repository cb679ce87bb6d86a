"""Where graphattn's kernels get Triton: imported and decorated in the mode this machine needs.

Triton chooses between compiling and interpreting (``TRITON_INTERPRET``) twice: when
``triton.language`` is first imported (its own ``@jit`` helpers, ``tl.cdiv`` and the like) and
when ``@triton.jit`` decorates a kernel. Without a GPU both must happen in interpreter mode, so
Triton is first imported (``graphattn.common.platform.import_triton``) and :func:`jit`
decorates inside :func:`~graphattn.common.platform.triton_interpreter_env`: the variable is set
for those moments only and never left in the process environment, where it would change
unrelated code (another project's tests, ``torch.compile``).
"""

from __future__ import annotations

from typing import Any, Callable

from ..common.platform import INTERPRET_ENV, triton_interpreter_env

with triton_interpreter_env():  # graphattn.common already did unless it was imported before
    import triton
    import triton.language as tl
    # Programmatic dependent launch (sm_90+): called only under a constexpr the NVIDIA launch
    # table sets, so other targets and the interpreter never trace them.
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

__all__ = ["gdc_launch_dependents", "gdc_wait", "jit", "tl", "triton"]


def jit(fn: Callable[..., Any]) -> Any:
    """``triton.jit``, interpreted where no GPU can compile the kernel (see the module doc)."""
    with triton_interpreter_env():
        return triton.jit(fn)


def _probe() -> None:
    """A kernel body that is never launched: decorated only to see which mode :func:`jit` gives."""


def check_language_mode() -> None:
    """Raise when Triton's own helpers and graphattn's kernels would be in different modes.

    That happens when something imported triton earlier with another ``TRITON_INTERPRET``
    (``torch.compile`` imports it): compiled ``tl.*`` helpers cannot run in the interpreter.
    Saying so here beats an interpreter error deep inside the first launch.
    """
    helper = getattr(getattr(tl, "standard", None), "cdiv", None)
    kernel_kind = type(jit(_probe))
    if helper is not None and not isinstance(helper, kernel_kind):
        raise RuntimeError(
            f"graphattn's kernels are {kernel_kind.__name__}s here, but triton was imported "
            f"earlier with a different {INTERPRET_ENV} and its language helpers are "
            f"{type(helper).__name__}s; the two cannot call each other. Without a GPU, set "
            f"{INTERPRET_ENV}=1 in the environment, or import graphattn's kernels "
            "(graphattn.kernels.register_ops()) before anything imports triton (torch.compile does)."
        )


check_language_mode()
