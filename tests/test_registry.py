"""The backend registry: names, lazy import, entry points, --attn-backend, resolve/auto."""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint

import pytest
import torch

from graphattn.backends import (
    AttentionBackend,
    add_attn_backend_arg,
    available_backends,
    backend_names,
    builtin_backends,
    get_backend_class,
    register_backend,
    resolve_backend,
    unregister_backend,
)
from graphattn.backends import registry
from graphattn.backends.torch_ref import TorchBackend
from graphattn.common.platform import CpuPlatform


class ToyBackend(TorchBackend):
    name = "toy"


class GpuLikePlatform(CpuPlatform):
    """A CPU platform that claims compiled Triton, to test the GPU branch of ``auto``."""

    name = "cuda"

    @property
    def uses_triton_interpreter(self) -> bool:
        return False


@pytest.fixture
def toy_registered():
    register_backend("toy", ToyBackend)
    yield
    unregister_backend("toy")


def test_builtin_names():
    assert builtin_backends() == ["dispatch", "flashmla", "trtllm", "flashmla_mega", "torch"]
    for name in builtin_backends():
        assert get_backend_class(name).name == name


def test_unknown_name_lists_valid_options():
    with pytest.raises(ValueError) as err:
        get_backend_class("flashinfer")
    msg = str(err.value)
    assert msg.startswith("Unknown attention backend: 'flashinfer'. Valid options are: auto, ")
    for name in builtin_backends():
        assert name in msg


def test_register_class_and_string(toy_registered):
    assert get_backend_class("toy") is ToyBackend
    with pytest.raises(ValueError, match="already registered"):
        register_backend("toy", ToyBackend)
    register_backend("toy", f"{__name__}:ToyBackend", override=True)
    assert get_backend_class("toy") is ToyBackend
    register_backend("toy", f"{__name__}.ToyBackend", override=True)
    assert get_backend_class("toy") is ToyBackend


def test_register_rejects_auto_and_non_backends():
    with pytest.raises(ValueError, match="reserved"):
        register_backend("auto", ToyBackend)
    register_backend("not_a_backend", "argparse:ArgumentParser")
    try:
        with pytest.raises(TypeError, match="subclass of graphattn.backends.AttentionBackend"):
            get_backend_class("not_a_backend")
    finally:
        unregister_backend("not_a_backend")


def test_class_path_without_registration():
    assert get_backend_class(f"{__name__}:ToyBackend") is ToyBackend


def test_entry_point_group(monkeypatch):
    ep = EntryPoint(name="toy_ep", value=f"{__name__}:ToyBackend", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else [])
    assert "toy_ep" in backend_names()
    assert get_backend_class("toy_ep") is ToyBackend


def test_attn_backend_arg(monkeypatch):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    parser = argparse.ArgumentParser()
    add_attn_backend_arg(parser)
    assert parser.parse_args([]).attn_backend == "auto"
    assert parser.parse_args(["--attn-backend", "trtllm"]).attn_backend == "trtllm"
    with pytest.raises(SystemExit):
        parser.parse_args(["--attn-backend", "nope"])


def test_attn_backend_arg_env_default(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "torch")
    parser = argparse.ArgumentParser()
    add_attn_backend_arg(parser)
    assert parser.parse_args([]).attn_backend == "torch"


def test_explicit_choice_never_falls_back():
    # float32 is refused by the Triton backends: an explicit choice says why, it does not switch.
    with pytest.raises(ValueError) as err:
        resolve_backend("flashmla", 16, torch.float32, 64)
    assert "flashmla" in str(err.value) and "dtype float32 not in supported" in str(err.value)
    assert resolve_backend("torch", 16, torch.float32, 64) is TorchBackend


def test_auto_chooses_per_platform():
    gpu = GpuLikePlatform()
    # On a GPU: dispatch, which picks the kernel path per row count (tests/test_dispatch.py).
    assert resolve_backend("auto", 16, torch.bfloat16, 2048, platform=gpu).name == "dispatch"
    assert resolve_backend("auto", 128, torch.bfloat16, 2048, platform=gpu).name == "dispatch"
    # Only the torch backend takes float32: auto falls back to it.
    assert resolve_backend(None, 16, torch.float32, 64, platform=gpu) is TorchBackend
    # Without a GPU the Triton kernels only run in the interpreter: auto prefers torch.
    assert resolve_backend("auto", 16, torch.float16, 64, platform=CpuPlatform()) is TorchBackend


def test_auto_with_nothing_runnable_lists_reasons():
    with pytest.raises(RuntimeError, match="no attention backend can run"):
        resolve_backend("auto", 16, torch.int8, 64)


def test_refusal_reasons_are_listed():
    reasons = get_backend_class("trtllm").refusal_reasons(0, torch.float32, 0)
    assert len(reasons) == 3, reasons
    assert available_backends(16, torch.float16, 64) == builtin_backends()


def test_abstract_backend_is_not_runnable():
    class NoForward(AttentionBackend):
        name = "no_forward"

    backend = NoForward(4, 8, torch.float16)
    with pytest.raises(NotImplementedError):
        backend.forward(torch.zeros(1, 4, 576, dtype=torch.float16), torch.zeros(8, 576), backend.make_metadata(1))
