"""Where the real-data tests find the shared data and bad-input cases: the one place that says so.

``HYPERREG_DATA`` points at a data folder laid out as ``shared/data`` (``neurite-oasis/``,
``mindboggle-trt20-2d/``, ...), ``HYPERREG_CASES`` at the bad-input cases; by default both are
looked for beside the repository, in ``../shared/data`` and ``../shared/cases``. Tests that need
them skip, naming the path they looked at and the variable to set, where they are absent: use
:func:`needs_data` (a ``skipif`` marker) or :func:`data_path` (inside a test). No test file may
build the data path itself (``tests/test_shared_paths.py`` checks that).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HYPERREG_DATA") or REPO.parent / "shared" / "data")
CASES = Path(os.environ.get("HYPERREG_CASES") or REPO.parent / "shared" / "cases")
OASIS = DATA / "neurite-oasis"


def _reason(path: Path) -> str:
    where = os.environ.get("HYPERREG_DATA")
    how = f"HYPERREG_DATA={where}" if where else "HYPERREG_DATA unset: default ../shared/data"
    return f"shared real data not found at {path} ({how}; point HYPERREG_DATA at the data folder)"


def needs_data(*parts: str) -> pytest.MarkDecorator:
    """``skipif`` marker: skip unless ``DATA / parts...`` exists, with a reason naming the path.

    Example: ``@needs_data("mindboggle-trt20-2d")`` on a test that reads that section.
    """
    path = DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=_reason(path))


def data_path(*parts: str) -> Path:
    """``DATA / parts...``, or skip the calling test (with the path and variable) if absent."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(_reason(path))
    return path
