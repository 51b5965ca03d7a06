"""Displacement fields on disk: hyperreg's voxel format and ITK's world-millimetre format.

Two formats, both NIfTI with the fixed image's affine:

* ``"voxel"`` (default): channel last, ``(I, J, K, 3)`` (a 2D slice stored as ``(I, J, 1)``
  gives ``(I, J, 1, 2)``), vectors in voxels, i/j/k order, defined on the fixed grid,
  ``moved[x] = moving(x + u(x))``;
* ``"itk"``: ``(I, J, K, 1, 3)``, vector intent (1007), vectors in world millimetres in LPS
  (``diag(-1, -1, 1) · A[:3, :N] · u``), which SimpleITK's ``DisplacementFieldTransform`` and
  ANTs' ``antsApplyTransforms`` apply directly. A 2D slice in the world x-y plane, stored
  ``(I, J)`` or ``(I, J, 1)``, gets what ANTs writes for a 2D warp and reads back as one: a 2D
  vector image with 2 components, ``(I, J, 1, 1, 2)`` (``diag(-1, -1) · A[:2, :2] · u``); the
  ``descrip`` field records a fixed grid stored ``(I, J, 1)``, so that :func:`load_displacement`
  gives back the fixed image's layout (ITK reads an ``(I, J, 1)`` *image* file into a 2D image
  without its direction, so ANTs applies this field to the slice stored ``(I, J)``). A slice
  outside that plane (e.g. the coronal LIA neurite-oasis slices) stored ``(I, J, 1)`` is
  written as a 3D field of one slice, ``(I, J, 1, 1, 3)``, with in-plane vectors. Caveat: ITK's
  NIfTI reader (SimpleITK ``ReadImage``, ANTs) drops the size-1 slice axis of a *vector* file
  and keeps only the upper-left ``2 x 2`` of its direction, which for such a slice is singular
  or not the slice's own, so ITK and ANTs cannot read that field (nor any field with that
  header); in SimpleITK build the 3D field from the array and the fixed slice's 3D geometry
  (``GetImageFromArray(..., isVector=True)`` + ``CopyInformation``). ``hyperreg warp`` reads
  every layout.

:func:`load_displacement` reads either and returns voxels. Uses numpy and nibabel only (through
:mod:`hyperreg.geometry.io`); must not import torch or model code.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import NamedTuple

import nibabel as nib
import numpy as np

from hyperreg._errors import InputError, MissingInputError
from hyperreg.geometry.io import (
    SAVE_SUFFIXES,
    Volume,
    check_finite,
    format_of,
    read_raw,
    spatial_shape_of,
    to_nifti,
    write_nifti,
)

__all__ = [
    "DISPLACEMENT_FORMATS",
    "Displacement",
    "check_itk_grid",
    "load_displacement",
    "save_displacement",
]

logger = logging.getLogger(__name__)

DISPLACEMENT_FORMATS: tuple[str, ...] = ("voxel", "itk")
_NIFTI_INTENT_VECTOR = 1007
_RAS_TO_LPS = np.array([-1.0, -1.0, 1.0])  # x and y change sign between RAS and LPS
_ITK_DESCRIP = b"hyperreg displacement: ITK, LPS mm, fixed grid"
_STORED_ONE_SLICE = b"stored (I, J, 1)"  # in descrip: a 2D field's fixed grid had a third axis


def _volume_name(volume: Volume, role: str) -> str:
    return str(volume.path) if volume.path is not None else f"<in-memory {role}>"


def check_itk_grid(like: Volume) -> None:
    """Raise unless a displacement field on ``like``'s grid can be written in ITK format.

    Every 3D grid can, and every 2D slice stored ``(I, J, 1)``: in the world x-y plane as a 2D
    field ``(I, J, 1, 1, 2)``, otherwise as a 3D field of one slice, ``(I, J, 1, 1, 3)`` (see
    the module docstring for what ITK reads of that). A slice stored ``(I, J)`` is a 2D image
    for ITK, which keeps only the upper-left ``2 x 2`` of its direction, so its field is 2D,
    ``(I, J, 1, 1, 2)``, and the slice must lie in the world x-y plane.

    Args:
        like: The fixed image the field is defined on.

    Raises:
        ValueError: If a 2D slice stored ``(I, J)`` leaves the world x-y plane.
    """
    if like.ndim != 2 or len(like.disk_shape) != 2 or _in_xy_plane(like):
        return
    codes = "".join(str(c) for c in nib.aff2axcodes(like.affine))
    raise ValueError(
        f"check_itk_grid(): the 2D grid of '{_volume_name(like, 'fixed')}' (orientation "
        f"{codes}, stored {like.disk_shape}) must lie in the world x-y plane for a 2D ITK "
        "displacement field: ITK reads a 2D image with only the upper-left 2x2 of its "
        "direction; store the slice as (I, J, 1) (a 3D field of one slice is then written) "
        "or use the default 'voxel' format"
    )


def _in_xy_plane(like: Volume) -> bool:
    """Whether the in-plane axes of the 2D grid ``like`` lie in the world x-y plane."""
    columns = like.affine[:3, :2]
    return bool(np.all(np.abs(columns[2]) <= 1e-6 * np.linalg.norm(columns, axis=0)))


def _itk_2d(like: Volume) -> bool:
    """Whether ``like``'s ITK field is 2D with 2 components (ANTs's 2D warp), not 3D: a 2D slice
    stored ``(I, J)``, or stored ``(I, J, 1)`` in the world x-y plane."""
    return like.ndim == 2 and (len(like.disk_shape) == 2 or _in_xy_plane(like))


def _voxel_to_itk(disp: np.ndarray, like: Volume) -> np.ndarray:
    """``(N, *S)`` voxels -> ``(*S3, 1, C)`` LPS mm, ``S3`` = ``S`` (3D) or ``S + (1,)`` (2D);
    ``C = 2`` for a 2D ITK field (:func:`_itk_2d`), else 3."""
    channels = 2 if _itk_2d(like) else 3
    matrix = like.affine[:channels, : like.ndim]  # RAS mm per voxel step along each array axis
    world = np.einsum("rn,n...->...r", matrix, disp.astype(np.float64))  # RAS mm, channel last
    world *= _RAS_TO_LPS[:channels]
    grid3 = like.spatial_shape + ((1,) if like.ndim == 2 else ())
    return np.ascontiguousarray(world.reshape(grid3 + (1, channels)), dtype=np.float32)


def _itk_to_voxel(vectors: np.ndarray, affine: np.ndarray, ndim: int) -> np.ndarray:
    """Inverse of :func:`_voxel_to_itk`: ``(*S, C)`` LPS mm -> ``(N, *S)`` voxels.

    ``C = 3`` (3D, or a 2D slice written as a 3D field: the in-plane part is kept, by least
    squares) or ``C = 2`` (a 2D field in the world x-y plane, as ANTs writes one).
    """
    channels = vectors.shape[-1]
    matrix = affine[:channels, :ndim]
    world = vectors.astype(np.float64) * _RAS_TO_LPS[:channels]
    return np.einsum("nr,...r->n...", np.linalg.pinv(matrix), world).astype(np.float32)


def save_displacement(
    path: str | os.PathLike[str], disp: np.ndarray, like: Volume, *, format: str = "voxel"
) -> Path:
    """Write a displacement field as a channel-last NIfTI on the fixed grid, atomically.

    ``format="voxel"`` (hyperreg's on-disk default): **voxel units, i/j/k order, defined on the
    fixed grid, moved[x] = moving(x + u(x))**. Channel ``n`` is the shift along array axis ``n``
    of the fixed image (matrix indexing, not x/y/z world axes), in voxels of that grid. The field
    is moved to channel-last and reshaped to ``like.disk_shape + (N,)``: a 3D fixed image of disk
    shape ``(I, J, K)`` gives ``(I, J, K, 3)``; a 2D slice stored as ``(I, J, 1)`` gives
    ``(I, J, 1, 2)``. No intent code.

    ``format="itk"``: the displacement field ITK applies directly (SimpleITK
    ``DisplacementFieldTransform``, ANTs ``antsApplyTransforms``): vectors in world millimetres
    in LPS, ``d = diag(-1, -1, 1) @ A[:3, :N] @ u`` with ``A`` the fixed affine, NIfTI intent
    ``NIFTI_INTENT_VECTOR`` (1007), 5D shape ``(I, J, K, 1, 3)``; a 2D slice in the world x-y
    plane, stored ``(I, J)`` or ``(I, J, 1)``, a 2D field ``(I, J, 1, 1, 2)``
    (``diag(-1, -1) @ A[:2, :2] @ u``, ANTs's 2D warp; ``descrip`` ends in ``stored (I, J, 1)``
    for the latter); any other slice stored ``(I, J, 1)`` a 3D field of one slice,
    ``(I, J, 1, 1, 3)``, with in-plane vectors (ITK cannot read it, see the module docstring).
    It maps a fixed-grid point ``p`` to the moving point ``p + d(p)``, the same backward
    mapping as the voxel format.

    Both are stored as float32 with ``like.affine`` (sform and qform, with ``like.codes``), no
    scaling, and
    written via a temporary file and a rename, as in :func:`save_volume`.

    Args:
        path: Output file, ``.nii`` or ``.nii.gz``.
        disp: Array-like of shape ``(N, *S)`` with ``N = like.ndim`` and
            ``S = like.spatial_shape`` (no batch axis), in voxels.
        like: The fixed image the field is defined on.
        format: One of ``DISPLACEMENT_FORMATS``: ``"voxel"`` or ``"itk"``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: If the suffix is not ``.nii``/``.nii.gz``, if ``disp``'s shape is not
            ``(N, *S)``, if it has non-finite values, if ``format`` is unknown, or (ITK format)
            if a 2D slice stored ``(I, J)`` is not in the world x-y plane.
        OSError: If the file cannot be written.

    References:
        ITK displacement-field NIfTI layout as written by ANTs (Avants et al., ANTs/ITK);
        NIfTI-1 intent codes (nifti1.h).
    """
    fn = "save_displacement"
    path = Path(path)
    format_of(path, SAVE_SUFFIXES, fn)  # raises on a suffix it cannot write
    if format not in DISPLACEMENT_FORMATS:
        raise ValueError(f"{fn}(): 'format' must be one of {DISPLACEMENT_FORMATS}, got {format!r}")
    arr = np.asarray(disp)
    expected = (like.ndim, *like.spatial_shape)
    if arr.shape != expected:
        hint = (
            "; drop the batch axis first"
            if arr.shape[1:] == expected and arr.ndim == len(expected) + 1
            else ""
        )
        raise ValueError(
            f"{fn}(): 'disp' must have shape (N, *S) = {expected}, got {tuple(arr.shape)}{hint}"
        )
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{fn}(): 'disp' must be a real numeric array, got dtype {arr.dtype}")
    check_finite(fn, "disp", arr)
    if format == "itk":
        check_itk_grid(like)
        out = _voxel_to_itk(arr, like)
        img = to_nifti(out, like)
        img.header.set_intent("vector")
        one_slice = _itk_2d(like) and len(like.disk_shape) == 3
        img.header["descrip"] = _ITK_DESCRIP + (b" " + _STORED_ONE_SLICE if one_slice else b"")
        if like.ndim == 2 and not _itk_2d(like):  # the module docstring's caveat, said once
            warnings.warn(
                f"'{path}': the ITK field of a slice outside the world x-y plane is a 3D field of "
                "one slice, which SimpleITK's and ANTs' NIfTI readers cannot read (they drop "
                "its slice axis); hyperreg warp applies it, or use the voxel format",
                stacklevel=2,
            )
    else:
        # a channel-last view, no copy: nibabel writes it channel by channel in NIfTI's
        # Fortran order, one channel's bytes at a time (a 3 x 256³ field held once, not thrice)
        out = np.moveaxis(arr.astype(np.float32, copy=False), 0, -1)
        out = out.reshape(like.disk_shape + (like.ndim,))
        img = to_nifti(out, like)
        img.header["descrip"] = b"hyperreg displacement: voxels, i/j/k order, fixed grid"
    write_nifti(img, path)
    logger.debug("%s(): wrote '%s' shape %s format %s", fn, path, out.shape, format)
    return path


class Displacement(NamedTuple):
    """A displacement field read from disk (see :func:`load_displacement`).

    Attributes:
        disp: ``(N, *S)`` float32, voxels of ``grid``, i/j/k order, ``moved[x] = moving(x + u(x))``.
        grid: The fixed grid the field is defined on (zero data, the file's affine and layout).
        format: ``"voxel"`` or ``"itk"``, the on-disk format it was read from.
    """

    disp: np.ndarray
    grid: Volume
    format: str


def load_displacement(path: str | os.PathLike[str]) -> Displacement:
    """Read a displacement field in either on-disk format and return it in voxels.

    Detection: a file with intent code ``NIFTI_INTENT_VECTOR`` (1007) or a 5D array
    ``(I, J, K, 1, C)`` is the ITK format (LPS world mm, converted back with the inverse of
    :func:`save_displacement`'s formula; ``C = 3``, or ``C = 2`` for an x-y plane 2D field as
    other tools write it); otherwise the array must be ``disk_shape + (N,)`` in voxels
    (hyperreg's default). ``N`` is the number of spatial dimensions left after dropping
    trailing size-1 axes of the grid, as in :func:`load_volume`: an ITK field of one slice
    ``(I, J, 1, 1, 3)`` is a 2D field. The grid keeps the fixed image's disk layout: ``(I, J)``
    for a 2D ITK field ``(I, J, 1, 1, 2)`` (a 2D image, as ANTs writes one) unless its
    ``descrip`` says ``stored (I, J, 1)`` (written by :func:`save_displacement`), ``(I, J, 1)``
    for a one-slice 3D field.

    Args:
        path: ``.nii`` or ``.nii.gz`` file.

    Returns:
        A :class:`Displacement`: the field ``(N, *S)`` in voxels and its fixed grid.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the suffix is wrong, the file is unreadable or truncated, the array is not
            a displacement field of one of the two layouts, it has non-finite values, or (ITK,
            2D field) its grid is not in the world x-y plane.
    """
    fn = "load_displacement"
    path = Path(path)
    suffix = format_of(path, SAVE_SUFFIXES, fn)
    if not path.is_file():
        raise MissingInputError(fn, "no such file: '{path}'", "path", path=path)
    raw, affine, codes = read_raw(path, suffix)
    header = nib.load(path).header
    intent = int(header["intent_code"])
    shape = tuple(int(n) for n in raw.shape)
    itk = intent == _NIFTI_INTENT_VECTOR or raw.ndim == 5
    grid_disk = shape[:3] if itk else shape[:-1]
    channels = shape[-1] if raw.ndim >= 3 else 0
    if itk and raw.ndim == 5 and channels == 2 and shape[2] == 1:  # a 2D ITK field
        grid_disk = shape[:3] if _STORED_ONE_SLICE in bytes(header["descrip"]) else shape[:2]
    try:
        spatial = spatial_shape_of(path, grid_disk)
    except ValueError:
        spatial = ()
    layout_ok = raw.dtype.kind in "biuf" and channels in (2, 3) and len(spatial) == channels
    if itk:  # 3D: 3 vectors; 2D: 3 (one-slice 3D field, hyperreg) or 2 (x-y plane)
        layout_ok = (
            raw.dtype.kind in "biuf"
            and raw.ndim == 5
            and shape[3] == 1
            and (channels == 3 if len(spatial) == 3 else len(spatial) == 2 and channels in (2, 3))
        )
    if not layout_ok:
        expected = (
            "(I, J, K, 1, 3), (I, J, 1, 1, 3) or (I, J, 1, 1, 2)"
            if itk
            else "(I, J, K, 3) or (I, J, 1, 2)"
        )
        kind = "an ITK vector field" if itk else "a voxel displacement field"
        raise InputError(
            fn,
            "'{path}' must hold {kind} of shape {expected}, got shape {shape} dtype {dtype}",
            "path",
            path=path,
            kind=kind,
            expected=expected,
            shape=shape,
            dtype=raw.dtype,
        )
    vectors = raw.astype(np.float32).reshape(spatial + (channels,))
    check_finite(fn, str(path), vectors)
    grid = Volume(
        data=np.zeros(spatial, np.float32),
        affine=affine,
        disk_shape=grid_disk,
        path=path,
        codes=codes,
    )
    if itk:
        if channels == 2:  # a 2D ITK field: its grid must lie in the world x-y plane
            check_itk_grid(Volume(data=grid.data, affine=affine, disk_shape=spatial, path=path))
        disp = _itk_to_voxel(vectors, affine, len(spatial))
    else:
        disp = np.ascontiguousarray(np.moveaxis(vectors, -1, 0))
    return Displacement(disp=disp, grid=grid, format="itk" if itk else "voxel")
