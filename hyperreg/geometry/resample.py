"""Resampling between voxel grids through both affines, with SimpleITK.

This module owns the move of an image or label map from its own voxel grid onto another one
(in practice: the moving image onto the fixed grid before voxel-to-voxel registration). A
:class:`~hyperreg.geometry.io.Volume` (numpy array in on-disk ``(I, J[, K])`` order plus a RAS
``(4, 4)``
affine) is turned into a SimpleITK image (LPS origin, spacing, direction; ITK arrays are stored
``(K, J, I)``), resampled by ``sitk.Resample`` with the identity transform onto the target grid,
and turned back. No interpolation is written by hand. A 2D volume is treated as a 3D image with
one slice, whose slice axis is the third column of its affine (for the neurite-oasis LIA slices
that is the anterior axis), so 2D volumes must lie in the same world plane.

Must not import torch, model or cli code (numpy, nibabel and SimpleITK only).
"""

from __future__ import annotations

import logging

import numpy as np
import SimpleITK as sitk
from nibabel.orientations import aff2axcodes

from hyperreg.geometry.io import Volume

__all__ = [
    "affine_3d",
    "conformed_grid",
    "describe_grid",
    "grid_geometry",
    "isotropic_grid",
    "resample_through",
    "resample_to",
    "to_sitk",
]

logger = logging.getLogger(__name__)

_RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0])
_PLANE_TOL = 1e-3  # voxels: how far a 2D grid may lie off the other's slice plane
SPACING_TOL = 1e-3  # mm: voxels this close to a target spacing are not resampled


def affine_3d(volume: Volume) -> np.ndarray:
    """The ``(4, 4)`` voxel-to-RAS affine of ``volume`` as a 3D grid (2D: one slice), float64.

    For a 2D volume whose affine has a zero third column (a degenerate slice axis), the slice
    axis becomes the unit normal of the image plane; it spans a single slice, so its length
    never scales a coordinate that is used.
    """
    affine = volume.affine.copy()
    if volume.ndim == 2 and np.linalg.norm(affine[:3, 2]) < 1e-8:
        normal = np.cross(affine[:3, 0], affine[:3, 1])
        affine[:3, 2] = normal / np.linalg.norm(normal)
    return affine


def grid_geometry(fn: str, volume: Volume) -> tuple[tuple[int, ...], tuple, tuple, tuple]:
    """``(size, origin, spacing, direction)`` of ``volume``'s grid in ITK's LPS convention.

    A 2D volume is a 3D grid of one slice (see :func:`to_sitk`). ``fn`` names the caller in the
    error message.

    Raises:
        ValueError: If the affine's ``3 x 3`` part is singular.
    """
    affine = affine_3d(volume)
    matrix = affine[:3, :3]
    spacing = np.linalg.norm(matrix, axis=0)
    if not np.all(spacing > 0) or abs(np.linalg.det(matrix)) < 1e-12:
        name = str(volume.path) if volume.path is not None else "<in-memory volume>"
        raise ValueError(
            f"{fn}(): the affine of '{name}' must be invertible, got voxel-to-world matrix "
            f"{matrix.round(4).tolist()}"
        )
    direction = _RAS_TO_LPS @ (matrix / spacing)
    origin = _RAS_TO_LPS @ affine[:3, 3]
    size = volume.spatial_shape + ((1,) if volume.ndim == 2 else ())
    return (
        tuple(int(n) for n in size),
        tuple(float(v) for v in origin),
        tuple(float(v) for v in spacing),
        tuple(float(v) for v in direction.ravel()),
    )


def isotropic_grid(volume: Volume, spacing: float) -> Volume | None:
    """The grid of ``volume`` with isotropic ``spacing`` mm voxels, or None when its voxels
    already have that size (within :data:`SPACING_TOL` on every axis).

    The new grid keeps the array axis order, orientation and the world position of voxel 0;
    axis ``n`` has ``max(1, round(shape[n] · spacing[n] / spacing))`` voxels, so it covers the
    same field of view up to one voxel. Used for training at a voxel size
    (``TrainConfig.spacing``) and for running a model at the voxel size it was trained at
    (``ModelConfig.spacing``).

    Args:
        volume: Any volume (only its shape and affine are used).
        spacing: Target voxel size in mm, > 0.

    Returns:
        A :class:`~hyperreg.geometry.io.Volume` of zeros (float32) on the new grid, or None.

    Raises:
        ValueError: If ``spacing`` is not positive.
    """
    if not spacing > 0:
        raise ValueError(f"isotropic_grid(): 'spacing' must be > 0 mm, got {spacing}")
    current = np.asarray(volume.spacing)
    if np.all(np.abs(current - spacing) <= SPACING_TOL):
        return None
    shape = tuple(max(1, round(n * s / spacing)) for n, s in zip(volume.spatial_shape, current))
    affine = volume.affine.copy()
    for axis, size in enumerate(current):
        affine[:3, axis] *= spacing / size
    return Volume(np.zeros(shape, np.float32), affine, shape)


