"""Platform detection, the GRAPHATTN_PLATFORM override, and where platform checks may live."""

import pathlib
import re

import pytest
import torch

from graphattn.common import platform as plat


@pytest.fixture
def forced(monkeypatch):
    def force(name):
        monkeypatch.setenv(plat.PLATFORM_ENV, name)
        plat.reset_platform_cache()
        return plat.current_platform()

    yield force
    monkeypatch.delenv(plat.PLATFORM_ENV, raising=False)
    plat.reset_platform_cache()


def test_resolved_once(forced):
    forced("cpu")
    assert plat.current_platform() is plat.current_platform()


@pytest.mark.parametrize("name", ["cpu", "cuda", "hip"])
def test_override_gives_each_platform(forced, name):
    p = forced(name)
    assert p.name == name
    assert p.head_pad_multiple == 64
    assert p.num_compute_units() >= 1
    assert p.is_stream_capturing() is False
    info = p.describe()
    assert info["platform"] == name


def test_hip_reports_gfx_arch(forced, monkeypatch):
    monkeypatch.setenv("GRAPHATTN_HIP_ARCH", "gfx950")
    p = forced("hip")
    if not p.is_native:
        assert p.gfx_arch() == "gfx950"
    assert re.fullmatch(r"gfx\w+", p.gfx_arch())


def test_unknown_platform_is_a_clear_error(forced):
    with pytest.raises(ValueError, match=r"GRAPHATTN_PLATFORM='tpu'.*\['cpu', 'cuda', 'hip'\]"):
        forced("tpu")


def test_detection_without_override(forced, monkeypatch):
    monkeypatch.delenv(plat.PLATFORM_ENV, raising=False)
    plat.reset_platform_cache()
    expected = "cpu" if not torch.cuda.is_available() else ("hip" if torch.version.hip else "cuda")
    assert plat.current_platform().name == expected


def test_platform_checks_live_only_in_platform_modules():
    root = pathlib.Path(plat.__file__).resolve().parents[1]
    allowed = {root / "common" / "platform.py", root / "cuda" / "platform.py", root / "hip" / "platform.py"}
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p not in allowed and re.search(r"torch\.version\.hip|gcnArchName", p.read_text())
    ]
    assert not offenders, f"platform checks outside the platform modules: {offenders}"
