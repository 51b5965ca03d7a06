"""Figure set-up shared by the applications (sweep, tune, demo): one place for matplotlib.

:func:`pyplot` selects the non-interactive Agg backend before pyplot is imported (so figures
render on machines without a display); :func:`save_figure` writes a PNG atomically;
:func:`show_slice` and :func:`middle_slice` draw images the same way in every figure;
:func:`plot_lambda_curves` draws Dice and folding against λ. Must not import torch or model code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hyperreg._files import atomic_write

__all__ = ["middle_slice", "plot_lambda_curves", "pyplot", "save_figure", "show_slice"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the Agg backend (imported lazily: matplotlib is slow to load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Save ``fig`` as PNG through a temporary name and a rename, then close it."""
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi))
    finally:
        pyplot().close(fig)


def middle_slice(image: np.ndarray) -> np.ndarray:
    """2D view of an image: itself, or the middle slice along the last axis for 3D."""
    return image if image.ndim == 2 else image[..., image.shape[-1] // 2]


def show_slice(ax: Any, image: np.ndarray, title: str, **kw: Any) -> Any:
    """Draw the 2D view of ``image`` on ``ax`` (array axis 0 to the right, axis 1 upwards).

    Returns the ``AxesImage`` (for a colour bar).
    """
    shown = ax.imshow(np.rot90(middle_slice(image)), **kw)
    ax.set_title(title, fontsize=8)
    ax.axis("off")
    return shown


def plot_lambda_curves(
    ax: Any,
    lams: Sequence[float],
    dice: Sequence[float] | None,
    folding: Sequence[float],
    *,
    baseline: float | None = None,
    star: float | None = None,
    max_folding: float | None = None,
) -> None:
    """Mean Dice (left axis) and folding % (right axis, red) against λ on ``ax``.

    Args:
        ax: A matplotlib Axes.
        lams: λ values (any order; plotted sorted).
        dice: Mean Dice per λ, or None to plot folding only.
        folding: Percent of voxels with J ≤ 0 per λ.
        baseline: Mean Dice without registration (dashed grey line), or None.
        star: λ* to mark (dotted green line), or None.
        max_folding: Folding limit in percent (dotted red line), or None.
    """
    order = np.argsort(lams)
    lam_sorted = np.asarray(lams)[order]
    if dice is not None:
        ax.plot(lam_sorted, np.asarray(dice)[order], "o-", ms=3, label="mean Dice")
        if baseline is not None:
            ax.axhline(baseline, color="gray", ls="--", label="no registration")
        ax.set_ylabel("mean Dice")
    if star is not None:
        ax.axvline(star, color="tab:green", ls=":", label=f"λ* = {star:.3g}")
    ax.set_xlabel("λ")
    twin = ax.twinx()
    twin.plot(lam_sorted, np.asarray(folding)[order], "s-", ms=3, color="tab:red", label="folding")
    if max_folding is not None:
        twin.axhline(max_folding, color="tab:red", ls=":", lw=0.8)
    twin.set_ylabel("% voxels with J ≤ 0", color="tab:red")
    handles = ax.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="best")
