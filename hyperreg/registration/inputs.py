"""The inputs of a pair: one file (or in-memory volume) read as the pipeline reads it, and an
initial affine given by the user. Must not import training, apps or cli.
"""

from __future__ import annotations

from hyperreg._checks import check_option
from hyperreg._errors import InputError, passed_as
from hyperreg.geometry.affine import AffineTransform, load_initial_affine, world_overlap
from hyperreg.geometry.io import Volume, check_same_ndim, has_header, load_volume
from hyperreg.registration.pairs import PathLike

__all__ = ["NPZ_GEOMETRIES", "check_registrable", "initial_transform", "load_input"]

NPZ_GEOMETRIES = ("fixed", "identity")
"""Geometry of a header-less (npz) input: the fixed image's, or 1 mm voxels, world = index."""


def load_input(
    value: PathLike | Volume,
    *,
    label: bool = False,
    npz_geometry: str | None = None,
    fixed: Volume | None = None,
    warn_constant: bool = True,
    replace_nonfinite: float | None = None,
) -> Volume:
    """Read one input of a pair (a :class:`~hyperreg.geometry.io.Volume` passes through).

    Args:
        value: File (NIfTI, MGZ or npz) or Volume.
        label: Read as a label map (int32).
        npz_geometry: For a header-less file (npz): ``"fixed"`` (the geometry of ``fixed``) or
            ``"identity"`` (1 mm voxels, world = voxel index); None refuses such a file. Files
            with a header ignore it.
        fixed: The fixed image, for ``"fixed"`` (None while reading the fixed image itself).
        warn_constant: Warn when an image is constant (False: the caller refuses it,
            :func:`check_registrable`).
        replace_nonfinite: For an image (not a label map): the value its NaN/inf voxels take
            (logged); None (default): such an image is an error.

    Returns:
        The :class:`~hyperreg.geometry.io.Volume`.

    Raises:
        InputError: If ``value`` is header-less and ``npz_geometry`` is None, or ``"fixed"``
            for the fixed image itself (``argument`` ``"npz_geometry"``), or ``npz_geometry``
            is not one of :data:`NPZ_GEOMETRIES`.
        FileNotFoundError, ValueError: As :func:`~hyperreg.geometry.io.load_volume`.
    """
    fn = "load_input"
    check_option(fn, "npz_geometry", npz_geometry, (*NPZ_GEOMETRIES, None))
    if isinstance(value, Volume):
        return value
    nonfinite = None if label else replace_nonfinite
    read = {"label": label, "replace_nonfinite": nonfinite, "warn_constant": warn_constant}
    if has_header(value):
        return load_volume(value, **read)
    if npz_geometry is None:
        raise InputError(
            fn,
            "'{path}' has no header (npz: no voxel size, orientation or position); choose its "
            'geometry with {0}: "fixed" (that of the fixed image) or "identity" (1 mm voxels, '
            "world = voxel index)",
            "npz_geometry",
            path=value,
        )
    if npz_geometry == "fixed" and fixed is None:
        raise InputError(
            fn,
            "'{path}' is the fixed image and has no header, so it cannot take the geometry of "
            'the fixed image; use {0} "identity" (1 mm voxels, world = voxel index) or give the '
            "fixed image with a header",
            "npz_geometry",
            path=value,
        )
    if npz_geometry == "fixed":
        return load_volume(value, geometry_from=fixed, **read)
    return load_volume(value, assume_identity=True, **read)


def check_registrable(
    fn: str, moving: Volume, fixed: Volume, *, init: str, initial: AffineTransform | None
) -> None:
    """Refuse a pair whose registration cannot mean anything, before any stage runs.

    An empty or constant image (all voxels equal: nothing to align, every similarity flat)
    and, with ``init="none"`` and no initial transform, two images whose world bounding boxes
    do not intersect (:func:`~hyperreg.geometry.affine.world_overlap`: the moved image would
    be empty and Dice 0) are errors, not warnings followed by outputs.

    Args:
        fn: The public function to name in the message.
        moving, fixed: The pair as read.
        init: The affine stage, ``"affine"``, ``"rigid"`` or ``"none"``.
        initial: The initial transform, or None.

    Raises:
        InputError: For 2D with 3D (:func:`~hyperreg.geometry.io.check_same_ndim`), a constant
            or empty image (``argument`` "moving" or "fixed"), or no overlap with
            ``init="none"`` (``argument`` "init").
    """
    check_same_ndim(fn, moving, fixed)  # 2D with 3D is said first, whatever they hold
    for role, volume in (("moving", moving), ("fixed", fixed)):
        data = volume.data
        if data.size == 0 or data.min() == data.max():
            what = "empty" if data.size == 0 else f"constant (all voxels = {float(data.flat[0])})"
            raise InputError(
                fn,
                "{0} '{path}' is {what}, so it holds nothing to register; check that the right "
                "file was given (an image with content, not a mask or a blank volume)",
                role,
                path=_name(volume),
                what=what,
            )
    if init == "none" and initial is None and not world_overlap(moving, fixed):
        raise InputError(
            fn,
            "'{moving}' and '{fixed}' do not overlap in world space, so with {0} 'none' the "
            "moved image would be empty; use {0} 'affine' or 'rigid' (which starts from the "
            "centres of mass), or fix the headers",
            "init",
            moving=_name(moving),
            fixed=_name(fixed),
        )


def _name(volume: Volume) -> str:
    return str(volume.path) if volume.path is not None else "<in-memory volume>"


def initial_transform(
    initial: AffineTransform | PathLike | None, moving: Volume, fixed: Volume
) -> AffineTransform | None:
    """``initial_affine`` as a transform: a file read by :func:`load_initial_affine`, whose
    errors become an :class:`InputError` of argument ``"initial_affine"``."""
    if initial is None or isinstance(initial, AffineTransform):
        return initial
    with passed_as(path="initial_affine"):
        return load_initial_affine(initial, moving, fixed)
