"""Orthogonal planes of a registered pair as small images for web pages (``batch --report``).

:func:`plane_slices` gives the views of a 2D or 3D image in
:data:`~hyperreg.figures.slices.DISPLAY_CONVENTION` (one for 2D; axial, coronal and sagittal
through the middle for 3D) with the physical size of their pixels; :func:`pair_planes` turns
a fixed and a moved image (and their label maps) into, per plane, the two images as 8-bit
grey PNGs (for a before/after flicker) and a transparent PNG layer of the moved image's edges
and the label borders to lay on top. :func:`png_bytes` encodes an array as PNG. Numpy,
nibabel and Pillow only (Pillow comes with matplotlib); never torch or model code.
"""

from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np

from hyperreg.figures.overlays import edge_mask, label_boundaries
from hyperreg.figures.slices import OrientedSlice, oriented_slice

__all__ = ["PLANES", "PlaneImages", "pair_planes", "plane_slices", "png_bytes"]

PLANES = ("axial", "coronal", "sagittal")
"""The planes of a 3D image, in the order :func:`plane_slices` gives them."""

_EDGE = (255, 64, 64)  # the moved image's edges: red
_FIXED_BORDER = (255, 230, 0)  # fixed label borders: yellow
_MOVED_BORDER = (0, 220, 255)  # moved label borders: cyan
_BOTH_BORDER = (60, 230, 60)  # where both agree: green


class PlaneImages(NamedTuple):
    """One plane of :func:`pair_planes`.

    Attributes:
        plane: ``"axial"``, ``"coronal"`` or ``"sagittal"``.
        label: The view in words (edges' directions, display convention).
        fixed: The fixed image's slice, 8-bit grey PNG bytes.
        moved: The moved image's slice, same size.
        layer: RGBA PNG of the same size, transparent except the moved image's strongest edges
            (red) and, with label maps, the label borders (fixed yellow, moved cyan, both green).
        aspect: Height over width of the slice in millimetres (pixels may not be square).
    """

    plane: str
    label: str
    fixed: bytes
    moved: bytes
    layer: bytes
    aspect: float


def png_bytes(array: np.ndarray) -> bytes:
    """PNG encoding of a uint8 array ``(H, W)`` (grey), ``(H, W, 3)`` (RGB) or ``(H, W, 4)``
    (RGBA), row 0 at the top.

    Raises:
        ValueError: If ``array`` is not uint8 of one of those shapes.
    """
    from PIL import Image

    array = np.asarray(array)
    if array.dtype != np.uint8 or not (
        array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4))
    ):
        raise ValueError(
            f"png_bytes(): 'array' must be uint8 (H, W), (H, W, 3) or (H, W, 4), got "
            f"{array.dtype} {tuple(array.shape)}"
        )
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def plane_slices(image: np.ndarray, affine: np.ndarray) -> list[tuple[OrientedSlice, float]]:
    """The views of ``image`` in :data:`~hyperreg.figures.slices.DISPLAY_CONVENTION`: its one
    slice for 2D, the middle axial, coronal and sagittal slices (:data:`PLANES`) for 3D; each
    with its aspect (height over width in mm, from the voxel sizes of ``affine``).

    Args:
        image: Array ``(I, J)`` or ``(I, J, K)``.
        affine: Its ``(4, 4)`` voxel-to-world (RAS mm) matrix (of the one-slice file for 2D).

    Raises:
        ValueError: As :func:`~hyperreg.figures.slices.oriented_slice`.
    """
    image = np.asarray(image)
    planes = (None,) if image.ndim == 2 else PLANES
    return [_with_aspect(oriented_slice(image, affine, plane), affine) for plane in planes]


def _with_aspect(view: OrientedSlice, affine: np.ndarray) -> tuple[OrientedSlice, float]:
    """``view`` with its height over width in mm: the voxel size along the world axis of its
    rows times their number, over that of its columns."""
    from nibabel.orientations import io_orientation

    ornt = io_orientation(np.asarray(affine, dtype=np.float64)).astype(int)
    sizes = np.linalg.norm(np.asarray(affine, dtype=np.float64)[:3, :3], axis=0)
    letters = {"L": 0, "R": 0, "P": 1, "A": 1, "I": 2, "S": 2}

    def size(letter: str) -> float:
        axis = np.flatnonzero(ornt[:, 0] == letters[letter])
        return float(sizes[axis[0]]) if axis.size else 1.0

    rows, columns = view.data.shape
    return view, (rows * size(view.top)) / max(columns * size(view.left), 1e-12)


