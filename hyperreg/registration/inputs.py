"""The inputs of a pair: one file (or in-memory volume) read as the pipeline reads it, and an
initial affine given by the user. Must not import training, apps or cli.
"""

from __future__ import annotations

from hyperreg._checks import check_option
from hyperreg._errors import InputError, passed_as
from hyperreg.geometry.affine import AffineTransform, load_initial_affine
from hyperreg.geometry.io import Volume, has_header, load_volume
from hyperreg.registration.pairs import PathLike

__all__ = ["NPZ_GEOMETRIES", "initial_transform", "load_input"]

NPZ_GEOMETRIES = ("fixed", "identity")
"""Geometry of a header-less (npz) input: the fixed image's, or 1 mm voxels, world = index."""


def load_input(
    value: PathLike | Volume,
    *,
    label: bool = False,
    npz_geometry: str | None = None,
    fixed: Volume | None = None,
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
    read = {"label": label, "replace_nonfinite": None if label else replace_nonfinite}
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


def initial_transform(
    initial: AffineTransform | PathLike | None, moving: Volume, fixed: Volume
) -> AffineTransform | None:
    """``initial_affine`` as a transform: a file read by :func:`load_initial_affine`, whose
    errors become an :class:`InputError` of argument ``"initial_affine"``."""
    if initial is None or isinstance(initial, AffineTransform):
        return initial
    with passed_as(path="initial_affine"):
        return load_initial_affine(initial, moving, fixed)
