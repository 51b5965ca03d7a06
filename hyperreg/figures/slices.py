"""Figure set-up shared by the applications (sweep, tune, demo): one place for matplotlib.

:func:`pyplot` selects the non-interactive Agg backend before pyplot is imported (so figures
render on machines without a display); :func:`save_figure` writes a PNG atomically;
:func:`oriented_slice` and :func:`show_slice` draw every image in one anatomical convention
(:data:`DISPLAY_CONVENTION`, derived from the image affine); :func:`checkerboard` and
:func:`edge_mask` build the alignment-check views, :func:`label_boundaries` the label contours,
and :func:`alignment_figure` puts them together for one registered pair (the register figure);
:func:`plot_lambda_curves` draws Dice and folding against λ. Must not import torch or model code.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hyperreg._files import atomic_write

__all__ = [
    "DISPLAY_CONVENTION",
    "OrientedSlice",
    "alignment_figure",
    "checkerboard",
    "edge_mask",
    "label_boundaries",
    "middle_slice",
    "oriented_slice",
    "overlay_edges",
    "plot_lambda_curves",
    "pyplot",
    "save_figure",
    "show_slice",
]

DISPLAY_CONVENTION = "neurological"
"""How every figure shows a slice: superior (or anterior, in an axial slice) up and the
subject's left on the left of the image (right on the right); a sagittal slice has anterior on
the right. In world terms: the in-plane RAS axis that is x (R), or y (A) for sagittal, increases
rightwards and the other in-plane axis increases upwards."""

_PLANES = ("axial", "coronal", "sagittal")
_NORMAL = {"sagittal": 0, "coronal": 1, "axial": 2}  # world (RAS) axis normal to the plane
_PLANE_OF = {value: key for key, value in _NORMAL.items()}
_IN_PLANE = {2: (0, 1), 1: (0, 2), 0: (1, 2)}  # normal -> (horizontal, vertical) world axes
_LETTERS = (("L", "R"), ("P", "A"), ("I", "S"))  # world axis -> (negative, positive) end


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
    """2D array view of an image: itself, or the middle slice along the last axis for 3D (no
    reorientation; see :func:`oriented_slice` for display)."""
    return image if image.ndim == 2 else image[..., image.shape[-1] // 2]


class OrientedSlice(NamedTuple):
    """A 2D slice ready for ``imshow`` (row 0 at the top) in :data:`DISPLAY_CONVENTION`.

    Attributes:
        data: The slice, shape ``(rows, columns)``.
        plane: ``"axial"``, ``"coronal"`` or ``"sagittal"`` (nearest anatomical plane).
        left, right, top, bottom: Anatomical direction at each edge (``"L"``, ``"S"``, ...).
    """

    data: np.ndarray
    plane: str
    left: str
    right: str
    top: str
    bottom: str

    @property
    def label(self) -> str:
        """One-line statement of the view, e.g. ``"coronal, L ◀ ▶ R (neurological)"``."""
        return f"{self.plane}, {self.left} ◀ ▶ {self.right} ({DISPLAY_CONVENTION})"


def _orientation(fn: str, affine: np.ndarray) -> np.ndarray:
    """nibabel's ``io_orientation``: per array axis, (nearest RAS world axis, ±1)."""
    from nibabel.orientations import io_orientation

    matrix = np.asarray(affine, dtype=np.float64)
    if matrix.shape != (4, 4) or not np.isfinite(matrix).all():
        raise ValueError(
            f"{fn}(): 'affine' must be a finite (4, 4) matrix, got shape {tuple(matrix.shape)}"
        )
    ornt = io_orientation(matrix)
    if np.isnan(ornt).any():
        raise ValueError(
            f"{fn}(): 'affine' must map each array axis to a world direction, got a "
            f"singular matrix {matrix[:3, :3].tolist()}"
        )
    return ornt.astype(int)


