"""The alignment-check figure of one registered pair (``register --figure``).

:func:`alignment_figure` puts the views of :mod:`hyperreg.figures.slices` and
:mod:`hyperreg.figures.overlays` together: per stage (before, after) the image, the fixed
image's edges on it, a checkerboard, the difference and the label borders. Never torch or model
code.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from hyperreg.figures.backend import pyplot, save_figure
from hyperreg.figures.overlays import edge_mask, label_boundaries, overlay_edges
from hyperreg.figures.planes import PLANES
from hyperreg.figures.slices import OrientedSlice, checkerboard, oriented_slice, show_slice

__all__ = ["alignment_figure"]

_FIXED_CONTOUR = "yellow"
_MOVED_CONTOUR = "cyan"
_BOTH_CONTOUR = "lime"
_TITLE = 36  # characters a panel title line holds at most


def alignment_figure(
    path: str | os.PathLike[str],
    fixed: np.ndarray,
    moved: np.ndarray,
    affine: np.ndarray,
    *,
    moving: np.ndarray | None = None,
    moving_title: str = "moving (resampled onto the fixed grid)",
    fixed_seg: np.ndarray | None = None,
    moved_seg: np.ndarray | None = None,
    moving_seg: np.ndarray | None = None,
    title: str = "",
    difference_label: str = "|difference| (image units)",
) -> Path:
    """Write a PNG that shows how well ``moved`` lines up with ``fixed`` (the register figure).

    One row per stage, "after" (``moved``) and, when ``moving`` is given, "before" above it.
    Columns: the image alone; the fixed image's strongest edges
    (:func:`~hyperreg.figures.overlays.edge_mask`, red) drawn on it; a checkerboard of it and the
    fixed image (:func:`~hyperreg.figures.slices.checkerboard`); its absolute difference from the
    fixed image; and, when label maps are given, the label boundaries
    (:func:`~hyperreg.figures.overlays.label_boundaries`) of the fixed map (yellow), of this stage's
    map (cyan) and where both agree (green), on the fixed image. Images are drawn on one grey scale
    from the fixed image's range, in :data:`~hyperreg.figures.slices.DISPLAY_CONVENTION` oriented by
    ``affine``; every panel title says what it shows, and the figure title gives the view. 3D arrays
    show their middle axial, coronal and sagittal slices, one group of rows each (see
    :func:`~hyperreg.figures.slices.oriented_slice`). Intensities are
    shown as given (pass images on one scale, e.g. normalised to [0, 1], for the difference panel to
    mean something).

    Args:
        path: Output PNG, written atomically.
        fixed: Fixed image, ``(I, J)`` or ``(I, J, K)``, on the fixed grid.
        moved: Moved image, same shape.
        affine: The fixed grid's ``(4, 4)`` voxel-to-world (RAS mm) matrix.
        moving: The moving image on the fixed grid before registration (same shape), or None.
        moving_title: What ``moving`` is, for its panel title: say if it is the
            affine-resampled image rather than the input as given.
        fixed_seg: Fixed label map (same shape), or None.
        moved_seg: Moved label map (same shape), or None; contours need ``fixed_seg`` too.
        moving_seg: Moving label map on the fixed grid (same shape), or None (before row).
        title: First part of the figure title (e.g. the file names and λ).
        difference_label: Colour bar label of the |moved − fixed| panels (say how the images
            were scaled when they were).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: If the arrays are not all of ``fixed``'s shape, not 2D/3D, or ``affine``
            is not a finite, non-singular ``(4, 4)`` matrix.
    """
    fn = "alignment_figure"
    fixed = np.asarray(fixed)
    arrays = {"moved": moved, "moving": moving, "fixed_seg": fixed_seg, "moved_seg": moved_seg}
    arrays["moving_seg"] = moving_seg
    for name, array in arrays.items():
        if array is not None and np.shape(array) != fixed.shape:
            raise ValueError(
                f"{fn}(): '{name}' must have the shape of 'fixed' {tuple(fixed.shape)}, got "
                f"{tuple(np.shape(array))}"
            )
    planes: tuple[str | None, ...] = (None,) if fixed.ndim == 2 else PLANES
    stages = [("after", "moved", moved, moved_seg)]
    if moving is not None:
        stages.insert(0, ("before", moving_title, moving, moving_seg))
    contours = fixed_seg is not None and any(stage[3] is not None for stage in stages)
    columns = 5 if contours else 4
    plt = pyplot()
    fig, axes = plt.subplots(
        len(stages) * len(planes),
        columns,
        figsize=(2.6 * columns, 2.9 * len(stages) * len(planes) + 0.5),
        squeeze=False,
        layout="constrained",
    )
    row = 0
    for plane in planes:
        fixed_view = oriented_slice(fixed, affine, plane)
        low, high = float(fixed_view.data.min()), float(fixed_view.data.max())
        scale = dict(cmap="gray", vmin=low, vmax=high if high > low else low + 1.0)
        edges = edge_mask(fixed_view.data)
        spread = max(high - low, 1e-12)
        fixed_boundary = None
        if contours:
            fixed_boundary = label_boundaries(oriented_slice(fixed_seg, affine, plane).data)
        for stage, name, image, seg in stages:
            where = stage if plane is None else f"{plane}, {stage}"
            flat = oriented_slice(np.asarray(image), affine, plane).data
            shown = _draw_stage(
                axes[row], fixed_view, (where, name, flat), stage == stages[0][0], scale,
                spread, edges,
            )  # fmt: skip
            if fixed_boundary is not None:
                seg_view = None if seg is None else oriented_slice(seg, affine, plane).data
                _draw_label_borders(
                    axes[row, 4], fixed_view, where, name, seg_view, fixed_boundary, scale
                )
            row += 1
    view = fixed_view.label if fixed.ndim == 2 else "three planes through the middle"
    fig.colorbar(shown, ax=axes[:, 3].tolist(), fraction=0.04, pad=0.01, label=difference_label)
    heading = f"{title + '. ' if title else ''}alignment check; {view}"
    fig.suptitle(textwrap.fill(heading, int(13 * 2.6 * columns)), fontsize=9)
    return save_figure(fig, path, dpi=100)


def _draw_stage(
    axes: Any,
    fixed_view: OrientedSlice,
    row: tuple[str, str, np.ndarray],
    letters: bool,
    scale: dict[str, Any],
    spread: float,
    edges: np.ndarray,
) -> Any:
    """The first four panels of one row of :func:`alignment_figure` (``row`` is the stage, the
    image's name and the image): the image alone, the fixed image's ``edges`` on it, a
    checkerboard with the fixed image and the absolute difference (on ``[0, spread / 2]``).
    Returns the difference panel's ``AxesImage``."""
    stage, name, image = row
    short = name.split(" (")[0]
    show_slice(
        axes[0],
        fixed_view._replace(data=image),
        textwrap.fill(f"{stage}: {name}", _TITLE),
        letters=letters,
        **scale,
    )
    show_slice(
        axes[1],
        fixed_view._replace(data=image),
        textwrap.fill(f"{stage}: fixed edges (red) on {short}", _TITLE),
        **scale,
    )
    overlay_edges(axes[1], edges)
    show_slice(
        axes[2],
        fixed_view._replace(data=checkerboard(image, fixed_view.data)),
        textwrap.fill(f"{stage}: checkerboard {short} / fixed", _TITLE),
        **scale,
    )
    return show_slice(
        axes[3],
        fixed_view._replace(data=np.abs(image - fixed_view.data)),
        textwrap.fill(f"{stage}: |{short} − fixed|", _TITLE),
        cmap="viridis",
        vmin=0,
        vmax=0.5 * spread,
    )


def _draw_label_borders(
    ax: Any,
    fixed_view: OrientedSlice,
    stage: str,
    name: str,
    seg: np.ndarray | None,
    fixed_boundary: np.ndarray,
    scale: dict[str, Any],
) -> None:
    """The label-border panel of one row of :func:`alignment_figure`: the fixed map's borders
    (yellow), this stage's (cyan) and both (green) on the fixed image."""
    short = name.split(" (")[0]
    title_text = f"{stage}: label borders, fixed yellow,\n{short} cyan, both green"
    show_slice(ax, fixed_view, title_text, **scale)
    other = label_boundaries(seg) if seg is not None else np.zeros_like(fixed_boundary)
    overlay_edges(ax, fixed_boundary & ~other, color=_FIXED_CONTOUR)
    overlay_edges(ax, other & ~fixed_boundary, color=_MOVED_CONTOUR)
    overlay_edges(ax, other & fixed_boundary, color=_BOTH_CONTOUR)
