"""Volumes for the browser: one registration's images as small NIfTI byte strings for NiiVue.

:func:`nifti_bytes` turns an array on the fixed grid into an uncompressed (or gzip) NIfTI-1 file
in memory, with the fixed image's affine; :func:`display_volumes` builds every view the λ
explorer (:mod:`hyperreg.apps.view`) and the sweep page (:mod:`hyperreg.apps.view_page`) show:
the moved image, the fixed-image edges, a checkerboard, the |difference|, the Jacobian
determinant with its folding voxels, and label contours. Images are quantised to uint8 (the
browser only draws them; every number the page reports is computed from the float results).
Numpy and nibabel (torch only for the Jacobian, lazily); must not import the server or cli.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence

import nibabel as nib
import numpy as np

__all__ = [
    "DISPLAY_WINDOWS",
    "JACOBIAN_SCALE",
    "checker_mask",
    "display_volumes",
    "edges_nd",
    "encode_views",
    "jacobian_numpy",
    "label_contours",
    "nifti_bytes",
    "plane_of",
    "static_view",
    "to_uint8",
]

JACOBIAN_SCALE = 0.02
"""The Jacobian determinant is sent as uint8 with this scale factor (``scl_slope``): J in
[0, 5.1] in steps of 0.02; larger values saturate, J ≤ 0 shows 0 (folding has its own mask)."""

DISPLAY_WINDOWS = {
    "jac": (0.0, 2.0),
    "fold": (0.0, 1.0),
    "contours": (0.0, 3.0),
    "diff": (0.0, 128.0),
    "edges": (0.0, 1.0),
}
"""Display windows (``cal_min``, ``cal_max``, real units) of the views; others 0-255."""


def to_uint8(data: np.ndarray, low: float, high: float) -> np.ndarray:
    """``data`` mapped linearly from ``[low, high]`` to ``[0, 255]`` (clipped), uint8.
    A flat range (``high <= low``) gives zeros."""
    if not high > low:
        return np.zeros(data.shape, dtype=np.uint8)
    scaled = (np.asarray(data, dtype=np.float32) - low) * (255.0 / (high - low))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def nifti_bytes(
    data: np.ndarray,
    affine: np.ndarray,
    *,
    cal: tuple[float, float] | None = None,
    slope: float = 1.0,
    compress: bool = False,
    stride: Sequence[int] | None = None,
) -> bytes:
    """An in-memory NIfTI-1 file of ``data`` (2D ``(I, J)`` becomes ``(I, J, 1)``).

    Args:
        data: Array on the grid of ``affine``, shape ``(I, J)`` or ``(I, J, K)``, any dtype
            NIfTI holds (uint8 here).
        affine: ``(4, 4)`` voxel-to-world (RAS mm) matrix of ``data``'s grid.
        cal: Display window ``(cal_min, cal_max)`` written into the header, in stored units
            times ``slope``; None leaves it to the viewer.
        slope: ``scl_slope`` (real value = stored value × slope).
        compress: gzip the file (NiiVue recognises the gzip magic).
        stride: Keep every ``stride[n]``-th voxel along axis ``n`` (the affine is scaled to
            match); None keeps every voxel.

    Returns:
        The file's bytes.
    """
    data = np.asarray(data)
    affine = np.asarray(affine, dtype=np.float64).copy()
    if stride is not None and any(s > 1 for s in stride):
        data = data[tuple(slice(None, None, int(s)) for s in stride)]
        affine[:3, : len(stride)] = affine[:3, : len(stride)] * np.asarray(stride, dtype=float)
    if data.ndim == 2:
        data = data[:, :, None]
    image = nib.Nifti1Image(data, affine)
    header = image.header
    header.set_sform(affine, code=1)
    header.set_qform(affine, code=1)
    header.set_slope_inter(slope, 0.0)
    if cal is not None:
        header["cal_min"], header["cal_max"] = cal
    raw = image.to_bytes()
    return gzip.compress(raw, compresslevel=6) if compress else raw


def plane_of(affine: np.ndarray) -> str:
    """The anatomical plane of a 2D image's one slice: ``"axial"``, ``"coronal"`` or
    ``"sagittal"``, from the world axis its third array axis (the slice normal) points along."""
    normal = int(np.argmax(np.abs(np.asarray(affine)[:3, 2])))
    return ("sagittal", "coronal", "axial")[normal]


def edges_nd(image: np.ndarray, fraction: float = 0.1) -> np.ndarray:
    """Boolean map of the strongest edges of a 2D or 3D image: the ``fraction`` of voxels with
    the largest gradient magnitude (central differences) among those with a non-zero gradient
    (:func:`hyperreg.figures.overlays.edge_mask` in any dimension); all False when flat."""
    gradients = np.gradient(np.asarray(image, dtype=np.float32))
    magnitude = np.sqrt(sum(g * g for g in gradients))
    varying = magnitude[magnitude > 0]
    if varying.size == 0:
        return np.zeros(image.shape, dtype=bool)
    return magnitude >= np.quantile(varying, 1 - fraction)


def label_contours(labels: np.ndarray) -> np.ndarray:
    """Boolean map of label borders in 2D or 3D: voxels whose label differs from a face
    neighbour's along any axis (both sides of each border, background included)."""
    labels = np.asarray(labels)
    border = np.zeros(labels.shape, dtype=bool)
    for axis in range(labels.ndim):
        differ = np.diff(labels, axis=axis) != 0
        head = [slice(None)] * labels.ndim
        tail = [slice(None)] * labels.ndim
        head[axis] = slice(0, -1)
        tail[axis] = slice(1, None)
        border[tuple(head)] |= differ
        border[tuple(tail)] |= differ
    return border