def oriented_slice(
    image: np.ndarray, affine: np.ndarray, plane: str | None = None
) -> OrientedSlice:
    """The 2D view of ``image`` in :data:`DISPLAY_CONVENTION`, whatever its stored orientation.

    Each array axis is matched to its nearest world axis with nibabel's ``io_orientation``
    (what ``aff2axcodes`` reports, e.g. LIA), then the slice is transposed and flipped so that
    rows run from superior (or anterior) to inferior and columns from the subject's left to
    right. A 2D image is the one slice of an ``(I, J, 1)`` file: its plane is the one normal to
    the affine's third column. For 3D, the middle slice (in RAS order) of ``plane``, by default
    the plane normal to the last array axis, so an image stored in LIA and the same data
    reoriented to RAS give the same view.

    Args:
        image: Array of shape ``(I, J)`` or ``(I, J, K)``, any dtype.
        affine: Its ``(4, 4)`` voxel-to-world (RAS mm) matrix; for 2D that of the one-slice file.
        plane: ``"axial"``, ``"coronal"``, ``"sagittal"`` or None (see above). A 2D image only
            has its own plane.

    Returns:
        An :class:`OrientedSlice`.

    Raises:
        ValueError: If ``image`` is not 2D or 3D, ``affine`` is not a finite, non-singular
            ``(4, 4)`` matrix, or ``plane`` is not one of the options (or not the plane of a 2D
            image).
    """
    fn = "oriented_slice"
    image = np.asarray(image)
    if image.ndim not in (2, 3):
        raise ValueError(
            f"{fn}(): 'image' must have shape (I, J) or (I, J, K), got {tuple(image.shape)}"
        )
    if plane is not None and plane not in _PLANES:
        raise ValueError(f"{fn}(): 'plane' must be one of {_PLANES} or None, got {plane!r}")
    ornt = _orientation(fn, affine)
    normal = int(ornt[2, 0]) if plane is None else _NORMAL[plane]
    if image.ndim == 2:
        if normal != ornt[2, 0]:
            raise ValueError(
                f"{fn}(): 'plane' of a 2D image must be its own plane "
                f"'{_PLANE_OF[int(ornt[2, 0])]}', got {plane!r}"
            )
        view, axes = image, [ornt[0], ornt[1]]
    else:
        through = int(np.flatnonzero(ornt[:, 0] == normal)[0])
        size = image.shape[through]
        index = size // 2 if ornt[through, 1] > 0 else size - 1 - size // 2
        view = np.take(image, index, axis=through)
        axes = [ornt[a] for a in range(3) if a != through]
    horizontal, vertical = _IN_PLANE[normal]
    if axes[0][0] == horizontal:  # array axes -> (vertical, horizontal)
        view, axes = view.T, axes[::-1]
    if axes[1][1] < 0:  # columns must increase along the horizontal world axis
        view = view[:, ::-1]
    if axes[0][1] > 0:  # row 0 must be the top, the positive end of the vertical world axis
        view = view[::-1, :]
    return OrientedSlice(
        data=np.ascontiguousarray(view),
        plane=_PLANE_OF[normal],
        left=_LETTERS[horizontal][0],
        right=_LETTERS[horizontal][1],
        top=_LETTERS[vertical][1],
        bottom=_LETTERS[vertical][0],
    )


def show_slice(
    ax: Any,
    image: np.ndarray | OrientedSlice,
    title: str,
    affine: np.ndarray | None = None,
    *,
    plane: str | None = None,
    letters: bool = False,
    **kw: Any,
) -> Any:
    """Draw ``image`` on ``ax`` in :data:`DISPLAY_CONVENTION` (see :func:`oriented_slice`).

    Args:
        ax: A matplotlib Axes.
        image: An :class:`OrientedSlice`, or a 2D/3D array with its ``affine``.
        title: Panel title.
        affine: The image's ``(4, 4)`` affine; None draws the array as stored (array axis 0 to
            the right, axis 1 upwards) and says so in the title.
        plane: See :func:`oriented_slice`.
        letters: Write the anatomical direction at each edge (L, R, S, I, ...).
        **kw: Passed to ``imshow`` (``cmap``, ``vmin``, ...).

    Returns:
        The ``AxesImage`` (for a colour bar).
    """
    if isinstance(image, OrientedSlice):
        view: OrientedSlice | None = image
    elif affine is not None:
        view = oriented_slice(image, affine, plane)
    else:
        view = None
    if view is None:
        shown = ax.imshow(np.rot90(middle_slice(np.asarray(image))), **kw)
        title = f"{title} (array axes, orientation unknown)"
    else:
        shown = ax.imshow(view.data, **kw)
        if letters:
            style = dict(color="yellow", fontsize=7, fontweight="bold")
            for x, y, text, ha, va in (
                (0.02, 0.5, view.left, "left", "center"),
                (0.98, 0.5, view.right, "right", "center"),
                (0.5, 0.98, view.top, "center", "top"),
                (0.5, 0.02, view.bottom, "center", "bottom"),
            ):
                ax.text(x, y, text, transform=ax.transAxes, ha=ha, va=va, **style)
    ax.set_title(title, fontsize=8)
    ax.axis("off")
    return shown


