"""A fresh clone without the shared data: its skips are summed up in one line, still skips."""

from __future__ import annotations

import os
import subprocess
import sys
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

MODULE = """
import pytest
from shared_paths import data_path, needs_data

@needs_data("neurite-oasis")
def test_reads_oasis():
    pass

@pytest.mark.parametrize("section", ["a", "b", "c"])
def test_reads_a_section(section):
    data_path(section)

def test_other_skip():
    pytest.skip("needs CUDA")

def test_passes():
    pass
"""


def test_data_skips_are_one_line_and_still_skips(tmp_path: Path) -> None:
    (tmp_path / "test_module.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.update(HYPERREG_DATA=str(tmp_path / "no-data"), HYPERREG_CASES=str(tmp_path / "no-cases"))
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider"]
    command += ["-p", "no:xdist", "-rfE", "test_module.py"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "1 passed, 5 skipped" in out  # skips, never passes
    assert "SKIPPED [" not in out
    lines = [line for line in out.splitlines() if "no-data" in line]
    assert len(lines) == 1 and lines[0].startswith("4 test(s) read brain MRI scans")
    assert "HYPERREG_DATA" in lines[0] and "HYPERREG_CASES" in lines[0]
    assert "1 test(s): needs CUDA" in out


def test_the_default_options_list_failures_not_each_skip() -> None:
    text = (TESTS.parent / "pyproject.toml").read_text()  # tomllib is Python 3.11+
    addopts = re.search(r"^addopts = (.*)$", text, re.MULTILINE).group(1).strip('"').split()
    report = [a for a in addopts if a.startswith("-r")]
    assert report and all("s" not in a[2:] and "a" not in a[2:] for a in report)
