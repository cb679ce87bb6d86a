"""The README's commands and examples, run as written.

Blocks are tagged with HTML comments just above them: ``readme-test: exec`` (Python, run in one
namespace, in order), ``readme-test: file NAME`` (written to NAME), ``readme-test: shell``
(run with bash). All run in a temporary directory that is also on ``sys.path``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"<!-- readme-test: (?P<tag>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)


def test_readme_starts_with_the_two_commands():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert blocks[0].strip() == 'pip install torch==2.13.0 && pip install -e ".[test]" && graphattn bench'
    assert blocks[1].strip() == "python -m pytest -q"
    # .ci/run must run the README's test command verbatim.
    assert "\npython -m pytest -q\n" in (ROOT / ".ci" / "run").read_text()
    assert README.index(blocks[0]) < README.index("## ")  # before any section


def test_readme_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("GRAPHATTN_ATTN_BACKEND", raising=False)
    namespace: dict = {"__name__": "readme"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    tags = []
    try:
        for m in BLOCK.finditer(README):
            tag, body = m.group("tag"), m.group("body")
            tags.append(tag.split()[0])
            if tag == "exec":
                exec(compile(body, "README.md", "exec"), namespace)
            elif tag.startswith("file "):
                (tmp_path / tag.split()[1]).write_text(body)
            elif tag == "shell":
                proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], env=env,
                                      capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, f"README shell block failed:\n{body}\n{proc.stdout}\n{proc.stderr}"
    finally:
        from graphattn.backends import unregister_backend

        unregister_backend("toy")
        sys.modules.pop("my_attn", None)
    assert tags == ["exec", "exec", "exec", "file", "shell", "exec"]
    assert namespace["y"].shape == (8, 64)  # the tensor-parallel example's last step
    assert namespace["out"].shape == (40, 16, 512) and namespace["lse"].shape == (40, 16)
    # The FP8 cache example: the last step's output, and the tokens it wrote.
    from graphattn.common.kv_layout import dequantize_kv, quantize_kv

    assert namespace["out8"].shape == (1, 16, 512) and namespace["lse8"].shape == (1, 16)
    cache, slots, kv_new = namespace["kv_cache"], namespace["slots"], namespace["kv_new"]
    assert torch.equal(cache[slots], quantize_kv(kv_new)), "write_kv_fp8_ wrote other bytes"
    assert dequantize_kv(cache).shape == (1024, 576)
