"""Declared dependency floors are ones that work, and CI tests the nibabel floor."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _floor(name: str) -> tuple[int, ...]:
    text = (REPO / "pyproject.toml").read_text()
    match = re.search(rf'"{name}>=([0-9.]+)"', text)
    assert match, f"no '{name}>=' floor in pyproject.toml"
    return tuple(int(part) for part in match.group(1).split("."))


def test_nibabel_floor_imports_with_numpy_2_and_ci_tests_it() -> None:
    # nibabel 5.0 and 5.1 use np.sctypes, removed in numpy 2.0: "import nibabel" fails there
    floor = _floor("nibabel")
    assert floor >= (5, 2)
    ci = (REPO / ".ci" / "run").read_text()
    pinned = re.search(r'"nibabel==([0-9.]+)"', ci)
    assert pinned, ".ci/run must install the nibabel floor"
    assert tuple(int(p) for p in pinned.group(1).split("."))[: len(floor)] == floor