def conformed_grid(volume: Volume, spacing: float, orientation: str = "RAS") -> Volume | None:
    """The grid a model trained in a fixed storage orientation sees ``volume`` on.

    The array axes of ``volume`` are permuted and flipped to the closest match of
    ``orientation`` (nibabel's ``io_orientation``: an oblique scan keeps its obliquity), then
    given isotropic ``spacing`` mm voxels (``spacing`` 0: the smallest voxel size of the
    volume); the grid covers the same field of view up to one voxel. The same anatomy stored
    LIA or RAS therefore lands on the same grid, so the network sees every pair in the
    orientation it was trained in (voxelmorph and SynthMorph users meet the opposite: storage
    order changes the result).

    Args:
        volume: A 3D volume (only its shape and affine are used).
        spacing: Voxel size in mm, >= 0.
        orientation: Three axis codes, e.g. ``"RAS"`` or ``"LIA"``.

    Returns:
        A :class:`~hyperreg.geometry.io.Volume` of zeros (float32) on the new grid, or None
        when ``volume`` already is on such a grid (same axes, voxels within
        :data:`SPACING_TOL`).

    Raises:
        ValueError: If ``volume`` is not 3D, ``spacing`` is negative or ``orientation`` is not
            three distinct axis codes.

    References:
        nibabel.orientations (``io_orientation``, ``ornt_transform``, ``inv_ornt_aff``).
    """
    from nibabel.orientations import axcodes2ornt, inv_ornt_aff, io_orientation, ornt_transform

    if volume.ndim != 3:
        raise ValueError(f"conformed_grid(): needs a 3D volume, got shape {volume.spatial_shape}")
    if not spacing >= 0:
        raise ValueError(f"conformed_grid(): 'spacing' must be >= 0 mm, got {spacing}")
    codes = tuple(orientation.upper())
    try:
        target = axcodes2ornt(codes)
    except Exception as err:  # nibabel raises ValueError or KeyError on bad codes
        raise ValueError(
            f"conformed_grid(): 'orientation' must be three axis codes such as 'RAS', got "
            f"{orientation!r}"
        ) from err
    if len(codes) != 3 or np.isnan(target).any():
        raise ValueError(
            f"conformed_grid(): 'orientation' must be three axis codes such as 'RAS', got "
            f"{orientation!r}"
        )
    shape = np.asarray(volume.spatial_shape)
    transform = ornt_transform(io_orientation(volume.affine), target)
    affine = volume.affine @ inv_ornt_aff(transform, shape)
    order = transform[:, 0].astype(int)
    new_shape = np.empty(3, int)
    new_shape[order] = shape
    current = np.sqrt((affine[:3, :3] ** 2).sum(0))
    size = float(spacing) if spacing > 0 else float(current.min())
    permuted = not np.array_equal(order, np.arange(3)) or bool((transform[:, 1] < 0).any())
    if not permuted and np.all(np.abs(current - size) <= SPACING_TOL):
        return None
    voxels = tuple(max(1, round(n * s / size)) for n, s in zip(new_shape, current))
    for axis in range(3):
        affine[:3, axis] *= size / current[axis]
    return Volume(np.zeros(voxels, np.float32), affine, voxels)


def to_sitk(volume: Volume) -> sitk.Image:
    """Convert a volume to a 3D SimpleITK image with the same world geometry.

    ITK works in LPS millimetres, nibabel in RAS: the origin is ``diag(-1, -1, 1) @ t`` and the
    direction ``diag(-1, -1, 1) @ M / spacing``, with ``M`` the affine's ``3 x 3`` part and
    ``spacing`` its column norms (mm). Voxel ``(i, j, k)`` of ``volume.data`` is pixel index
    ``(i, j, k)`` of the image (``GetArrayFromImage`` returns the array as ``(K, J, I)``).

    Args:
        volume: 2D ``(I, J)`` or 3D ``(I, J, K)`` volume; a 2D one becomes a ``(I, J, 1)`` image
            whose slice axis is the third affine column.

    Returns:
        A 3D ``sitk.Image`` holding a copy of the data (pixel type from the numpy dtype).

    Raises:
        ValueError: If the affine's ``3 x 3`` part is singular.
    """
    size, origin, spacing, direction = grid_geometry("to_sitk", volume)
    data = volume.data.reshape(size)
    image = sitk.GetImageFromArray(np.ascontiguousarray(data.transpose(2, 1, 0)))
    image.SetOrigin(origin)
    image.SetSpacing(spacing)
    image.SetDirection(direction)
    return image


def describe_grid(volume: Volume) -> str:
    """One-line grid description for messages: ``shape (..), spacing (..), orientation XYZ``.

    Args:
        volume: Any volume.

    Returns:
        E.g. ``"shape (160, 192), spacing (1.0, 1.0), orientation LIA"`` (spacing in mm, rounded
        to 4 decimals; orientation as ``nibabel.aff2axcodes`` of the full affine).
    """
    spacing = tuple(round(s, 4) for s in volume.spacing)
    codes = "".join(str(c) for c in aff2axcodes(affine_3d(volume)))
    return f"shape {volume.spatial_shape}, spacing {spacing}, orientation {codes}"


