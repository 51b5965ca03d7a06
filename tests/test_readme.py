"""The README's examples run as written.

Every ```python block of README.md is executed in a fresh interpreter, in a folder where the
Quick start's first command has left its outputs (``hyperreg demo``: the bundled model
registers a template pair, whose files the example reads).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hyperreg.apps.demo import run_demo

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_examples() -> None:
    assert _blocks("python"), "README.md has no ```python block to check"


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_readme_python_block_runs(index: int, tmp_path: Path) -> None:
    run_demo(tmp_path / "hyperreg-demo", device="cpu", eval_pairs=1, progress=False)
    code = _blocks("python")[index]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"README python block {index} failed:\n{code}\n{done.stderr}"
    outputs = [n for n in re.findall(r'"([\w/.-]+\.nii\.gz)"', code) if "hyperreg-demo" not in n]
    missing = [n for n in outputs if not (tmp_path / n).is_file()]
    assert not missing, f"README python block {index} did not write {missing}"
