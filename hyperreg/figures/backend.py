"""The one place figures meet matplotlib: the backend and writing a figure.

:func:`pyplot` selects the non-interactive Agg backend before pyplot is imported (so figures
render on machines without a display); :func:`save_figure` writes a PNG atomically. Imports only
:mod:`hyperreg._files` from hyperreg; never torch or model code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hyperreg._files import atomic_write

__all__ = ["pyplot", "save_figure"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the Agg backend (imported lazily: matplotlib is slow to load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Save ``fig`` as PNG through a temporary name and a rename, then close it.

    zlib level 3 instead of Pillow's 6: the same pixels, files about 5 % larger, encoded about
    2.5 times faster (the sweep's montage and alignment figures, measured).
    """
    png = {"compress_level": 3}
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, pil_kwargs=png))
    finally:
        pyplot().close(fig)