def _grey(data: np.ndarray) -> np.ndarray:
    """``data`` mapped to uint8 from its 0.5th to 99.5th percentile (zeros when flat)."""
    data = np.nan_to_num(np.asarray(data, dtype=np.float64))
    low, high = np.percentile(data, [0.5, 99.5]) if data.size else (0.0, 0.0)
    if not high > low:
        return np.zeros(data.shape, dtype=np.uint8)
    return np.round(255 * np.clip((data - low) / (high - low), 0, 1)).astype(np.uint8)


def _layer(moved: np.ndarray, fixed_seg: np.ndarray | None, moved_seg: np.ndarray | None):
    """The RGBA overlay of one slice: moved edges, then label borders over them."""
    layer = np.zeros((*moved.shape, 4), dtype=np.uint8)
    layer[edge_mask(moved)] = (*_EDGE, 200)
    fixed_border = label_boundaries(fixed_seg) if fixed_seg is not None else None
    moved_border = label_boundaries(moved_seg) if moved_seg is not None else None
    if fixed_border is not None and moved_border is not None:
        layer[fixed_border & ~moved_border] = (*_FIXED_BORDER, 255)
        layer[moved_border & ~fixed_border] = (*_MOVED_BORDER, 255)
        layer[fixed_border & moved_border] = (*_BOTH_BORDER, 255)
    elif fixed_border is not None:
        layer[fixed_border] = (*_FIXED_BORDER, 255)
    elif moved_border is not None:
        layer[moved_border] = (*_MOVED_BORDER, 255)
    return layer


def pair_planes(
    fixed: np.ndarray,
    moved: np.ndarray,
    affine: np.ndarray,
    *,
    fixed_seg: np.ndarray | None = None,
    moved_seg: np.ndarray | None = None,
) -> list[PlaneImages]:
    """Per plane (one for 2D, three for 3D: :func:`plane_slices`), the fixed and moved slices
    as grey PNGs and a transparent layer of the moved image's edges and the label borders.

    Each grey image is scaled on its own from its 0.5th to 99.5th percentile (the two images
    may come from different scanners; the flicker compares anatomy, not intensities). Slices
    keep the grid's resolution (one pixel per voxel); a page scales them to the screen with
    :attr:`PlaneImages.aspect`.

    Args:
        fixed: Fixed image, ``(I, J)`` or ``(I, J, K)``.
        moved: Moved image on the fixed grid, same shape.
        affine: The fixed grid's ``(4, 4)`` voxel-to-world (RAS mm) matrix.
        fixed_seg: Fixed label map (same shape), or None.
        moved_seg: Moved label map (same shape), or None.

    Returns:
        A list of :class:`PlaneImages`.

    Raises:
        ValueError: If an array does not have ``fixed``'s shape, or as :func:`plane_slices`.
    """
    fixed = np.asarray(fixed)
    arrays = {"moved": moved, "fixed_seg": fixed_seg, "moved_seg": moved_seg}
    for name, array in arrays.items():
        if array is not None and np.shape(array) != fixed.shape:
            raise ValueError(
                f"pair_planes(): '{name}' must have the shape of 'fixed' {tuple(fixed.shape)}, "
                f"got {tuple(np.shape(array))}"
            )

    def views(array: np.ndarray | None) -> list[np.ndarray | None]:
        if array is None:
            return [None] * (1 if fixed.ndim == 2 else 3)
        return [view.data for view, _ in plane_slices(np.asarray(array), affine)]

    images = []
    for (view, aspect), moved_view, fixed_labels, moved_labels in zip(
        plane_slices(fixed, affine), views(moved), views(fixed_seg), views(moved_seg)
    ):
        assert moved_view is not None
        images.append(
            PlaneImages(
                plane=view.plane,
                label=view.label,
                fixed=png_bytes(_grey(view.data)),
                moved=png_bytes(_grey(moved_view)),
                layer=png_bytes(_layer(moved_view, fixed_labels, moved_labels)),
                aspect=aspect,
            )
        )
    return images
