"""Slices in one anatomical display convention, and the checkerboard view of two of them.

:func:`oriented_slice` and :func:`show_slice` draw every image in one anatomical convention
(:data:`DISPLAY_CONVENTION`, derived from the image affine); :func:`middle_slice` is the
unoriented middle slice; :func:`checkerboard` interleaves two slices in square tiles. Numpy and
nibabel only: must not import matplotlib at module level, torch or model code.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DISPLAY_CONVENTION",
    "OrientedSlice",
    "checkerboard",
    "middle_slice",
    "oriented_slice",
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
        """One-line statement of the view, e.g. ``"coronal, L ◀ ▶ R (neurological)"``; a
        sagittal view (anterior to the right) names no left-right convention."""
        view = f"{self.plane}, {self.left} ◀ ▶ {self.right}"
        return view if self.plane == "sagittal" else f"{view} ({DISPLAY_CONVENTION})"


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
    # no ticks (none is drawn with the axis off): placing the title and the layout would
    # otherwise still create and measure them, most of a many-panel figure's seconds
    ax.set_xticks([])
    ax.set_yticks([])
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