def _check_same_plane(moving: Volume, fixed: Volume) -> None:
    """2D only: the fixed slice plane must lie within the moving slice (|k| < 0.5 voxel)."""
    last_i, last_j = fixed.spatial_shape[0] - 1, fixed.spatial_shape[1] - 1
    corners = np.array([[0, 0, 0, 1], [last_i, 0, 0, 1], [0, last_j, 0, 1]], np.float64).T
    to_moving = np.linalg.inv(affine_3d(moving)) @ affine_3d(fixed)
    offset = float(np.max(np.abs((to_moving @ corners)[2])))
    if offset > 0.5 + _PLANE_TOL:
        name = str(moving.path) if moving.path is not None else "<in-memory moving>"
        raise ValueError(
            f"resample_to(): the 2D slice '{name}' and the fixed 2D slice lie in different "
            f"world planes (the fixed plane is up to {offset:.3g} slices away from the moving "
            "one); register 3D volumes instead"
        )


def resample_to(moving: Volume, fixed: Volume, *, label: bool = False) -> Volume:
    """Resample ``moving`` onto the voxel grid of ``fixed`` through both affines.

    Every fixed voxel ``x`` gets ``moving`` interpolated at the world point
    ``fixed.affine @ x``, i.e. at moving voxel ``inv(moving.affine) @ fixed.affine @ x``
    (``sitk.Resample`` with the identity transform). Differences in shape, spacing (including
    anisotropic voxels), orientation and storage order are all handled this way. Points outside
    the moving image get 0. Nothing is normalised or rescaled.

    Args:
        moving: Image (float) or label map (integer) to resample, 2D or 3D.
        fixed: Volume whose grid (shape, affine, disk layout) the result takes; its data are not
            used.
        label: Label map: nearest-neighbour interpolation, so the result holds only label ids
            present in ``moving`` (plus 0 outside it), returned as int32. Otherwise linear
            interpolation, returned as float32.

    Returns:
        A :class:`~hyperreg.geometry.io.Volume` with ``fixed``'s spatial shape, affine and disk
        shape, and ``moving``'s path (so messages still name the moving file).

    Raises:
        ValueError: If ``moving`` and ``fixed`` differ in dimensionality, if an affine is
            singular, if a label map is not integer-typed, or (2D) if the two slices lie in
            different world planes.

    References:
        ITK's physical-space resampling (``itk::ResampleImageFilter``, Insight Toolkit);
        nibabel's RAS affine convention.
    """
    fn = "resample_to"
    if moving.ndim != fixed.ndim:
        raise ValueError(
            f"{fn}(): 'moving' and 'fixed' must both be 2D or both 3D, got shapes "
            f"{moving.spatial_shape} and {fixed.spatial_shape}"
        )
    if label and moving.data.dtype.kind not in "iub":
        raise ValueError(
            f"{fn}(): a label map must be integer-typed, got dtype {moving.data.dtype}; "
            "load it with load_volume(..., label=True)"
        )
    if moving.ndim == 2:
        _check_same_plane(moving, fixed)
    logger.debug("%s(): '%s' -> %s", fn, moving.path, describe_grid(fixed))
    return resample_through(moving, fixed, sitk.Transform(), label=label, fn=fn)


def resample_through(
    moving: Volume,
    fixed: Volume,
    transform: sitk.Transform,
    *,
    label: bool = False,
    fn: str = "resample_through",
) -> Volume:
    """``moving`` sampled on ``fixed``'s grid through an ITK transform, one interpolation.

    Fixed voxel ``x`` takes ``moving`` at the physical point ``transform(p)``, where ``p`` is the
    LPS point of ``x`` (ITK transforms map fixed points to moving points); points outside
    ``moving`` get 0. The one place where hyperreg calls ``sitk.Resample``.

    Args:
        moving: Image (float) or label map (integer), 2D or 3D.
        fixed: Volume whose grid (shape, affine, disk layout, header codes) the result takes.
        transform: A 3D ITK transform in LPS mm (``sitk.Transform()`` is the identity).
        label: Nearest neighbour, int32 out; otherwise linear, float32 out.
        fn: Caller name for error messages.

    Returns:
        A :class:`~hyperreg.geometry.io.Volume` on ``fixed``'s grid with ``moving``'s path.

    Raises:
        ValueError: If an affine is singular.
    """
    data = moving.data.astype(np.int32 if label else np.float32, copy=False)  # to_sitk copies
    image = to_sitk(Volume(data=data, affine=moving.affine, disk_shape=moving.disk_shape))
    size, origin, spacing, direction = grid_geometry(fn, fixed)
    resampled = sitk.Resample(
        image,
        size,
        transform,
        sitk.sitkNearestNeighbor if label else sitk.sitkLinear,
        origin,
        spacing,
        direction,
        0,
        sitk.sitkInt32 if label else sitk.sitkFloat32,
    )
    out = sitk.GetArrayFromImage(resampled).transpose(2, 1, 0).reshape(fixed.spatial_shape)
    return Volume(
        data=np.ascontiguousarray(out, dtype=np.int32 if label else np.float32),
        affine=fixed.affine,
        disk_shape=fixed.disk_shape,
        path=moving.path,
        codes=fixed.codes,
    )
