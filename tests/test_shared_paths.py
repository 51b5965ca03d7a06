"""Every test finds the shared data through ``tests/shared_paths.py``, honouring HYPERREG_DATA."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shared_paths

TESTS = Path(__file__).resolve().parent
# a data path built by hand: Path(...) / "shared" / "data", "../shared/data", parents[2] / ...
_HARD_CODED = re.compile(r"""["']shared["']\s*/\s*["']data["']|shared/data|parents\[2\]""")


def test_no_test_file_builds_the_data_path_itself() -> None:
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(TESTS.glob("*.py"))
        if path.name not in ("shared_paths.py", Path(__file__).name)
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if _HARD_CODED.search(line) and not line.lstrip().startswith("#")
    ]
    assert not offenders, f"use shared_paths.DATA / needs_data / data_path instead: {offenders}"


@pytest.mark.parametrize("module", ["shared_paths", "test_sources", "test_synth"])
def test_hyperreg_data_is_honoured(tmp_path: Path, module: str) -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); import {module} as m; "
        "print(getattr(m, 'SHARED', None) or m.DATA)"
    )
    env = {**os.environ, "HYPERREG_DATA": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == tmp_path


def test_missing_data_skips_with_the_path_and_the_variable(tmp_path: Path) -> None:
    marker = shared_paths.needs_data("no-such-section")
    assert marker.args[0] is True or (shared_paths.DATA / "no-such-section").exists() is False
    assert "no-such-section" in marker.kwargs["reason"]
    assert "HYPERREG_DATA" in marker.kwargs["reason"]
    with pytest.raises(pytest.skip.Exception, match="HYPERREG_DATA"):
        shared_paths.data_path("no-such-section")
