"""Project test configuration: GPU skips, sanitizer on, deterministic seeds."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from graphattn.common.platform import reset_platform_cache

# Replays in tests always go through the capture sanitizer (production replays do not).
os.environ.setdefault("GRAPHATTN_SANITIZE", "1")


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    skip_two = pytest.mark.skip(reason=f"needs two CUDA or HIP GPUs (torch.cuda.device_count() is {gpus})")
    for item in items:
        if "multi_gpu" in item.keywords and gpus < 2:
            item.add_marker(skip_two)
    if gpus:
        return
    skip = pytest.mark.skip(reason="needs a CUDA or HIP GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed(request):
    """A per-test seed: fresh random data per test, reproducible per test name."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def cpu_platform(monkeypatch):
    """Pin the ``cpu`` platform (tests that build CPU tensors, even on a GPU machine)."""
    monkeypatch.setenv("GRAPHATTN_PLATFORM", "cpu")
    reset_platform_cache()
    yield
    monkeypatch.undo()
    reset_platform_cache()


@pytest.fixture(params=["cpu", "hip"])
def platform_name(request, monkeypatch, cpu_platform):
    """Run a graph test on the CPU emulator directly and under HIP's segment rules over it."""
    if request.param == "hip" and torch.cuda.is_available():
        pytest.skip("HIP over the emulator needs a GPU-less machine; test_graphs_gpu.py covers HIP")
    monkeypatch.setenv("GRAPHATTN_PLATFORM", request.param)
    reset_platform_cache()
    yield request.param