def checkerboard(first: np.ndarray, second: np.ndarray, squares: int = 8) -> np.ndarray:
    """Interleave two 2D images in square tiles: ``first`` where the tile's row + column index
    is even, ``second`` where it is odd (tile (0, 0), top left, is ``first``).

    The tile side is ``ceil(max(shape) / squares)`` pixels, so tiles are square and there are
    ``squares`` of them along the longer side (the last row/column of tiles may be cut).

    Args:
        first: Array of shape ``(H, W)``.
        second: Array of the same shape.
        squares: Tiles along the longer side, >= 1.

    Returns:
        Array of shape ``(H, W)``, dtype of ``np.result_type(first, second)``.

    Raises:
        ValueError: If the arrays are not 2D of one shape or ``squares`` < 1.

    Example:
        >>> checkerboard(np.zeros((2, 4)), np.ones((2, 4)), squares=2)
        array([[0., 0., 1., 1.],
               [0., 0., 1., 1.]])
    """
    fn = "checkerboard"
    first, second = np.asarray(first), np.asarray(second)
    if first.ndim != 2 or first.shape != second.shape:
        raise ValueError(
            f"{fn}(): 'first' and 'second' must be 2D of one shape, got "
            f"{tuple(first.shape)} and {tuple(second.shape)}"
        )
    if isinstance(squares, bool) or not isinstance(squares, int) or squares < 1:
        raise ValueError(f"{fn}(): 'squares' must be an integer >= 1, got {squares!r}")
    side = math.ceil(max(first.shape) / squares)
    rows = np.arange(first.shape[0])[:, None] // side
    cols = np.arange(first.shape[1])[None, :] // side
    return np.where((rows + cols) % 2 == 0, first, second)


def edge_mask(image: np.ndarray, fraction: float = 0.1) -> np.ndarray:
    """Boolean map of the strongest edges of a 2D image: the ``fraction`` of pixels with the
    largest gradient magnitude (central differences, ``np.gradient``), among those with a
    non-zero gradient.

    Args:
        image: Array of shape ``(H, W)``.
        fraction: Share of the non-flat pixels to keep, in (0, 1].

    Returns:
        Boolean array of shape ``(H, W)``; all False for a constant image.

    Raises:
        ValueError: If ``image`` is not 2D or ``fraction`` is outside (0, 1].
    """
    fn = "edge_mask"
    image = np.asarray(image, dtype=np.float64)
    if image.ndim != 2:
        raise ValueError(f"{fn}(): 'image' must be 2D (H, W), got {tuple(image.shape)}")
    if not 0 < fraction <= 1:
        raise ValueError(f"{fn}(): 'fraction' must lie in (0, 1], got {fraction}")
    rows, cols = np.gradient(image)
    magnitude = np.hypot(rows, cols)
    moving = magnitude[magnitude > 0]
    if moving.size == 0:
        return np.zeros(image.shape, dtype=bool)
    return magnitude >= np.quantile(moving, 1 - fraction)


def overlay_edges(ax: Any, mask: np.ndarray, color: str = "red") -> Any:
    """Paint the True pixels of a 2D ``mask`` (e.g. :func:`edge_mask` of the fixed image's
    oriented view) opaquely in ``color`` over what ``ax`` shows; other pixels stay transparent.
    Returns the ``AxesImage``."""
    from matplotlib.colors import to_rgba

    rgba = np.zeros((*np.shape(mask), 4))
    rgba[np.asarray(mask, dtype=bool)] = to_rgba(color)
    return ax.imshow(rgba, interpolation="nearest")


def label_boundaries(labels: np.ndarray) -> np.ndarray:
    """Boolean map of label boundaries of a 2D label map: pixels whose label differs from that
    of a face neighbour (right or below, or left or above), background (0) included, so every
    structure is outlined on both sides of its border.

    Args:
        labels: Integer-valued array of shape ``(H, W)``.

    Returns:
        Boolean array of shape ``(H, W)``.

    Raises:
        ValueError: If ``labels`` is not 2D.

    Example:
        >>> label_boundaries(np.array([[0, 0, 2], [0, 0, 2]])).astype(int)
        array([[0, 1, 1],
               [0, 1, 1]])
    """
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(
            f"label_boundaries(): 'labels' must be 2D (H, W), got {tuple(labels.shape)}"
        )
    edges = np.zeros(labels.shape, dtype=bool)
    for axis in (0, 1):
        step = np.diff(labels, axis=axis) != 0
        lead = [slice(None), slice(None)]
        trail = [slice(None), slice(None)]
        lead[axis], trail[axis] = slice(None, -1), slice(1, None)
        edges[tuple(lead)] |= step
        edges[tuple(trail)] |= step
    return edges


