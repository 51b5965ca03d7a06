"""Reading and writing images and label maps (NIfTI, MGH/MGZ, npz).

This module owns the file boundary of ``hyperreg``: it turns a file into a :class:`Volume`
(a spatial numpy array plus the voxel-to-world affine nibabel reports for it), validates what
it reads (shape, finiteness, readability) with one-line errors that name the file, and writes
images and label maps back atomically in the layout of a reference volume. Displacement fields
on disk live in :mod:`hyperreg.geometry.fields`, which builds on the helpers here.
Arrays here are spatial only, ``(I, J)`` or ``(I, J, K)``; adding batch/channel axes is the
caller's job. Affines are ``(4, 4)`` float64, voxel ``(i, j, k)`` -> world RAS mm.

It uses numpy and nibabel only and must not import torch or any model code.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import nibabel as nib
import numpy as np
from isal import igzip
from nibabel.filebasedimages import ImageFileError
from nibabel.freesurfer.mghformat import MGHError
from nibabel.spatialimages import HeaderDataError

from hyperreg._errors import InputError, MissingInputError
from hyperreg._files import atomic_write

__all__ = [
    "HEADERLESS_SUFFIXES",
    "SAVE_SUFFIXES",
    "VOLUME_SAVE_SUFFIXES",
    "Volume",
    "check_finite",
    "check_replacement",
    "check_same_grid",
    "check_same_ndim",
    "compact_labels",
    "format_of",
    "has_header",
    "load_volume",
    "read_raw",
    "same_grid",
    "save_volume",
    "spatial_shape_of",
    "to_nifti",
    "write_nifti",
]

logger = logging.getLogger(__name__)

# suffix -> format name used in messages; order matters (".nii.gz" before ".nii" is not an
# issue for ``endswith`` but keeps the listing readable).
_LOAD_SUFFIXES: dict[str, str] = {
    ".nii.gz": "NIfTI",
    ".nii": "NIfTI",
    ".mgz": "MGH/MGZ",
    ".mgh": "MGH/MGZ",
    ".npz": "npz",
}
SAVE_SUFFIXES: tuple[str, ...] = (".nii.gz", ".nii")
# images and label maps may also go out as FreeSurfer MGZ (displacement fields: NIfTI only)
VOLUME_SAVE_SUFFIXES: tuple[str, ...] = (*SAVE_SUFFIXES, ".mgz")
_GZIP_LEVEL = 1  # ISA-L's fastest level; nibabel also writes .nii.gz at level 1
_NPZ_KEYS: tuple[str, ...] = ("vol", "vol_data")

# Everything nibabel / numpy / zlib raise for a truncated, corrupt or foreign file.
_READ_ERRORS: tuple[type[BaseException], ...] = (
    EOFError,
    OSError,
    ValueError,
    TypeError,
    zlib.error,
    zipfile.BadZipFile,
    ImageFileError,
    HeaderDataError,
    MGHError,
)

_INT32 = np.iinfo(np.int32)
_LABEL_NONINTEGER_TOL = 1e-2  # |x - rint(x)| above this in a label map is an error


@dataclass(frozen=True, eq=False, repr=False)
class Volume:
    """A spatial image or label map with its voxel-to-world affine.

    Attributes:
        data: Spatial array, shape ``(I, J)`` (2D) or ``(I, J, K)`` (3D), in on-disk array
            axis order (never transposed or flipped). float32 for images, int32 for label maps.
        affine: ``(4, 4)`` float64 matrix mapping voxel ``(i, j, k, 1)`` to world RAS mm,
            exactly as nibabel reports it (sform when its code > 0, else qform). A 2D volume
            keeps the full 4x4 affine of its one-slice file.
        disk_shape: Array shape as stored on disk, e.g. ``(160, 192, 1)`` for a 2D slice. Writers
            reshape outputs to it, so results keep the layout of the input file.
        path: File the volume was read from, or None for an in-memory volume.
        codes: ``(sform_code, qform_code)`` of the NIfTI header it was read from (e.g. ``(2, 0)``
            for an aligned-space sform and no qform); ``(1, 1)`` (scanner) for MGH/MGZ, npz and
            in-memory volumes. Writers give outputs on this grid the same codes (except a qform
            code 0 for an affine with shears, which a qform cannot hold; see :func:`to_nifti`).

    Raises:
        ValueError: If ``data`` is not 2D or 3D, ``affine`` is not ``(4, 4)`` and finite,
            ``disk_shape`` does not hold the same number of voxels as ``data``, or a code lies
            outside 0..4.
    """

    data: np.ndarray
    affine: np.ndarray
    disk_shape: tuple[int, ...]
    path: Path | None = None
    codes: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        data = np.asarray(self.data)
        affine = np.array(self.affine, dtype=np.float64)
        disk_shape = tuple(int(n) for n in self.disk_shape)
        if data.ndim not in (2, 3):
            raise ValueError(
                f"Volume(): 'data' must have shape (I, J) or (I, J, K), got {tuple(data.shape)}"
            )
        if affine.shape != (4, 4) or not np.all(np.isfinite(affine)):
            raise ValueError(
                f"Volume(): 'affine' must be a finite (4, 4) matrix, got shape {affine.shape}"
            )
        if int(np.prod(disk_shape)) != data.size:
            raise ValueError(
                f"Volume(): 'disk_shape' {disk_shape} does not hold the {data.size} voxels of "
                f"'data' with shape {tuple(data.shape)}"
            )
        codes = tuple(int(c) for c in self.codes)
        if len(codes) != 2 or not all(0 <= c <= 4 for c in codes):
            raise ValueError(
                f"Volume(): 'codes' must be (sform_code, qform_code) in 0..4, got {self.codes}"
            )
        object.__setattr__(self, "codes", codes)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "affine", affine)
        object.__setattr__(self, "disk_shape", disk_shape)
        if self.path is not None:
            object.__setattr__(self, "path", Path(self.path))

    @property
    def ndim(self) -> int:
        """Number of spatial dimensions, 2 or 3."""
        return int(self.data.ndim)

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        """Spatial shape ``(I, J)`` or ``(I, J, K)`` as a tuple of ints."""
        return tuple(int(n) for n in self.data.shape)

    @property
    def spacing(self) -> tuple[float, ...]:
        """Voxel size in mm along each array axis (norms of the affine's first ``ndim`` columns)."""
        return tuple(float(np.linalg.norm(self.affine[:3, n])) for n in range(self.ndim))

    def __repr__(self) -> str:
        spacing = tuple(round(s, 4) for s in self.spacing)
        return (
            f"Volume(shape={self.spatial_shape}, dtype={self.data.dtype}, spacing={spacing}, "
            f"disk_shape={self.disk_shape}, path={str(self.path) if self.path else None!r})"
        )


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------


def format_of(path: Path, suffixes: tuple[str, ...], fn: str) -> str:
    """Return the matching suffix of ``path`` (case-insensitive) or raise InputError (a
    ValueError; argument ``path``)."""
    name = path.name.lower()
    for suffix in suffixes:
        if name.endswith(suffix):
            return suffix
    raise InputError(
        fn,
        "'{path}' must end with one of {suffixes}, got suffix {suffix!r}",
        "path",
        path=path,
        suffixes=suffixes,
        suffix="".join(path.suffixes),
    )


_FORM_ATOL = 1e-3  # mm (translation) and mm per voxel (matrix): float32 storage is far below


def _warn_if_forms_disagree(path: Path, header: nib.Nifti1Header, codes: tuple[int, int]) -> None:
    """Warn when a NIfTI header's sform and qform both have a code > 0 but different matrices.

    The rule never changes (sform when its code > 0, as nibabel does); the warning says which
    was used, because other tools (ITK, ANTs, some viewers) may prefer the qform.
    """
    sform_code, qform_code = codes
    if sform_code <= 0 or qform_code <= 0:
        return
    sform = np.asarray(header.get_sform(), dtype=np.float64)
    qform = np.asarray(header.get_qform(), dtype=np.float64)
    difference = float(np.max(np.abs(sform - qform)))
    if difference <= _FORM_ATOL:
        return
    shift = float(np.linalg.norm(sform[:3, 3] - qform[:3, 3]))
    warnings.warn(
        f"'{path}' has an sform (code {sform_code}) and a qform (code "
        f"{qform_code}) that disagree (largest entry difference {difference:.4g}, origins "
        f"{shift:.4g} mm apart); using the sform, as nibabel does (other tools may use the "
        "qform): make them agree (e.g. fslorient -copysform2qform) if the sform is not right",
        stacklevel=4,
    )


def read_raw(path: Path, suffix: str) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Read the full data array, the affine and ``(sform_code, qform_code)`` (``(1, 1)`` for
    MGH and npz); wrap every read failure in one ValueError."""
    fmt = _LOAD_SUFFIXES[suffix]
    npz_keys: list[str] | None = None
    codes = (1, 1)
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                keys = list(npz.files)
                key = next((k for k in _NPZ_KEYS if k in keys), None)
                if key is None and len(keys) == 1:
                    key = keys[0]
                if key is None:
                    npz_keys = keys
                    raw = np.empty(0)
                else:
                    raw = np.asarray(npz[key])
            affine = np.eye(4)
        else:
            img = nib.load(path, mmap=False)
            raw = np.asanyarray(img.dataobj)  # applies scl_slope/scl_inter; reads everything
            affine = np.array(img.affine, dtype=np.float64)
            if isinstance(img, nib.Nifti1Image):  # also NIfTI-2, a subclass
                codes = (int(img.header["sform_code"]), int(img.header["qform_code"]))
                _warn_if_forms_disagree(path, img.header, codes)
    except PermissionError:
        raise
    except _READ_ERRORS as err:
        raise InputError(
            "load_volume",
            "cannot read '{path}': file is truncated or not a valid {fmt} file ({err})",
            "path",
            path=path,
            fmt=fmt,
            err=err,
        ) from err
    if npz_keys is not None:
        raise InputError(
            "load_volume",
            "'{path}' must hold an array named 'vol' or 'vol_data' or exactly one array, got "
            "arrays {keys}",
            "path",
            path=path,
            keys=npz_keys,
        )
    return np.asarray(raw), affine, codes


def spatial_shape_of(path: Path, disk_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Drop trailing singleton axes beyond the 2nd; reject series and 1D data."""
    shape = list(disk_shape)
    while len(shape) > 2 and shape[-1] == 1:
        shape.pop()
    if len(shape) > 3:
        raise InputError(
            "load_volume",
            "'{path}' has shape {shape}: a 4D series is not one image; pass a single 2D or 3D "
            "volume",
            "path",
            path=path,
            shape=disk_shape,
        )
    if len(shape) < 2:
        raise InputError(
            "load_volume",
            "'{path}' must hold a 2D or 3D image, got shape {shape}",
            "path",
            path=path,
            shape=disk_shape,
        )
    return tuple(shape)


_COLOUR_FIELDS = frozenset("RGBA")  # nibabel's field names of the RGB24 / RGBA32 datatypes
_COLOUR_CHANNELS = (3, 4)  # RGB, RGBA
_COLOUR_MIN_SIDE = 16  # a 2D colour picture is much wider than its channel axis


def _check_not_colour(path: Path, raw: np.ndarray) -> None:
    """Refuse a colour image (see :func:`load_volume`, Raises): one grey channel is read."""
    names = raw.dtype.names
    if names and set(names) <= _COLOUR_FIELDS:
        raise InputError(
            "load_volume",
            "'{path}' is a colour image ({kind} voxels); hyperreg registers grey-level images: "
            "convert it to one channel first (e.g. its luminance)",
            "path",
            path=path,
            kind="".join(names),
        )
    shape = tuple(int(n) for n in raw.shape)
    # (I, J, 3) only: (I, J, 1, 3) is a series of 3 slices in NIfTI's axis order (time 4th)
    if len(shape) == 3 and shape[-1] in _COLOUR_CHANNELS and min(shape[:2]) >= _COLOUR_MIN_SIDE:
        raise InputError(
            "load_volume",
            "'{path}' has shape {shape}: a 2D colour image ({n} values per pixel on the last "
            "axis), or a volume only {n} slices thick, which neither the 2D nor the 3D model "
            "registers; convert a colour image to one grey channel (e.g. its luminance) first",
            "path",
            path=path,
            shape=shape,
            n=shape[-1],
        )


def _nonfinite_error(path: Path, count: int, label: bool) -> InputError:
    """``'<path>' has N non-finite voxels``: a label map's file must be fixed; an image's
    error names the option that replaces them (``replace_nonfinite``; on the command line
    ``--replace-nonfinite``)."""
    if label:
        return InputError(
            "load_volume",
            "'{path}' has {count} non-finite voxels (NaN or inf); fix the file (a label map "
            "must be finite: no replacement applies to it)",
            "path",
            path=path,
            count=count,
        )
    return InputError(
        "load_volume",
        "'{path}' has {count} non-finite voxels (NaN or inf); fix the file, or replace them "
        "with {1} VALUE (e.g. 0, or the background's intensity)",
        "path",
        "replace_nonfinite",
        path=path,
        count=count,
    )


def _to_labels(path: Path, raw: np.ndarray) -> np.ndarray:
    """Round a label array to the nearest integer and cast to int32."""
    if raw.dtype.kind in "biu":
        values = raw
    else:
        count = int(raw.size - np.count_nonzero(np.isfinite(raw)))
        if count:
            raise _nonfinite_error(path, count, label=True)
        values = np.rint(raw)
        if raw.size:
            distance = np.abs(raw - values)
            worst = int(np.argmax(distance))
            if float(distance.flat[worst]) > _LABEL_NONINTEGER_TOL:
                count = int(np.count_nonzero(distance > _LABEL_NONINTEGER_TOL))
                raise InputError(
                    "load_volume",
                    "'{path}' must hold integer label ids to be read as a label map, got "
                    "{count} voxels with non-integer values (e.g. {value:.6g}); rounding would "
                    "merge labels silently: fix the label map, or pass it as an intensity image "
                    "if that is what it is",
                    "path",
                    path=path,
                    count=count,
                    value=float(raw.flat[worst]),
                )
    if values.size and (values.min() < _INT32.min or values.max() > _INT32.max):
        raise InputError(
            "load_volume",
            "label values of '{path}' must fit in int32, got range [{lo}, {hi}]",
            "path",
            path=path,
            lo=values.min(),
            hi=values.max(),
        )
    return values.astype(np.int32)


HEADERLESS_SUFFIXES: tuple[str, ...] = (".npz",)
"""Suffixes of files that carry no geometry (voxel size, orientation, position)."""


def has_header(path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s format carries a voxel-to-world affine (NIfTI, MGH/MGZ: True; npz:
    False). Decided from the suffix alone (case-insensitive); the file is not opened."""
    return not Path(path).name.lower().endswith(HEADERLESS_SUFFIXES)


def load_volume(
    path: str | os.PathLike[str],
    *,
    label: bool = False,
    allow_nonfinite: bool = False,
    geometry_from: Volume | None = None,
    assume_identity: bool = False,
    warn_constant: bool = True,
    replace_nonfinite: float | None = None,
) -> Volume:
    """Read a 2D or 3D image or label map with its voxel-to-world affine.

    Supported files: NIfTI (``.nii``, ``.nii.gz``) and FreeSurfer MGH (``.mgz``, ``.mgh``), read
    with ``nibabel.load``; and voxelmorph-style ``.npz`` holding an array named ``vol`` or
    ``vol_data`` (or exactly one array of any name).

    Affine rule: the affine is ``img.affine`` as nibabel reports it, as ``(4, 4)`` float64. For
    NIfTI that is the sform when ``sform_code > 0``, else the qform (else nibabel's fall-back
    from the pixel sizes); for MGH/MGZ it is the header's vox2ras. An ``.npz`` file has no
    header, so its geometry is never assumed silently: the caller says which to use, either
    ``geometry_from=`` another volume (usually the fixed image: its affine and codes, after
    checking that the spatial shapes agree) or ``assume_identity=True`` (``np.eye(4)``: 1 mm
    isotropic voxels, world = voxel index, codes ``(1, 1)``); without either it is an error.
    Both options are ignored for files with a header (:func:`has_header`), so a caller may pass
    them for every input.

    Shape rule: trailing axes of size 1 beyond the second are dropped, so ``(I, J, 1)`` and
    ``(I, J, 1, 1)`` load as 2D ``(I, J)`` and ``(I, J, K, 1)`` as 3D ``(I, J, K)``. No other axis
    is ever squeezed, transposed or flipped. ``Volume.disk_shape`` keeps the stored shape.

    Values: images are returned as float32 with nibabel's ``scl_slope``/``scl_inter`` applied and
    no other rescaling. Label maps (``label=True``) are rounded to the nearest integer with
    ``np.rint`` (a stored 2.9999 becomes 3, rounding noise of a scale factor) and returned as
    int32; negative labels are kept. A label value farther than 0.01 from an integer (2.5, or an
    intensity image) is an error, never rounded to a neighbouring label.

    Args:
        path: File to read (str or path-like).
        label: Read as a label map (int32) instead of an image (float32).
        allow_nonfinite: For images only: replace NaN/inf voxels by 0 (with a logged warning)
            instead of raising. Ignored for label maps, which must always be finite. The same
            as ``replace_nonfinite=0``.
        geometry_from: For a header-less file (npz): take the affine and codes of this volume
            (e.g. the fixed image), whose spatial shape must equal the file's. Ignored for files
            with a header.
        assume_identity: For a header-less file (npz): use the 1 mm identity affine. Ignored
            for files with a header.
        warn_constant: Warn when an image is constant (default); False for a caller that
            checks that itself (the registration pipeline refuses such an image).
        replace_nonfinite: For images only: replace NaN/inf voxels by this finite value (with
            a logged warning giving their count) instead of raising; None (default): raise.
            Ignored for label maps.

    Returns:
        The :class:`Volume`, with ``data`` of shape ``(I, J)`` or ``(I, J, K)``.

    Raises:
        FileNotFoundError: If ``path`` does not exist or is not a file (a
            :class:`~hyperreg._errors.MissingInputError`, argument ``"path"``).
        ValueError: (An :class:`~hyperreg._errors.InputError` of argument ``"path"``, except
            for the choice of geometry.) If the suffix is not one of the supported ones; if the
            file is truncated, corrupt or not of its suffix's format; if it holds a colour
            image (RGB voxels, or shape ``(I, J, 3)`` or ``(I, J, 4)`` with ``I, J >= 16``:
            3 or 4 values per pixel, never a 3- or 4-slice volume); if it holds a 4D series
            (more than one volume) or fewer than 2 spatial dimensions; if its dtype is not
            numeric; if an ``.npz`` file has several arrays and none named ``vol``/``vol_data``;
            if an ``.npz`` file gets neither ``geometry_from`` nor ``assume_identity`` (or
            both), or ``geometry_from`` has another spatial shape; if it has non-finite voxels
            (images without ``allow_nonfinite`` or ``replace_nonfinite``, and label maps
            always); if ``replace_nonfinite`` is not a finite number; or if label values do
            not fit in int32; or if a label map has values farther than 0.01 from an integer.

    Warns:
        UserWarning: If an image is constant (all voxels equal), unless ``warn_constant`` is
            False.

    References:
        ``.npz`` layout as in VoxelMorph's ``py/utils.py:load_volfile``
        (Balakrishnan et al., IEEE TMI 2019).
    """
    path = Path(path)
    suffix = format_of(path, tuple(_LOAD_SUFFIXES), "load_volume")
    if replace_nonfinite is None and allow_nonfinite:
        replace_nonfinite = 0.0
    check_replacement("load_volume", replace_nonfinite)
    if not path.is_file():
        raise MissingInputError("load_volume", "no such file: '{path}'", "path", path=path)
    headerless = not has_header(path)

    raw, affine, codes = read_raw(path, suffix)
    _check_not_colour(path, raw)
    if raw.dtype.kind not in "biuf":
        raise InputError(
            "load_volume",
            "'{path}' must hold real numeric voxels, got dtype {dtype}",
            "path",
            path=path,
            dtype=raw.dtype,
        )
    disk_shape = tuple(int(n) for n in raw.shape)
    spatial_shape = spatial_shape_of(path, disk_shape)
    raw = raw.reshape(spatial_shape)  # only trailing size-1 axes are removed

    if label:
        data = _to_labels(path, raw)
    else:
        data = raw.astype(np.float32)  # always a copy: never a view of a file buffer
        nonfinite = ~np.isfinite(data)
        count = int(np.count_nonzero(nonfinite))
        if count:
            if replace_nonfinite is None:
                raise _nonfinite_error(path, count, label=False)
            data[nonfinite] = replace_nonfinite
            logger.warning(
                "replaced %d non-finite voxels (NaN or inf) with %g in '%s'",
                count,
                replace_nonfinite,
                path,
            )
        if warn_constant and data.size and data.min() == data.max():
            v = float(data.flat[0])
            warnings.warn(
                f"'{path}' is constant (all voxels = {v}); registration to it is meaningless",
                stacklevel=2,
            )
    if headerless:
        _check_geometry_choice(path, geometry_from, assume_identity)
    if headerless and geometry_from is not None:
        if geometry_from.spatial_shape != spatial_shape:
            raise InputError(
                "load_volume",
                "'{path}' has no header and spatial shape {shape}, so it cannot take the "
                "geometry of '{other}' with shape {other_shape}; give it a header on that grid, "
                "or use assume_identity=True",
                "path",
                path=path,
                shape=spatial_shape,
                other=_name(geometry_from),
                other_shape=geometry_from.spatial_shape,
            )
        affine, codes = geometry_from.affine, geometry_from.codes
        logger.debug("load_volume(): '%s' takes the geometry of '%s'", path, _name(geometry_from))
    elif headerless:
        affine, codes = np.eye(4), (1, 1)
        logger.debug("load_volume(): '%s' has no header; 1 mm identity affine as asked", path)
    logger.debug("load_volume(): read '%s' shape %s dtype %s", path, spatial_shape, data.dtype)
    return Volume(data=data, affine=affine, disk_shape=disk_shape, path=path, codes=codes)


def _name(volume: Volume) -> str:
    return str(volume.path) if volume.path is not None else "<in-memory volume>"


def _check_geometry_choice(path: Path, geometry_from: Volume | None, assume_identity: bool) -> None:
    """Raise unless exactly one geometry was chosen for the header-less file ``path``."""
    if geometry_from is not None and not isinstance(geometry_from, Volume):
        raise TypeError(
            f"load_volume(): 'geometry_from' must be a Volume or None, got "
            f"{type(geometry_from).__name__}"
        )
    if geometry_from is not None and assume_identity:
        raise ValueError(
            f"load_volume(): '{path}' has no header: pass one of 'geometry_from' and "
            "'assume_identity', not both"
        )
    if geometry_from is None and not assume_identity:
        raise ValueError(
            f"load_volume(): '{path}' has no header (npz: no voxel size, orientation or "
            "position), so its geometry must be chosen: the fixed image's "
            "(geometry_from=<fixed Volume>) or 1 mm voxels with world = voxel index "
            "(assume_identity=True)"
        )


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def write_nifti(img: nib.Nifti1Image, path: str | os.PathLike[str]) -> Path:
    """Write a NIfTI image atomically; a ``.nii.gz`` is compressed with ISA-L's gzip.

    nibabel lays out the file (header, then data); for ``.nii.gz`` it writes into a
    ``python-isal`` gzip stream, about three times faster than the zlib that nibabel uses at the
    same level (a 3 × 256³ float32 displacement: about 2 s instead of 7 s) and a standard gzip
    file that nibabel, ITK/ANTs and FSL read. A ``.nii`` is written by nibabel as it is.

    Args:
        img: The image to write.
        path: Destination, ``.nii.gz`` or ``.nii``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: If the file cannot be written; ``path`` is then untouched.
    """

    def write(tmp: Path) -> None:
        if tmp.name.endswith(".gz"):
            with igzip.open(tmp, "wb", compresslevel=_GZIP_LEVEL) as stream:
                holder = nib.FileHolder(fileobj=stream)
                img.to_file_map({"image": holder, "header": holder})
        else:
            img.to_filename(tmp)

    return atomic_write(path, write)


def _write_mgz(arr: np.ndarray, affine: np.ndarray, path: Path) -> None:
    """Write ``arr`` (uint8, int16, int32 or float32) as FreeSurfer MGZ with ``affine``,
    atomically, gzip by ISA-L (as :func:`write_nifti`). MGH keeps 3 spatial axes, so a 2D
    ``(I, J)`` array is written as ``(I, J, 1)``."""
    data = arr if arr.ndim >= 3 else arr.reshape(*arr.shape, 1)
    img = nib.MGHImage(data, np.asarray(affine, dtype=np.float64))

    def write(tmp: Path) -> None:
        with igzip.open(tmp, "wb", compresslevel=_GZIP_LEVEL) as stream:
            img.to_file_map({"image": nib.FileHolder(fileobj=stream)})

    atomic_write(path, write)


def to_nifti(arr: np.ndarray, like: Volume) -> nib.Nifti1Image:
    """Build a NIfTI image with ``like.affine`` as both sform and qform, no scaling.

    The codes are ``like.codes`` (the fixed file's own, e.g. sform 2 / qform 0), so a reader
    picks the same matrix from the output as from the fixed image. The pair is always
    consistent: an affine a qform cannot represent (shear, or non-orthogonal axes) is written as
    the sform only, with qform code 0 (logged), never as an orthogonalised qform that disagrees
    with it. (With sform code 0 as well, such an affine could not have been read from a file;
    the sform then gets code 2, aligned, so that the matrix is kept.)
    """
    img = nib.Nifti1Image(arr, like.affine)
    img.header.set_data_dtype(arr.dtype)
    sform_code, qform_code = like.codes
    try:
        img.set_qform(like.affine, code=qform_code, strip_shears=False)
    except HeaderDataError:  # shears: a qform would only hold an orthogonalised approximation
        img.set_qform(None)
        if qform_code > 0 or sform_code == 0:
            logger.info(
                "the affine of '%s' has shears a qform cannot hold; writing it as "
                "the sform only (qform code 0)",
                like.path if like.path is not None else "<in-memory volume>",
            )
        sform_code = sform_code or 2
    img.set_sform(like.affine, code=sform_code)
    img.header.set_slope_inter(1.0, 0.0)
    img.header.set_xyzt_units("mm")
    return img


def check_replacement(fn: str, value: float | None) -> None:
    """``replace_nonfinite`` is None or a finite real number (an :class:`InputError` of
    argument ``"replace_nonfinite"`` otherwise)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InputError(
            fn,
            "{0} must be a finite number or None, got {value!r}",
            "replace_nonfinite",
            value=value,
        )
    if not math.isfinite(float(value)):
        raise InputError(
            fn, "{0} must be a finite number, got {value!r}", "replace_nonfinite", value=value
        )


_FINITE_BLOCK = 1 << 22  # values per block that check_finite tests at once (a 4 MiB mask)


def check_finite(fn: str, name: str, arr: np.ndarray) -> None:
    # one block of the first axis at a time: no mask as large as a 3 x 256³ field at once
    if arr.ndim < 2:
        count = int(arr.size - np.count_nonzero(np.isfinite(arr)))
    else:
        rows = max(1, _FINITE_BLOCK // max(1, int(np.prod(arr.shape[1:]))))
        blocks = (arr[i : i + rows] for i in range(0, len(arr), rows))
        count = sum(int(b.size - np.count_nonzero(np.isfinite(b))) for b in blocks)
    if count:
        raise ValueError(
            f"{fn}(): '{name}' must be finite, got {count} non-finite values (NaN or inf)"
        )


def _label_dtype(fn: str, values: np.ndarray) -> np.dtype:
    """Smallest of uint8/int16/int32 that holds the value range."""
    lo = int(values.min()) if values.size else 0
    hi = int(values.max()) if values.size else 0
    for dtype in (np.uint8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dtype)
    raise ValueError(f"{fn}(): label values must fit in int32, got range [{lo}, {hi}]")


def compact_labels(volume: Volume) -> Volume:
    """A label map with its ids held in the smallest of uint8/int16/int32 that holds them (the
    type :func:`save_volume` writes them in): the same ids and grid in a quarter or half of
    int32's memory (a 256³ FreeSurfer aseg: 16 MiB instead of 64). ``volume`` itself when its
    ids are already in that type.

    Raises:
        ValueError: If the ids do not fit in int32.
    """
    dtype = _label_dtype("compact_labels", volume.data)
    return volume if volume.data.dtype == dtype else replace(volume, data=volume.data.astype(dtype))


def save_volume(
    path: str | os.PathLike[str], data: np.ndarray, like: Volume, *, label: bool = False
) -> Path:
    """Write an image or label map in the layout and on the grid of ``like``, atomically.

    The array is reshaped to ``like.disk_shape`` (a 2D slice read from ``(I, J, 1)`` goes back
    out as ``(I, J, 1)``) and written with ``like.affine`` as both sform and qform, with the codes
    of ``like`` (``Volume.codes``: those of the fixed file, 1 = scanner for MGH/npz), units mm;
    an affine with shears is written as the sform only (qform code 0), see :func:`to_nifti`.
    NIfTI stores the sform as float32, so an affine read from a NIfTI file round-trips exactly.
    The file is first written to a hidden temporary file in the same folder and then renamed
    over ``path``; on failure nothing is left behind. Parent folders are created.

    Args:
        path: Output file, ``.nii``, ``.nii.gz`` or ``.mgz`` (FreeSurfer MGZ: the affine, no
            NIfTI codes; a 2D slice read as ``(I, J)`` goes out as ``(I, J, 1)``).
        data: Array-like of shape ``like.spatial_shape``, ``(I, J)`` or ``(I, J, K)``. Images
            are stored as float32. Label maps (``label=True``) must be integer-valued and are
            stored, unscaled (slope 1, intercept 0), as the smallest of uint8 / int16 / int32
            that holds their range.
        like: Reference volume (usually the fixed image) giving shape, layout and affine.
        label: Write a label map instead of an image.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: If the suffix is not ``.nii``/``.nii.gz``/``.mgz``; if ``data``'s shape
            differs from ``like.spatial_shape``; if ``data`` has non-finite values; or, for label
            maps, if it is not integer-valued or does not fit in int32.
        OSError: If the file cannot be written.
    """
    fn = "save_volume"
    path = Path(path)
    suffix = format_of(path, VOLUME_SAVE_SUFFIXES, fn)  # raises on a suffix it cannot write
    arr = np.asarray(data)
    if arr.shape != like.data.shape:
        raise ValueError(
            f"{fn}(): 'data' must have the shape of 'like' {tuple(like.data.shape)}, "
            f"got {tuple(arr.shape)}"
        )
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{fn}(): 'data' must be a real numeric array, got dtype {arr.dtype}")
    if label:
        if arr.dtype.kind == "f":
            check_finite(fn, "data", arr)
            if not np.array_equal(arr, np.rint(arr)):
                raise ValueError(
                    f"{fn}(): 'data' must be integer-valued for a label map, got non-integer "
                    "values; round them (np.rint) first if that is intended"
                )
        out = arr.astype(_label_dtype(fn, arr))
    else:
        out = arr.astype(np.float32, copy=False)  # no copy of a float32 image
        check_finite(fn, "data", out)
    if suffix == ".mgz":
        _write_mgz(out.reshape(like.disk_shape), like.affine, path)
    else:
        write_nifti(to_nifti(out.reshape(like.disk_shape), like), path)
    logger.debug("%s(): wrote '%s' shape %s dtype %s", fn, path, like.disk_shape, out.dtype)
    return path


# --------------------------------------------------------------------------------------------
# grids
# --------------------------------------------------------------------------------------------


def same_grid(a: Volume, b: Volume, *, atol: float = 1e-4) -> bool:
    """Whether two volumes share a voxel grid.

    Args:
        a: First volume.
        b: Second volume.
        atol: Absolute tolerance on every affine entry (mm for the translation column, mm per
            voxel for the rest). No relative tolerance is applied.

    Returns:
        True if the spatial shapes are equal and the affines agree within ``atol``.
    """
    return a.spatial_shape == b.spatial_shape and bool(
        np.allclose(a.affine, b.affine, rtol=0.0, atol=atol)
    )


def check_same_ndim(fn: str, moving: Volume, fixed: Volume) -> None:
    """Raise InputError (a ValueError; argument ``"moving"``) unless both are 2D or both 3D."""
    if moving.ndim != fixed.ndim:
        raise InputError(
            fn,
            "'{moving}' is {m}D but '{fixed}' is {f}D; both must be 2D or both 3D",
            "moving",
            moving=_name(moving),
            m=moving.ndim,
            fixed=_name(fixed),
            f=fixed.ndim,
        )


def check_same_grid(moving: Volume, fixed: Volume) -> None:
    """Raise unless ``moving`` lies on ``fixed``'s grid (same shape, affines within 1e-4).

    Registration here is voxel-to-voxel, so images on different grids must be resampled first;
    this function never resamples.

    Args:
        moving: The moving image (or label map).
        fixed: The fixed image.

    Raises:
        ValueError: If the grids differ (an :class:`~hyperreg._errors.InputError` of argument
            ``"moving"``). The message names both files, both shapes and both spacings, says
            whether the affines differ, and how to resample.
    """
    if same_grid(moving, fixed):
        return
    affines = (
        "affines differ"
        if moving.affine.shape != fixed.affine.shape
        or not np.allclose(moving.affine, fixed.affine, rtol=0.0, atol=1e-4)
        else "affines match"
    )
    m_spacing = tuple(round(s, 4) for s in moving.spacing)
    f_spacing = tuple(round(s, 4) for s in fixed.spacing)
    m_name = str(moving.path) if moving.path is not None else "<in-memory moving>"
    f_name = str(fixed.path) if fixed.path is not None else "<in-memory fixed>"
    raise InputError(
        "check_same_grid",
        "'{m_name}' and '{f_name}' are on different grids (shape {m_shape} vs {f_shape}, "
        "spacing {m_spacing} vs {f_spacing}, {affines}): resample the moving image onto the "
        "fixed grid first (e.g. with SimpleITK or FreeSurfer's mri_vol2vol)",
        "moving",
        m_name=m_name,
        f_name=f_name,
        m_shape=moving.spatial_shape,
        f_shape=fixed.spatial_shape,
        m_spacing=m_spacing,
        f_spacing=f_spacing,
        affines=affines,
    )
