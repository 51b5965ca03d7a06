"""Per-structure scores as box plots that stay readable for hundreds of structures
(``evaluate``'s ``evaluation_boxplot.png``).

:func:`structure_boxplots` draws horizontal box plots, one line per structure named on the
left, Dice and HD95 side by side, sorted by median Dice; with more than ``most`` structures
only the ``most // 2`` with the lowest median Dice and the ``most // 2`` with the highest are
drawn (two groups, titled so), so the figure's size is bounded. Numpy and matplotlib only;
never torch or model code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hyperreg.figures.backend import pyplot, save_figure

__all__ = ["MOST_STRUCTURES", "structure_boxplots"]

MOST_STRUCTURES = 40
"""The default number of structures drawn at most by :func:`structure_boxplots`."""

_ROW_INCHES = 0.17  # height of one structure's line


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.median(finite)) if finite else float("nan")


def structure_boxplots(
    path: str | os.PathLike[str],
    names: Sequence[str],
    dice: Sequence[Sequence[float]],
    hd95: Sequence[Sequence[float]],
    *,
    title: str = "",
    most: int = MOST_STRUCTURES,
) -> Path:
    """Write Dice (left) and HD95 (right) box plots per structure, one horizontal line each.

    Structures are sorted by median Dice, lowest at the top (structures without a finite Dice
    last). With more than ``most`` structures, the ``most // 2`` lowest and ``most // 2``
    highest are drawn, in two groups of rows whose titles say so; the others are only in the
    caller's tables. The figure is about 10 inches wide whatever the number of structures, and
    ``0.17 * min(len(names), most)`` inches plus the titles tall.

    Args:
        path: Output PNG, written atomically.
        names: Structure names, one per structure.
        dice: Per structure, the Dice of each pair (NaN where a pair lacks it).
        hd95: Per structure, the HD95 in mm of each pair (NaN where undefined).
        title: Figure title.
        most: Structures drawn at most, >= 2.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: If the three sequences differ in length, are empty, or ``most`` < 2.
    """
    if not (len(names) == len(dice) == len(hd95)) or not names:
        raise ValueError(
            f"structure_boxplots(): 'names', 'dice' and 'hd95' must be non-empty and of one "
            f"length, got {len(names)}, {len(dice)} and {len(hd95)}"
        )
    if most < 2:
        raise ValueError(f"structure_boxplots(): 'most' must be >= 2, got {most}")
    medians = [_median(d) for d in dice]
    order = sorted(range(len(names)), key=lambda i: (np.isnan(medians[i]), medians[i]))
    if len(order) > most:
        groups = [
            (f"the {most // 2} lowest median Dice of {len(order)} structures", order[: most // 2]),
            (f"the {most // 2} highest median Dice", order[-(most // 2) :]),
        ]
    else:
        groups = [("", order)]
    plt = pyplot()
    heights = [len(g[1]) for g in groups]
    fig, axes = plt.subplots(
        len(groups), 2, figsize=(10.0, _ROW_INCHES * sum(heights) + 0.9 * len(groups) + 0.4),
        squeeze=False, sharex="col", gridspec_kw={"height_ratios": heights},
        layout="constrained",
    )  # fmt: skip
    for row, (what, members) in enumerate(groups):
        for column, (values, unit) in enumerate(((dice, "Dice"), (hd95, "HD95 (mm)"))):
            ax = axes[row, column]
            data = [_finite(values[i]) for i in members]
            ax.boxplot(data, widths=0.6, flierprops={"ms": 3}, **_horizontal())
            ax.set_yticks(range(1, len(members) + 1))
            ax.set_yticklabels([names[i] for i in members] if column == 0 else [], fontsize=7)
            ax.invert_yaxis()  # lowest median Dice at the top
            ax.grid(axis="x", alpha=0.3)
            ax.tick_params(axis="x", labelsize=7)
            if row == len(groups) - 1:
                ax.set_xlabel(unit, fontsize=8)
            if what and column == 0:
                ax.set_title(what, fontsize=8, loc="left")
        axes[row, 0].set_xlim(0, 1)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def _horizontal() -> dict[str, object]:
    """``boxplot``'s keyword for horizontal boxes: ``orientation`` from matplotlib 3.10 on
    (``vert`` is deprecated from 3.11), ``vert=False`` before."""
    import matplotlib

    major, minor = (int(part) for part in matplotlib.__version__.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def _finite(values: Sequence[float]) -> list[float]:
    """The finite values, or one NaN (an empty box) when there are none."""
    kept = [float(v) for v in values if np.isfinite(v)]
    return kept or [float("nan")]
