"""Project test configuration: GPU skips, sanitizer on, deterministic seeds."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

# Replays in tests always go through the capture sanitizer (production replays do not).
os.environ.setdefault("GRAPHATTN_SANITIZE", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA or HIP GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed(request):
    """A per-test seed: fresh random data per test, reproducible per test name."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
