"""A backend that kills its process on one head count: the fuzz runner's isolation test uses it
(loaded by import path in a worker process, as ``crashing_backend:CrashingBackend``)."""

from __future__ import annotations

import os

from graphattn.backends.torch_ref import TorchBackend

CRASH_HEADS = 7


class CrashingBackend(TorchBackend):
    """The torch backend, except that ``forward`` with 7 heads ends the process at once, the
    way a lost device context or a segfault in a kernel launch would."""

    name = "crashing"

    def forward(self, q, kv, metadata):
        if self.num_heads == CRASH_HEADS:
            os._exit(9)
        return super().forward(q, kv, metadata)
