"""The figures of a λ sweep (``sweep``): curves, montage and alignment check.

:func:`sweep_figures` writes ``sweep_curves.png`` (Dice on a fitted axis, std log J and
folding against λ: :func:`hyperreg.figures.curves.sweep_curves`), ``sweep_montage.png`` (the
moved image, in three planes for 3D, and the displacement magnitude per λ, wrapped into rows
of at most :data:`MONTAGE_COLUMNS` λ) and ``sweep_qc.png`` (checkerboard, fixed edges and
difference before and after registration at the chosen λ; one row per stage and plane: the
three planes of a 3D image). Slices are in :data:`~hyperreg.figures.slices.DISPLAY_CONVENTION`.
Must not import train or cli.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hyperreg.figures.backend import pyplot, save_figure
from hyperreg.figures.curves import sweep_curves
from hyperreg.figures.overlays import edge_mask, overlay_edges
from hyperreg.figures.planes import PLANES
from hyperreg.figures.slices import checkerboard, oriented_slice, show_slice

__all__ = ["MONTAGE_COLUMNS", "MONTAGE_MAX", "sweep_figures"]

MONTAGE_MAX = 12
"""At most this many λ in the montage (evenly chosen)."""

MONTAGE_COLUMNS = 6
"""At most this many λ per row of the montage; more wrap onto further rows."""


def sweep_figures(
    out: Path,
    moving: np.ndarray,
    fixed: np.ndarray,
    results: Sequence[Any],
    pair: Any,
    moved_units: tuple[float, float] = (0.0, 1.0),
) -> list[Path]:
    """Write sweep_curves.png, sweep_montage.png and sweep_qc.png in ``out``.

    Args:
        out: Output folder.
        moving: The pair's moving image on the fixed grid (after the affine stage when one ran,
            and the panels say so), normalised.
        fixed: The fixed image, normalised.
        results: One :class:`~hyperreg.registration.pipeline.PairResult` per λ.
        pair: The :class:`~hyperreg.registration.pipeline.PreparedPair` (fixed affine, Dice
            before and after the affine stage, whether an affine stage ran).
        moved_units: ``(low, high)`` mapping the results' moved images (in the moving image's
            own units) to the normalised scale, for the QC figure.

    Returns:
        The three paths.
    """
    affine = pair.fixed.affine
    moving_name = "moving after the affine stage" if pair.chained else "moving"
    has_dice = results[0].dice is not None
    curves = sweep_curves(
        out / "sweep_curves.png",
        [r.lam for r in results],
        [100.0 * r.folding_fraction for r in results],
        [r.log_jacobian_std for r in results],
        dice=[r.mean_dice for r in results] if has_dice else None,
        dice_before=pair.dice_before,
        dice_affine=pair.dice_affine,
        title="Dice, std log J and folding vs λ" if has_dice else "std log J and folding vs λ",
    )
    montage = _montage(out / "sweep_montage.png", moving, fixed, results, affine, moving_name)
    qc = _qc_figure(out, moving, fixed, results, affine, moved_units, moving_name)
    return [curves, montage, qc]


def _montage(
    path: Path,
    moving: np.ndarray,
    fixed: np.ndarray,
    results: Sequence[Any],
    affine: np.ndarray,
    moving_name: str,
) -> Path:
    """sweep_montage.png: per λ (at most :data:`MONTAGE_MAX`, evenly chosen;
    :data:`MONTAGE_COLUMNS` a row) the moved image in each plane (one for 2D; axial, coronal,
    sagittal for 3D) above its displacement magnitude (the plane normal to the last array
    axis); the first column holds the fixed image beside the moved rows and the moving image
    beside the magnitudes."""
    chosen = sorted(results, key=lambda r: r.lam)
    if len(chosen) > MONTAGE_MAX:
        picks = np.unique(np.linspace(0, len(chosen) - 1, MONTAGE_MAX).round().astype(int))
        chosen = [chosen[i] for i in picks]
    planes: Sequence[str | None] = (None,) if fixed.ndim == 2 else PLANES
    per_row = min(MONTAGE_COLUMNS, len(chosen))
    blocks, height = -(-len(chosen) // per_row), len(planes) + 1  # rows of panels per block
    plt = pyplot()
    fig, axes = plt.subplots(
        height * blocks, per_row + 1, figsize=(1.9 * per_row + 2.7, 2.1 * height * blocks + 0.4),
        squeeze=False, layout="constrained",
    )  # fmt: skip
    for ax in axes[height:, 0]:
        ax.axis("off")
    moved = [[oriented_slice(r.moved, affine, plane) for plane in planes] for r in chosen]
    low = min(float(v.data.min()) for views in moved for v in views)  # one grey scale
    high = max(float(v.data.max()) for views in moved for v in views)
    for row, plane in enumerate(planes):
        where = "" if plane is None else f", {plane}"
        view = oriented_slice(fixed, affine, plane)
        show_slice(axes[row, 0], view, f"fixed{where}", cmap="gray", letters=True)
    moving_view = oriented_slice(moving, affine)
    show_slice(axes[height - 1, 0], moving_view, moving_name, cmap="gray", letters=True)
    magnitudes = [oriented_slice(np.linalg.norm(r.disp, axis=0), affine) for r in chosen]
    vmax = max(float(m.data.max()) for m in magnitudes) or 1.0
    for number, (r, views, mag) in enumerate(zip(chosen, moved, magnitudes)):
        top, column = height * (number // per_row), 1 + number % per_row
        dice = f"\nDice {r.mean_dice:.3f}" if r.dice is not None else ""
        for row, view in enumerate(views):
            title = f"λ = {r.lam:.3g}{dice}" if row == 0 else ""
            show_slice(axes[top + row, column], view, title, cmap="gray", vmin=low, vmax=high)
        shown = show_slice(
            axes[top + height - 1, column], mag, f"λ = {r.lam:.3g}\nmax |u| {mag.data.max():.1f}",
            cmap="magma", vmin=0, vmax=vmax,
        )  # fmt: skip
    for number in range(len(chosen), blocks * per_row):  # empty places of the last row
        for ax in axes[height * (number // per_row) :, 1 + number % per_row]:
            ax.axis("off")
    fig.colorbar(shown, ax=axes[:, -1].tolist(), fraction=0.05, pad=0.01, label="|u| (voxels)")
    view = moving_view.label + ("" if moving.ndim == 2 else " for |u| and the moving image")
    fig.suptitle(
        _wrap(f"moved image per λ ({'three planes, ' if len(planes) > 1 else ''}beside the "
              f"fixed image), above its displacement magnitude |u| (voxels). {view}", 110),
        fontsize=9,
    )  # fmt: skip
    return save_figure(fig, path, dpi=100)


def _wrap(text: str, width: int) -> str:
    return textwrap.fill(text, width)


def _qc_pick(results: Sequence[Any]) -> Any:
    """λ with the best mean Dice (ties: larger λ), or the middle λ without label maps."""
    ordered = sorted(results, key=lambda r: r.lam)
    if ordered[0].dice is None:
        return ordered[(len(ordered) - 1) // 2]
    return max(ordered, key=lambda r: (r.mean_dice, r.lam))


def _qc_figure(
    out: Path,
    moving: np.ndarray,
    fixed: np.ndarray,
    results: Sequence[Any],
    affine: np.ndarray,
    moved_units: tuple[float, float],
    moving_name: str = "moving",
) -> Path:
    """sweep_qc.png: checkerboard, fixed edges and |difference| of moving (before) and of the
    moved image at the chosen λ (after) against the fixed image, all on the normalised scale;
    one row per stage and plane (a 2D image's one plane; axial, coronal, sagittal in 3D)."""
    plt = pyplot()
    pick = _qc_pick(results)
    low, high = moved_units
    moved = (pick.moved - low) / (high - low) if high > low else pick.moved * 0.0
    planes: Sequence[str | None] = (None,) if fixed.ndim == 2 else PLANES
    rows = []
    for plane in planes:
        fixed_view = oriented_slice(fixed, affine, plane)
        for stage, name, image in (
            ("before", moving_name, moving),
            (f"after, λ = {pick.lam:.3g}", "moved", moved),
        ):
            rows.append((fixed_view, stage, name, oriented_slice(image, affine, plane).data))
    fig, axes = plt.subplots(
        len(rows), 3, figsize=(8.4, 3.2 * len(rows) + 0.3), squeeze=False, layout="constrained"
    )
    for row, (fixed_view, stage, name, image) in enumerate(rows):
        scale = dict(cmap="gray", vmin=min(float(fixed_view.data.min()), 0.0), vmax=1.0)
        where = "" if fixed.ndim == 2 else f"{fixed_view.plane}, "
        for column, (data, what) in enumerate(
            (
                (checkerboard(image, fixed_view.data), f"checkerboard {name} / fixed"),
                (image, f"fixed edges (red) on {name}"),
            )
        ):
            show_slice(
                axes[row, column],
                fixed_view._replace(data=data),
                _wrap(f"{where}{stage}: {what}", 34),
                letters=column == 0,
                **scale,
            )
        overlay_edges(axes[row, 1], edge_mask(fixed_view.data))
        shown = show_slice(
            axes[row, 2],
            fixed_view._replace(data=np.abs(image - fixed_view.data)),
            _wrap(f"{where}{stage}: |{name} − fixed|", 34),
            cmap="viridis",
            vmin=0,
            vmax=0.5,
        )
    fig.colorbar(
        shown, ax=axes[:, 2].tolist(), fraction=0.04, pad=0.01,
        label="|difference| (normalised intensity)",
    )  # fmt: skip
    why = "best mean Dice" if pick.dice is not None else "middle λ"
    dice = f", mean Dice {pick.mean_dice:.3f}" if pick.dice is not None else ""
    view = "display convention: " + rows[0][0].label.split("(")[-1].rstrip(")")
    fig.suptitle(
        _wrap(f"alignment check before and after registration at λ = {pick.lam:.3g} ({why}"
              f"{dice}). {rows[0][0].label if fixed.ndim == 2 else view}", 100),
        fontsize=9,
    )  # fmt: skip
    return save_figure(fig, out / "sweep_qc.png", dpi=100)
