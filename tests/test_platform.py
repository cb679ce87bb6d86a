"""Platform detection, the GRAPHATTN_PLATFORM override, and where platform checks may live."""

import pathlib
import re
from types import SimpleNamespace

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


def _fake_nvidia(monkeypatch, capability, calls=None):
    """Make torch report an NVIDIA GPU of ``capability`` (no real device is touched)."""
    def available():
        if calls is not None:
            calls.append("is_available")
        return True

    monkeypatch.setattr(torch.cuda, "is_available", available)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: SimpleNamespace(name="fake NVIDIA GPU", multi_processor_count=108))


SHAPES = [(rows, heads, topk)
          for rows in (1, 2, 8, 64, 512) for heads in (16, 64, 128) for topk in (2048, 8192)]


def test_hip_rules_on_sm80_keep_sm80_launch_settings(forced, monkeypatch):
    """Graph rules and launch table are chosen independently: HIP rules forced on an sm_80 GPU
    get NVIDIA's table at capability (8, 0), which never picks the sm_90-only wgmma kernel."""
    _fake_nvidia(monkeypatch, (8, 0))
    p = forced("hip")
    assert p.name == "hip" and p.has_gpu and not p.is_native
    assert p.launch_table.name == "nvidia" and p.launch_table.capability == (8, 0), p.launch_table
    for rows, heads, topk in SHAPES:
        cfg = p.kernel_config("flashmla", rows=rows, heads=heads, topk=topk)
        where = f"[hip rules on sm_80 rows={rows} heads={heads} topk={topk}]"
        assert "kernel" not in cfg, f"{where} {cfg}"  # no Gluon kernel


def test_hip_rules_on_sm90_may_pick_wgmma(forced, monkeypatch):
    """The same check on sm_90 does pick wgmma, so the sm_80 test above is not vacuous."""
    from graphattn.cuda import configs

    if not configs.gluon_available():
        pytest.skip("this triton has no Gluon Hopper dialect")
    _fake_nvidia(monkeypatch, (9, 0))
    p = forced("hip")
    kernels = {p.kernel_config("flashmla", rows=r, heads=h, topk=t).get("kernel") for r, h, t in SHAPES}
    assert kernels & {"wgmma_ws", "wgmma_rr"}, kernels


@pytest.mark.parametrize("name", ["cuda", "hip"])
def test_device_facts_are_asked_once_per_platform(forced, monkeypatch, name):
    calls = []
    _fake_nvidia(monkeypatch, (8, 0), calls)
    p = forced(name)
    for _ in range(3):
        assert p.device.type == "cuda" and p.has_gpu and not p.uses_triton_interpreter
        assert p.num_compute_units() == 108
    assert calls == ["is_available"], calls
    assert plat.current_platform() is p
    plat.reset_platform_cache()
    assert plat.current_platform() is not p  # a fresh platform asks again


def test_launch_table_follows_hardware_not_rules(forced):
    """Without a GPU every set of graph rules runs the interpreter's table."""
    for name in ("cpu", "cuda", "hip"):
        assert forced(name).launch_table.name == "interpreter"


def test_launch_table_override_is_temporary(forced):
    table = forced("cpu").launch_table
    base = table.kernel_config("mega")
    with table.override("mega", num_warps=8):
        assert table.kernel_config("mega")["num_warps"] == 8
    assert table.kernel_config("mega") == base
