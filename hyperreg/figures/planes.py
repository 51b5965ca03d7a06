"""Orthogonal planes of a registered pair as small images for web pages (``batch --report``).

:func:`plane_slices` gives the views of a 2D or 3D image in
:data:`~hyperreg.figures.slices.DISPLAY_CONVENTION` (one for 2D; axial, coronal and sagittal
through the middle for 3D) with the physical size of their pixels; :func:`pair_planes` turns
a fixed and a moved image (and their label maps) into, per plane, the two images as 8-bit
grey WebP (JPEG where Pillow has no WebP; PNG on request) for a before/after flicker and a
transparent palette PNG layer of the moved image's edges and the label borders to lay on top.
:func:`png_bytes` encodes an array as PNG, :func:`grey_bytes` a grey one lossily. Numpy,
nibabel and Pillow only (Pillow comes with matplotlib); never torch or model code.
"""

from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np

from hyperreg.figures.overlays import edge_mask, label_boundaries
from hyperreg.figures.slices import OrientedSlice, oriented_slice

__all__ = [
    "GREY_QUALITY",
    "PLANES",
    "PlaneImages",
    "grey_bytes",
    "pair_planes",
    "plane_slices",
    "png_bytes",
]

PLANES = ("axial", "coronal", "sagittal")
"""The planes of a 3D image, in the order :func:`plane_slices` gives them."""

GREY_QUALITY = 80
"""Quality of :func:`pair_planes`'s lossy grey slices (WebP at 80: about a third of a
lossless PNG's bytes on 1 mm brain slices)."""

_EDGE = (255, 64, 64)  # the moved image's edges: red
_FIXED_BORDER = (255, 230, 0)  # fixed label borders: yellow
_MOVED_BORDER = (0, 220, 255)  # moved label borders: cyan
_BOTH_BORDER = (60, 230, 60)  # where both agree: green


class PlaneImages(NamedTuple):
    """One plane of :func:`pair_planes`.

    Attributes:
        plane: ``"axial"``, ``"coronal"`` or ``"sagittal"``.
        label: The view in words (edges' directions, display convention).
        fixed: The fixed image's slice, 8-bit grey image bytes (:attr:`mime`).
        moved: The moved image's slice, same size and format.
        layer: Palette PNG with transparency of the same size (it decodes to RGBA),
            transparent except the moved image's strongest edges (red) and, with label maps,
            the label borders (fixed yellow, moved cyan, both green).
        aspect: Height over width of the slice in millimetres (pixels may not be square).
        mime: The type of ``fixed`` and ``moved``: ``"image/webp"``, ``"image/jpeg"`` or
            ``"image/png"``.
    """

    plane: str
    label: str
    fixed: bytes
    moved: bytes
    layer: bytes
    aspect: float
    mime: str = "image/png"


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


def grey_bytes(array: np.ndarray, quality: int = GREY_QUALITY) -> tuple[bytes, str]:
    """Lossy encoding of a grey uint8 array ``(H, W)``, row 0 at the top: WebP, or JPEG where
    Pillow was built without WebP.

    Returns:
        ``(bytes, mime type)``.

    Raises:
        ValueError: If ``array`` is not uint8 ``(H, W)`` or ``quality`` not in 1..95.
    """
    from PIL import Image, features

    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim != 2:
        raise ValueError(
            f"grey_bytes(): 'array' must be uint8 (H, W), got {array.dtype} {array.shape}"
        )
    if not 1 <= quality <= 95:
        raise ValueError(f"grey_bytes(): 'quality' must be 1 to 95, got {quality}")
    kind = "WEBP" if features.check("webp") else "JPEG"
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buffer, format=kind, quality=quality)
    return buffer.getvalue(), f"image/{kind.lower()}"


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


_PALETTE = ((0, 0, 0), _EDGE, _FIXED_BORDER, _MOVED_BORDER, _BOTH_BORDER)
_ALPHA = (0, 200, 255, 255, 255)
"""The layer's colours by index (0 transparent) and their opacities."""


def _layer(
    moved: np.ndarray, fixed_seg: np.ndarray | None, moved_seg: np.ndarray | None
) -> np.ndarray:
    """The overlay of one slice as :data:`_PALETTE` indices (uint8): moved edges, then label
    borders over them."""
    layer = np.zeros(moved.shape, dtype=np.uint8)
    layer[edge_mask(moved)] = 1
    fixed_border = label_boundaries(fixed_seg) if fixed_seg is not None else None
    moved_border = label_boundaries(moved_seg) if moved_seg is not None else None
    if fixed_border is not None and moved_border is not None:
        layer[fixed_border & ~moved_border] = 2
        layer[moved_border & ~fixed_border] = 3
        layer[fixed_border & moved_border] = 4
    elif fixed_border is not None:
        layer[fixed_border] = 2
    elif moved_border is not None:
        layer[moved_border] = 3
    return layer


def _palette_png(indices: np.ndarray) -> bytes:
    """A palette PNG of ``indices`` (``(H, W)`` uint8 into :data:`_PALETTE`) with the
    opacities of :data:`_ALPHA` (a tRNS chunk): an RGBA image in a fraction of the bytes."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(indices), mode="P")
    image.putpalette([value for colour in _PALETTE for value in colour])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True, transparency=bytes(_ALPHA))
    return buffer.getvalue()


def pair_planes(
    fixed: np.ndarray,
    moved: np.ndarray,
    affine: np.ndarray,
    *,
    fixed_seg: np.ndarray | None = None,
    moved_seg: np.ndarray | None = None,
    quality: int | None = GREY_QUALITY,
) -> list[PlaneImages]:
    """Per plane (one for 2D, three for 3D: :func:`plane_slices`), the fixed and moved slices
    as lossy grey images (:func:`grey_bytes`; PNG with ``quality`` None) and a transparent
    palette PNG layer of the moved image's edges and the label borders.

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
        quality: Quality of the lossy grey slices (1-95); None: lossless PNG.

    Returns:
        A list of :class:`PlaneImages`.

    Raises:
        ValueError: If an array does not have ``fixed``'s shape, or as :func:`plane_slices`
            and :func:`grey_bytes`.
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

    def grey(data: np.ndarray) -> tuple[bytes, str]:
        scaled = _grey(data)
        return (png_bytes(scaled), "image/png") if quality is None else grey_bytes(scaled, quality)

    images = []
    for (view, aspect), moved_view, fixed_labels, moved_labels in zip(
        plane_slices(fixed, affine), views(moved), views(fixed_seg), views(moved_seg)
    ):
        assert moved_view is not None
        (fixed_image, mime), (moved_image, _) = grey(view.data), grey(moved_view)
        images.append(
            PlaneImages(
                plane=view.plane,
                label=view.label,
                fixed=fixed_image,
                moved=moved_image,
                layer=_palette_png(_layer(moved_view, fixed_labels, moved_labels)),
                aspect=aspect,
                mime=mime,
            )
        )
    return images