def display_volumes(
    moved: np.ndarray,
    fixed: np.ndarray,
    disp: np.ndarray,
    *,
    moving_range: tuple[float, float],
    fixed_range: tuple[float, float],
    moved_seg: np.ndarray | None = None,
    fixed_seg: np.ndarray | None = None,
    kinds: Sequence[str] = ("moved", "checker", "diff", "jac", "fold", "contours"),
) -> dict[str, np.ndarray]:
    """The λ-dependent views of one registration, each uint8 on the fixed grid.

    Args:
        moved: Moved image ``S`` (moving intensities).
        fixed: Fixed image ``S``.
        disp: Deformable displacement ``(N, *S)`` in fixed voxels (its Jacobian is shown).
        moving_range: ``(low, high)`` of the moving image: ``moved`` is scaled with it, the same
            at every λ, so grey levels compare across λ.
        fixed_range: ``(low, high)`` of the fixed image.
        moved_seg, fixed_seg: Label maps ``S`` for the contours, or None.
        kinds: Which of ``"moved"`` (0-255), ``"checker"`` (moved/fixed checkerboard, both
            min-max scaled), ``"diff"`` (|moved − fixed| of the scaled images, 0-1 as
            0-255), ``"jac"`` (J in units of :data:`JACOBIAN_SCALE`), ``"fold"`` (1 where
            J ≤ 0) and ``"contours"`` (1: moved-label borders, 2: fixed-label borders, 3: both)
            to build.

    Returns:
        ``{kind: uint8 array}``; ``"contours"`` only with both label maps.
    """
    moved8 = to_uint8(moved, *moving_range)
    fixed8 = to_uint8(fixed, *fixed_range)
    out: dict[str, np.ndarray] = {}
    if "moved" in kinds:
        out["moved"] = moved8
    if "checker" in kinds:
        out["checker"] = np.where(checker_mask(moved8.shape), moved8, fixed8)
    if "diff" in kinds:
        diff = np.abs(moved8.astype(np.int16) - fixed8.astype(np.int16))
        out["diff"] = diff.astype(np.uint8)
    if "jac" in kinds or "fold" in kinds:
        jac = jacobian_numpy(disp)
        if "jac" in kinds:
            out["jac"] = np.clip(np.rint(jac / JACOBIAN_SCALE), 0, 255).astype(np.uint8)
        if "fold" in kinds:
            out["fold"] = (jac <= 0).astype(np.uint8)
    if "contours" in kinds and moved_seg is not None and fixed_seg is not None:
        contours = label_contours(moved_seg).astype(np.uint8)
        out["contours"] = contours + 2 * label_contours(fixed_seg).astype(np.uint8)
    return out


def checker_mask(shape: Sequence[int], squares: int = 8) -> np.ndarray:
    """Boolean tiles over ``shape`` (2D or 3D): True where the sum of the tile indices is even.
    Tiles are cubes of side ``ceil(max(shape) / squares)`` voxels
    (:func:`hyperreg.figures.slices.checkerboard` in any dimension)."""
    side = -(-max(shape) // squares)
    index = np.indices(tuple(shape), sparse=True)
    return sum(i // side for i in index) % 2 == 0


def jacobian_numpy(disp: np.ndarray) -> np.ndarray:
    """Jacobian determinant ``S`` of ``x + disp(x)`` for a field ``(N, *S)`` in voxels
    (:func:`hyperreg.method.spatial.jacobian_determinant`, on a numpy array)."""
    import torch

    from hyperreg.method.spatial import jacobian_determinant

    field = torch.from_numpy(np.ascontiguousarray(disp, dtype=np.float32))[None]
    return jacobian_determinant(field)[0, 0].numpy()


def encode_views(views: dict[str, np.ndarray], affine: np.ndarray) -> dict[str, bytes]:
    """Each view of :func:`display_volumes` as uncompressed NIfTI bytes (:func:`nifti_bytes`)
    with its display window (:data:`DISPLAY_WINDOWS`); the Jacobian scaled by
    :data:`JACOBIAN_SCALE`."""
    return {
        name: nifti_bytes(
            data,
            affine,
            cal=DISPLAY_WINDOWS.get(name, (0.0, 255.0)),
            slope=JACOBIAN_SCALE if name == "jac" else 1.0,
        )
        for name, data in views.items()
    }


def static_view(
    kind: str,
    moving: np.ndarray,
    fixed: np.ndarray,
    affine: np.ndarray,
    moving_range: tuple[float, float],
    fixed_range: tuple[float, float],
) -> bytes:
    """The NIfTI bytes of a view that does not depend on λ: ``"fixed"`` or ``"moving"`` (on
    the fixed grid) as uint8 over its range, else the fixed image's edges (:func:`edges_nd`)."""
    if kind == "fixed":
        data = to_uint8(fixed, *fixed_range)
    elif kind == "moving":
        data = to_uint8(moving, *moving_range)
    else:
        data = edges_nd(fixed).astype(np.uint8)
    return nifti_bytes(data, affine, cal=DISPLAY_WINDOWS.get(kind, (0.0, 255.0)))
