"""Curves against λ: mean Dice and folding on one pair of axes (sweep, tune).

Numpy only; the caller makes the figure (:func:`hyperreg.figures.backend.pyplot`). Never torch
or model code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["plot_lambda_curves"]


def plot_lambda_curves(
    ax: Any,
    lams: Sequence[float],
    dice: Sequence[float] | None,
    folding: Sequence[float],
    *,
    baseline: float | None = None,
    baseline_label: str | None = None,
    dice_before: float | None = None,
    dice_affine: float | None = None,
    star: float | None = None,
    star_label: str | None = None,
    star_range: tuple[float, float] | None = None,
    star_range_label: str = "within noise of best",
    max_folding: float | None = None,
) -> None:
    """Mean Dice (left axis) and folding % (right axis, red) against λ on ``ax``.

    The legend goes below the axes, where it covers no curve; leave room for it (for example
    with ``layout="constrained"``).

    Args:
        ax: A matplotlib Axes.
        lams: λ values (any order; plotted sorted).
        dice: Mean Dice per λ, or None to plot folding only.
        folding: Percent of voxels with J ≤ 0 per λ.
        baseline: A mean Dice to compare with (dashed grey line), or None. Kept for callers
            that pass one number: its legend is ``baseline_label``, by default "Dice before the
            deformable stage (after the affine, if any)", true both for the affine-alone Dice
            and, without an affine stage, for the unregistered one. Prefer the two below.
        baseline_label: Legend text for ``baseline``.
        dice_before: Mean Dice of the inputs as given, resampled onto the fixed grid, no
            registration (dashed grey line "no registration"), or None.
        dice_affine: Mean Dice after the affine stage alone (dash-dotted purple line
            "affine alone"), or None.
        star: λ* to mark (dotted green line), or None.
        star_label: Legend text for λ*; default ``"λ* = <star:.3g>"``.
        star_range: ``(lo, hi)`` λ range within noise of the best Dice (shaded green), or None.
        star_range_label: Legend text for that range.
        max_folding: Folding limit in percent (dotted red line), or None.
    """
    order = np.argsort(lams)
    lam_sorted = np.asarray(lams)[order]
    if star_range is not None:
        ax.axvspan(*star_range, color="tab:green", alpha=0.15, lw=0, label=star_range_label)
    if dice is not None:
        ax.plot(lam_sorted, np.asarray(dice)[order], "o-", ms=3, label="mean Dice")
        if dice_before is not None:
            ax.axhline(dice_before, color="gray", ls="--", label="no registration")
        if dice_affine is not None:
            ax.axhline(dice_affine, color="tab:purple", ls="-.", label="affine alone")
        if baseline is not None:
            text = baseline_label or "Dice before the deformable stage (after the affine, if any)"
            ax.axhline(baseline, color="dimgray", ls=":", label=text)
        ax.set_ylabel("mean Dice")
    if star is not None:
        label = star_label if star_label is not None else f"λ* = {star:.3g}"
        ax.axvline(star, color="tab:green", ls=":", label=label)
    ax.set_xlabel("λ")
    twin = ax.twinx()
    twin.plot(lam_sorted, np.asarray(folding)[order], "s-", ms=3, color="tab:red", label="folding")
    if max_folding is not None:
        twin.axhline(max_folding, color="tab:red", ls=":", lw=0.8, label="folding limit")
    twin.set_ylabel("% voxels with J ≤ 0", color="tab:red")
    twin.set_ylim(bottom=0.0, top=1.15 * max(max(folding, default=0.0), max_folding or 0.0) or 0.1)
    handles = ax.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    ax.legend(
        handles[0] + extra[0],
        handles[1] + extra[1],
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=3,
        frameon=False,
    )
