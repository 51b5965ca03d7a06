"""Where the real-data tests find the shared data and bad-input cases.

``HYPERREG_DATA`` points at a data folder laid out as ``shared/data`` (``neurite-oasis/``,
``mindboggle-trt20-2d/``, ...), ``HYPERREG_CASES`` at the bad-input cases; by default both are
looked for beside the repository, in ``../shared/data`` and ``../shared/cases``. Tests that need
them skip, naming the path they looked at, where they are absent.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HYPERREG_DATA") or REPO.parent / "shared" / "data")
CASES = Path(os.environ.get("HYPERREG_CASES") or REPO.parent / "shared" / "cases")
OASIS = DATA / "neurite-oasis"
