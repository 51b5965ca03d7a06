"""Curves against λ: mean Dice and folding on one pair of axes (tune), and the sweep's figure
of Dice, std log J and folding (:func:`sweep_curves`).

:func:`plot_lambda_curves` draws on the caller's axes (:func:`hyperreg.figures.backend.pyplot`);
:func:`sweep_curves` writes a whole figure. Numpy and matplotlib only; never torch or model code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hyperreg.figures.backend import pyplot, save_figure

__all__ = ["dice_limits", "plot_lambda_curves", "sweep_curves"]


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


def _mark_star(
    ax: Any,
    star: float | None,
    label: str | None,
    span: tuple[float, float] | None,
    span_label: str,
) -> None:
    """λ* (dotted green line) and the range within noise of the best (shaded) on ``ax``;
    labelled once, on the figure's first panel."""
    first = ax is ax.figure.axes[0]
    if span is not None and span[1] > span[0]:
        ax.axvspan(*span, color="tab:green", alpha=0.15, lw=0, label=span_label if first else None)
    if star is not None:
        text = (label if label is not None else f"λ* = {star:.3g}") if first else None
        ax.axvline(star, color="tab:green", ls=":", label=text)


def dice_limits(dice: Sequence[float], least: float = 0.02) -> tuple[float, float]:
    """Y-axis limits that make a Dice curve readable: its range with a tenth of it (at least
    ``least / 2``) added at each end, within [0, 1]; a flat curve gets ``least`` around it.

    Example:
        >>> dice_limits([0.45, 0.50])
        (0.44, 0.51)
    """
    values = np.asarray(dice, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return 0.0, 1.0
    low, high = float(values.min()), float(values.max())
    pad = max(0.1 * (high - low), least / 2)
    return round(max(0.0, low - pad), 6), round(min(1.0, high + pad), 6)


def sweep_curves(
    path: str | os.PathLike[str],
    lams: Sequence[float],
    folding: Sequence[float],
    log_jacobian_std: Sequence[float],
    *,
    dice: Sequence[float] | None = None,
    dice_before: float | None = None,
    dice_affine: float | None = None,
    title: str = "",
    star: float | None = None,
    star_label: str | None = None,
    star_range: tuple[float, float] | None = None,
    star_range_label: str = "within noise of best",
    max_folding: float | None = None,
) -> Path:
    """Write the curves of a λ sweep: mean Dice against λ on an axis fitted to it
    (:func:`dice_limits`; top panel, only with ``dice``), and the field's regularity against λ
    (bottom panel): std of log J (left axis, blue) and folding, % of voxels with J ≤ 0 (right
    axis, red, from 0). ``tune`` marks its λ* on both panels.

    The Dice of no registration and of the affine stage alone are horizontal lines with their
    value in the legend; one outside the fitted axis is not drawn and its legend says whether it
    lies above or below.

    Args:
        path: Output PNG, written atomically.
        lams: λ values (any order; plotted sorted).
        folding: Percent of voxels with J ≤ 0 per λ.
        log_jacobian_std: Standard deviation of log J (J clipped to a small positive value) per λ.
        dice: Mean Dice per λ, or None (no label maps: the regularity panel alone).
        dice_before: Mean Dice with no registration, or None.
        dice_affine: Mean Dice after the affine stage alone, or None.
        title: Figure title (above both panels; ``\n`` for a second line).
        star: A λ to mark (dotted green line on both panels, e.g. tune's λ*), or None.
        star_label: Legend text for ``star``; default ``"λ* = <star:.3g>"``.
        star_range: ``(lo, hi)`` λ range to shade green (within noise of the best), or None.
        star_range_label: Legend text for that range.
        max_folding: Folding limit in percent (dotted red line, right axis), or None.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    order = np.argsort(lams)
    lam_sorted = np.asarray(lams, dtype=np.float64)[order]
    plt = pyplot()
    panels = 2 if dice is not None else 1
    fig, axes = plt.subplots(
        panels, 1, figsize=(5.8, 2.7 * panels + 0.6), sharex=True, squeeze=False,
        layout="constrained",
    )  # fmt: skip
    if dice is not None:
        ax = axes[0, 0]
        curve = np.asarray(dice, dtype=np.float64)[order]
        ax.plot(lam_sorted, curve, "o-", ms=3, label="mean Dice")
        low, high = dice_limits(curve)
        for value, name, style in (
            (dice_before, "no registration", dict(color="gray", ls="--")),
            (dice_affine, "affine alone", dict(color="tab:purple", ls="-.")),
        ):
            if value is None or not np.isfinite(value):
                continue
            where = "" if low <= value <= high else (" below" if value < low else " above")
            line = ax.axhline(value, label=f"{name} {value:.3f}{where}", **style)
            line.set_visible(not where)
        ax.set_ylim(low, high)
        ax.set_ylabel("mean Dice")
    for ax in axes[:, 0]:
        _mark_star(ax, star, star_label, star_range, star_range_label)
    if dice is not None:
        axes[0, 0].legend(fontsize=7, loc="best", frameon=False)
        axes[0, 0].grid(alpha=0.3)
    ax = axes[-1, 0]
    ax.plot(lam_sorted, np.asarray(log_jacobian_std)[order], "o-", ms=3, color="tab:blue")
    ax.set_ylabel("std log J", color="tab:blue")
    ax.set_xlabel("λ")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    folding_sorted = np.asarray(folding, dtype=np.float64)[order]
    twin.plot(lam_sorted, folding_sorted, "s-", ms=3, color="tab:red")
    twin.set_ylabel("% voxels with J ≤ 0", color="tab:red")
    top = max(float(np.nanmax(folding_sorted, initial=0.0)), max_folding or 0.0)
    twin.set_ylim(0.0, 1.15 * top or 0.1)
    if max_folding is not None:
        twin.axhline(max_folding, color="tab:red", ls=":", lw=0.8, label="folding limit")
    handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
    if handles:  # λ* and its range without a Dice panel; the folding limit
        ax.legend(handles=handles, fontsize=7, loc="best", frameon=False)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)