_FIXED_CONTOUR = "yellow"
_MOVED_CONTOUR = "cyan"
_BOTH_CONTOUR = "lime"


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
) -> Path:
    """Write a PNG that shows how well ``moved`` lines up with ``fixed`` (the register figure).

    One row per stage, "after" (``moved``) and, when ``moving`` is given, "before" above it.
    Columns: the image alone; the fixed image's strongest edges (:func:`edge_mask`, red) drawn
    on it; a checkerboard of it and the fixed image (:func:`checkerboard`); its absolute
    difference from the fixed image; and, when label maps are given, the label boundaries
    (:func:`label_boundaries`) of the fixed map (yellow), of this stage's map (cyan) and where
    both agree (green), on the fixed image. Images are drawn on one grey scale from the fixed
    image's range, in :data:`DISPLAY_CONVENTION` oriented by ``affine``; every panel title says
    what it shows, and the figure title gives the view. 3D arrays show their middle slice (see
    :func:`oriented_slice`). Intensities are shown as given (pass images on one scale, e.g.
    normalised to [0, 1], for the difference panel to mean something).

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
    fixed_view = oriented_slice(fixed, affine)
    view = fixed_view.label + ("" if fixed.ndim == 2 else ", middle slice")

    def flat(array: np.ndarray) -> np.ndarray:
        return oriented_slice(np.asarray(array), affine).data

    rows: list[tuple[str, str, np.ndarray, np.ndarray | None]] = []
    if moving is not None:
        rows.append(
            ("before", moving_title, flat(moving), None if moving_seg is None else flat(moving_seg))
        )
    rows.append(("after", "moved", flat(moved), None if moved_seg is None else flat(moved_seg)))
    contours = fixed_seg is not None and any(r[3] is not None for r in rows)
    fixed_boundary = label_boundaries(flat(fixed_seg)) if contours else None  # type: ignore[arg-type]
    columns = 5 if contours else 4
    plt = pyplot()
    fig, axes = plt.subplots(
        len(rows),
        columns,
        figsize=(2.6 * columns, 2.9 * len(rows) + 0.5),
        squeeze=False,
        layout="constrained",
    )
    low, high = float(fixed_view.data.min()), float(fixed_view.data.max())
    scale = dict(cmap="gray", vmin=low, vmax=high if high > low else low + 1.0)
    edges = edge_mask(fixed_view.data)
    spread = max(high - low, 1e-12)
    for row, (stage, name, image, seg) in enumerate(rows):
        show_slice(
            axes[row, 0],
            fixed_view._replace(data=image),
            textwrap.fill(f"{stage}: {name}", 40),
            letters=row == 0,
            **scale,
        )
        show_slice(
            axes[row, 1],
            fixed_view._replace(data=image),
            f"{stage}: fixed edges (red) on {name.split(' (')[0]}",
            **scale,
        )
        overlay_edges(axes[row, 1], edges)
        show_slice(
            axes[row, 2],
            fixed_view._replace(data=checkerboard(image, fixed_view.data)),
            f"{stage}: checkerboard {name.split(' (')[0]} / fixed",
            **scale,
        )
        shown = show_slice(
            axes[row, 3],
            fixed_view._replace(data=np.abs(image - fixed_view.data)),
            f"{stage}: |{name.split(' (')[0]} − fixed|",
            cmap="viridis",
            vmin=0,
            vmax=0.5 * spread,
        )
        if contours:
            ax = axes[row, 4]
            short = name.split(" (")[0]
            title_text = f"{stage}: label borders, fixed yellow,\n{short} cyan, both green"
            show_slice(ax, fixed_view, title_text, **scale)
            assert fixed_boundary is not None  # contours implies fixed_seg
            other = label_boundaries(seg) if seg is not None else np.zeros_like(fixed_boundary)
            overlay_edges(ax, fixed_boundary & ~other, color=_FIXED_CONTOUR)
            overlay_edges(ax, other & ~fixed_boundary, color=_MOVED_CONTOUR)
            overlay_edges(ax, other & fixed_boundary, color=_BOTH_CONTOUR)
    fig.colorbar(
        shown, ax=axes[:, 3].tolist(), fraction=0.04, pad=0.01, label="|difference| (image units)"
    )
    fig.suptitle(f"{title + '. ' if title else ''}alignment check; {view}", fontsize=9)
    return save_figure(fig, path, dpi=100)


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
