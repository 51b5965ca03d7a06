"""Declared dependency floors are ones that work, CI tests the nibabel floor, and the bundled
models are package data."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

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


def test_package_data_ships_every_bundled_model_file() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = config["tool"]["setuptools"]["package-data"]
    folder = REPO / "hyperreg" / "pretrained"
    assert (folder / "__init__.py").is_file()  # a package, so its files go with it
    files = [p.name for p in folder.iterdir() if p.is_file() and p.suffix != ".py"]
    assert {"index.json", "hypermorph-2d.pt", "hypermorph-2d.md"} <= set(files)
    missing = [f for f in files if not any(fnmatch(f, g) for g in data["hyperreg.pretrained"])]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
