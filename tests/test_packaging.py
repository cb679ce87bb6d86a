"""Packaging metadata: license, type hints, URLs, and a version read from the installed metadata."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest

import graphattn

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_apache_2_spdx():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression, not a table
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # SPDX license expressions need setuptools >= 77 (PEP 639).
    requires = _pyproject()["build-system"]["requires"]
    assert any(r.replace(" ", "").startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77
               for r in requires), requires


def test_py_typed_ships_as_package_data():
    assert (Path(graphattn.__file__).parent / "py.typed").is_file()
    assert "py.typed" in _pyproject()["tool"]["setuptools"]["package-data"]["graphattn"]


def test_project_urls():
    urls = _pyproject()["project"]["urls"]
    assert {"Homepage", "Source", "Issues"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())


def test_runtime_dependencies_are_torch_triton_packaging():
    deps = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in _pyproject()["project"]["dependencies"]}
    assert deps == {"torch", "triton", "packaging"}


def test_version_comes_from_the_installed_metadata():
    try:
        installed = importlib.metadata.version("graphattn")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("graphattn is not installed here (source tree on sys.path)")
    assert graphattn.__version__ == installed == _pyproject()["project"]["version"]


def test_version_without_metadata_falls_back(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    module = importlib.reload(graphattn)
    try:
        assert module.__version__ == "0+unknown"
    finally:
        monkeypatch.undo()
        importlib.reload(graphattn)


def test_version_on_the_command_line(capsys):
    from graphattn.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"graphattn {graphattn.__version__}"
