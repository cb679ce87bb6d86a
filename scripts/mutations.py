"""Mutation check for the graph-safety rules: break each rule on purpose, see which test fails.

Usage: python scripts/mutations.py   (from the repository root; takes about a minute)

Each mutation is applied to a temporary copy of the package; the core tests run against it and
the failing tests are listed. A mutation that no test catches is reported as SURVIVED and makes
the script exit 1.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ["tests/test_buffers.py", "tests/test_metadata.py"]

# (rule broken, file, exact text, replacement)
MUTATIONS = [
    ("rebind on growth after capture (raise policy ignored)", "graphattn/common/buffers.py",
     "        if self._captured:\n            raise CapturedBufferGrowthError(self.name, self.capacity, rows)\n",
     ""),
    ("refresh_ drops the capture mark", "graphattn/common/metadata.py",
     "        self.num_rows = n\n",
     "        self.num_rows = n\n        self._captured = False\n"
     "        for b in self.buffers():\n            b._captured = False\n"),
    ("refresh_ replaces the index tensor", "graphattn/common/metadata.py",
     "        table = self.indices.view(rows)\n",
     "        self.indices._data = self.indices._data.clone()\n        table = self.indices.view(rows)\n"),
    ("oversized eager call gets the captured buffer", "graphattn/common/buffers.py",
     "            elif self.policy is OverflowPolicy.TEMPORARY:\n                return self._allocate(rows)\n",
     "            elif self.policy is OverflowPolicy.TEMPORARY:\n                return self._data\n"),
    ("oversized step gets captured storage, not a temporary", "graphattn/common/buffers.py",
     "            raise CaptureCapacityError(self.name, self.capacity, rows)\n        return self._allocate(rows)\n",
     "            raise CaptureCapacityError(self.name, self.capacity, rows)\n        return self._data\n"),
    ("overflow allowed during capture", "graphattn/common/buffers.py",
     "            if capturing:\n                raise CaptureCapacityError(self.name, self.capacity, rows)\n"
     "            if not self._captured:",
     "            if not self._captured:"),
    ("view zero-fills on every call", "graphattn/common/buffers.py",
     "        return self._data[:rows]\n",
     "        self._data.fill_(self.fill)\n        return self._data[:rows]\n"),
    ("q-pad replaced per call (copy instead of slice)", "graphattn/common/buffers.py",
     "        return self._data[:rows]\n",
     "        return self._data[:rows].clone()\n"),
    ("padding rows not made inert in refresh_", "graphattn/common/metadata.py",
     "                table[n:min(rows, dirty)].fill_(-1)\n", "                pass\n"),
]


def run_mutation(rel: str, old: str, new: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        shutil.copytree(ROOT / "graphattn", work / "graphattn")
        shutil.copytree(ROOT / "tests", work / "tests")
        target = work / rel
        text = target.read_text()
        assert text.count(old) == 1, f"mutation anchor not found exactly once in {rel}: {old!r}"
        target.write_text(text.replace(old, new))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *TESTS],
            cwd=work, capture_output=True, text=True,
            env={**__import__("os").environ, "PYTHONPATH": str(work)},
        )
        return sorted(set(re.findall(r"^FAILED (\S+?)(?: - |$)", proc.stdout, re.M)))


def main() -> int:
    survived = 0
    for rule, rel, old, new in MUTATIONS:
        failed = run_mutation(rel, old, new)
        survived += not failed
        print(f"- {rule}: " + (", ".join(f.split("::")[-1] for f in failed) or "SURVIVED"))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
