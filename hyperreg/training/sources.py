"""Training sources: finding scans and people in a data folder, and loading them onto a grid.

A *source* is one ``--data`` argument: a neurite-oasis folder, a folder of subject folders (one
person per folder, as ``mindboggle-trt20-2d`` and ``multicontrast-2d``), a flat folder of scans
(one person per file), or a CSV list. :func:`find_scans` turns it into :class:`Scan` records, each
with a **person id** (:attr:`Scan.person`): the neurite-oasis or subject folder name, the CSV's
``subject`` column, else the file name. Splits are made by person, so the T1 and T2 of one person
always land on the same side. The same id in two sources means the same person.

:func:`load_scan` reads one scan for training: the image normalised to [0, 1], its label map
moved onto the image's voxel grid through both affines when the two headers disagree (nearest
neighbour, with a warning), both optionally resampled to isotropic voxels. :func:`fit_to_shape`
centres an array in a common training grid (zero padding or central crop), so scans of
different sizes batch together. Scans of one source are assumed to share one space (affinely
aligned); pairs are therefore drawn within a source, never across sources.

Must not import model, train, inference or cli.
"""

from __future__ import annotations

import csv
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np

from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION, normalize_intensity
from hyperreg.geometry.io import Volume, has_header, load_volume, same_grid, spatial_shape_of
from hyperreg.geometry.resample import (
    conformed_grid,
    describe_grid,
    isotropic_grid,
    resample_to,
)
from hyperreg.training.labelfiles import LABEL_WORDS, has_label_name, is_label_map

__all__ = [
    "LABEL_WORDS",
    "SCAN_SUFFIXES",
    "Scan",
    "find_scans",
    "fit_to_shape",
    "is_label_map",
    "label_map_scans",
    "load_scan",
    "scan_shape",
    "training_shape",
]

logger = logging.getLogger(__name__)

SCAN_SUFFIXES = (".nii.gz", ".nii", ".mgz", ".mgh", ".npz")
_OASIS_FILES = {
    3: ("aligned_norm.nii.gz", "aligned_seg35.nii.gz"),
    2: ("slice_norm.nii.gz", "slice_seg24.nii.gz"),
}


def _stem(path: Path) -> str:
    name = path.name
    for suffix in SCAN_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass(frozen=True)
class Scan:
    """One scan: an intensity image, optionally its label map, and the person it shows.

    Attributes:
        image: Image file.
        seg: Label map file, or None.
        subject: Person id; ``""`` means the scan's own :attr:`name` (one scan per person).
    """

    image: Path
    seg: Path | None = None
    subject: str = ""

    @property
    def name(self) -> str:
        """Scan name: the neurite-oasis folder; else the file name without suffix, prefixed
        with ``<subject>/`` when the subject id is not already part of it."""
        if self.image.parent.name.startswith("OASIS_"):
            return self.image.parent.name
        stem = _stem(self.image)
        if self.subject and self.subject not in stem:
            return f"{self.subject}/{stem}"
        return stem

    @property
    def person(self) -> str:
        """Person id used to split train / validation / test."""
        return self.subject or self.name


def _is_label(path: Path, by_content: set[Path] | None = None) -> bool:
    """:func:`is_label_map`, noting in ``by_content`` the files known only by their content."""
    if has_label_name(path):
        return True
    found = is_label_map(path)
    if found and by_content is not None:
        by_content.add(path)
    return found


def _scan_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(SCAN_SUFFIXES))


def _name_score(image: Path, seg: Path) -> int:
    """Characters the two file names share at the start plus at the end."""
    a, b = _stem(image), _stem(seg)
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    suffix = next(
        (i for i, (x, y) in enumerate(zip(a[::-1], b[::-1])) if x != y), min(len(a), len(b))
    )
    return prefix + suffix


def _pair_labels(
    files: list[Path], subject: str = "", by_content: set[Path] | None = None
) -> list[Scan]:
    """Scans of one folder: each label file goes to the image whose name matches it best.

    Label maps are told from images by :func:`is_label_map` (name, then content; those known
    by content only are added to ``by_content``). With one image and one label map they pair
    whatever their names; otherwise a label map pairs with the image of the highest
    :func:`_name_score` (the same person's stem: ``IXI012-HH-1211_DLMUSE`` with
    ``IXI012-HH-1211_T1``), and a tie leaves it unused (with a warning), as does a second label
    map for the same image. A label map is never an image.
    """
    is_label = {p: _is_label(p, by_content) for p in files}
    images = [p for p in files if not is_label[p]]
    labels = [p for p in files if is_label[p]]
    segs: dict[Path, Path] = {}
    for seg in labels:
        if len(images) == 1 and len(labels) == 1:
            segs[images[0]] = seg
            break
        scores = sorted(((_name_score(img, seg), img) for img in images), reverse=True)
        if not scores or (len(scores) > 1 and scores[0][0] == scores[1][0]):
            warnings.warn(
                f"find_scans(): no unique image for label map '{seg}'; unused", stacklevel=3
            )
            continue
        image = scores[0][1]
        if image in segs:
            warnings.warn(
                f"find_scans(): '{image}' already has label map '{segs[image]}'; '{seg}' unused",
                stacklevel=3,
            )
            continue
        segs[image] = seg
    return [Scan(p, segs.get(p), subject) for p in images]


def _oasis_scans(root: Path, ndim: int) -> list[Scan]:
    scans: list[Scan] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for dims in (3, 2) if ndim == 2 else (3,):
            image_name, seg_name = _OASIS_FILES[dims]
            if (folder / image_name).is_file():
                seg = folder / seg_name
                scans.append(Scan(folder / image_name, seg if seg.is_file() else None))
                break
    return scans


def _csv_scans(source: Path) -> list[Scan]:
    with source.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or "image" not in rows[0]:
        raise ValueError(f"find_scans(): '{source}' must have a header with an 'image' column")
    base = source.parent
    return [
        Scan(
            base / row["image"],
            base / row["seg"] if row.get("seg") else None,
            (row.get("subject") or "").strip(),
        )
        for row in rows
    ]


def find_scans(source: str | Path, ndim: int) -> list[Scan]:
    """List the scans of a data source, each with its person id.

    Layouts, tried in this order for a folder:

    1. neurite-oasis: subject folders ``OASIS_*`` holding ``aligned_norm.nii.gz`` (with
       ``aligned_seg35``) or, for 2D, ``slice_norm.nii.gz`` (with ``slice_seg24``); 3D volumes
       are preferred, their slices are cut later. Person: the folder.
    2. a flat folder of scans (``.nii``, ``.nii.gz``, ``.mgz``, ``.npz``). Label maps, known
       by name (one of :data:`LABEL_WORDS`) or else by content (:func:`is_label_map`), are
       paired with the image whose name matches best (the same person's stem) and are never
       images. Person: the file name. One line is logged (INFO): images, how many have a label
       map, and the label maps known by content.
    3. a folder of subject folders, each holding that person's scans (any number, e.g. T1 and
       T2) and label maps, paired as in 2 (``mindboggle-trt20-2d``, ``multicontrast-2d``).
       Person: the subject folder.

    A CSV file needs an ``image`` column and may have ``seg`` and ``subject`` columns; relative
    paths are relative to the CSV; a row without ``subject`` is its own person; an ``image``
    that holds a label map (:func:`is_label_map`) is an error.

    Args:
        source: Folder or CSV file.
        ndim: 2 or 3, the dimensionality of training.

    Returns:
        The scans, in sorted order (CSV: row order).

    Raises:
        FileNotFoundError: If ``source`` does not exist.
        ValueError: If it holds no scan, is a file but not a ``.csv``, a CSV lacks the
            ``image`` column, or a CSV ``image`` is a label map.
    """
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"find_scans(): no such file or folder: '{source}'")
    if source.is_file():
        if source.suffix.lower() != ".csv":
            raise ValueError(f"find_scans(): '{source}' must be a folder or a .csv list of scans")
        scans = _csv_scans(source)
        _check_csv_images(source, scans)
    else:
        by_content: set[Path] = set()
        scans = _oasis_scans(source, ndim)
        if not scans:
            scans = _pair_labels(_scan_files(source), by_content=by_content)
        if not scans:
            for folder in sorted(p for p in source.iterdir() if p.is_dir()):
                scans += _pair_labels(_scan_files(folder), folder.name, by_content)
        _report_labels(source, scans, by_content)
    if not scans:
        raise ValueError(
            f"find_scans(): no scans found in '{source}' (expected neurite-oasis subject folders, "
            f"image files ending in {SCAN_SUFFIXES}, subject folders of them, or a CSV list)"
        )
    return scans


def _report_labels(source: Path, scans: list[Scan], by_content: set[Path]) -> None:
    """One line on the label maps found in a folder: how many images have one, and which
    files were known as label maps by their content rather than their name."""
    paired = sum(scan.seg is not None for scan in scans)
    if not paired and not by_content:
        return
    known = ""
    if by_content:
        names = sorted(p.name for p in by_content)
        more = f" and {len(names) - 2} more" if len(names) > 2 else ""
        known = "; label maps known by their content (integer ids), not their name: "
        known += ", ".join(f"'{n}'" for n in names[:2]) + more
    logger.info(
        "'%s': %d images, %d paired with their label map (same name stem)%s",
        source,
        len(scans),
        paired,
        known,
    )


def _check_csv_images(source: Path, scans: list[Scan]) -> None:
    """Refuse a CSV whose ``image`` column names a label map (never trained on as an image)."""
    for line, scan in enumerate(scans, start=2):  # line 1 is the header
        if scan.image.is_file() and is_label_map(scan.image):
            raise ValueError(
                f"find_scans(): '{source}' line {line}: image '{scan.image}' holds a label map "
                "(integer ids), not an intensity image; put it in the 'seg' column of its "
                "image's row"
            )


def load_scan(
    scan: Scan,
    *,
    normalization: str = DEFAULT_NORMALIZATION,
    spacing: float = 0.0,
    with_seg: bool = True,
    orientation: str = "",
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read one scan for training or validation.

    The image is read as float32 and normalised over the whole scan
    (:func:`~hyperreg.geometry.intensity.normalize_intensity`). Its label map is read as int32
    ids rounded to the nearest integer (a stored 2035.0 or 2034.9999 is 2035, never truncated).
    A label map whose header puts it on another voxel grid than its image (a different shape,
    or affines differing by more than 1e-4, as ``lapirn-3d``'s ``image_A`` seg:
    0.981 × 0.969 × 1 mm, origin (3, 6, 0) against the image's 1 mm, origin 0) is resampled
    onto the image grid through both affines with nearest neighbour, as ANTs and
    ``hyperreg register`` do, with a warning: the header is taken at its word. With
    ``spacing > 0`` both are then resampled to isotropic ``spacing`` mm voxels (linear / nearest
    neighbour) on the same origin and axes; array axis order and orientation are kept. With
    ``orientation`` (3D only, e.g. ``"RAS"``) the axes are instead permuted and flipped to that
    orientation (:func:`~hyperreg.geometry.resample.conformed_grid`), so scans stored LIA, PSR
    or RAS all reach the network in one orientation.

    Args:
        scan: The scan.
        normalization: See :func:`~hyperreg.geometry.intensity.normalize_intensity`.
        spacing: Target voxel size in mm; 0 keeps the scan's own voxels.
        with_seg: Read the label map (when the scan has one).
        orientation: Axis codes of the training grid (3D), or ``""`` to keep the scan's axes.

    Returns:
        ``(image, seg)``: float32 ``(I, J[, K])`` in [0, 1] unless ``"none"``, and int32 of the
        same shape or None.

    Raises:
        FileNotFoundError: If a file is missing.
        ValueError: If a file cannot be read (see :func:`~hyperreg.geometry.io.load_volume`), or
            the label map is 2D for a 3D image (or the reverse).

    Warns:
        UserWarning: If the label map was resampled onto its image's grid.
    """
    # a headerless .npz training scan (voxelmorph's format) is taken at 1 mm, identity axes;
    # its label map shares its grid
    image = load_volume(scan.image, assume_identity=True)
    seg = None
    if with_seg and scan.seg is not None:
        geometry = None if has_header(scan.seg) else image
        seg = load_volume(scan.seg, label=True, geometry_from=geometry)
    if seg is not None and not same_grid(seg, image):
        if seg.ndim != image.ndim:
            raise ValueError(
                f"load_scan(): label map '{scan.seg}' is {seg.ndim}D but its image "
                f"'{scan.image}' is {image.ndim}D"
            )
        warnings.warn(
            f"load_scan(): label map '{scan.seg}' ({describe_grid(seg)}) is not on the grid of "
            f"its image ({describe_grid(image)}); resampled onto the image grid through both "
            "headers (nearest neighbour)",
            stacklevel=2,
        )
        seg = resample_to(seg, image, label=True)
    grid = None
    if orientation and image.ndim == 3:
        grid = conformed_grid(image, spacing, orientation)
    elif spacing > 0:
        grid = isotropic_grid(image, spacing)
    if grid is not None:
        logger.info(
            "resampling '%s' to %g mm voxels, shape %s", scan.image, spacing, grid.spatial_shape
        )
        image = resample_to(image, grid)
        seg = resample_to(seg, grid, label=True) if seg is not None else None
    data = normalize_intensity(image.data, normalization)
    return data, None if seg is None else seg.data


def scan_shape(scan: Scan, spacing: float = 0.0) -> tuple[int, ...]:
    """Spatial shape the image of ``scan`` has after :func:`load_scan`, from its header only.

    Args:
        scan: The scan (NIfTI and MGH headers are read without the voxels; ``.npz`` is read).
        spacing: As in :func:`load_scan`.

    Returns:
        ``(I, J)`` or ``(I, J, K)``: trailing size-1 axes dropped, as ``load_volume`` does.

    Raises:
        FileNotFoundError: If the image is missing.
        ValueError: If it cannot be read.
    """
    path = scan.image
    if not path.is_file():
        raise FileNotFoundError(f"scan_shape(): no such file: '{path}'")
    if path.name.lower().endswith(".npz"):
        return load_volume(path, assume_identity=True).spatial_shape
    try:
        header = nib.load(path)
        disk = tuple(int(n) for n in header.shape)
        affine = np.asarray(header.affine, dtype=np.float64)
    except Exception as err:  # nibabel raises many types for a foreign file
        raise ValueError(f"scan_shape(): cannot read '{path}' ({err})") from err
    shape = spatial_shape_of(path, disk)
    if spacing <= 0:
        return shape
    volume = Volume(np.zeros(shape, np.float32), affine, shape)
    grid = isotropic_grid(volume, spacing)
    return shape if grid is None else grid.spatial_shape


def training_shape(
    groups: list[list[Scan]], ndim: int, *, slice_axis: int = 2, spacing: float = 0.0
) -> tuple[int, ...]:
    """The common training grid of several sources: the largest image size per axis.

    Every scan fits inside it without cropping (:func:`fit_to_shape` pads). When all scans
    already share one shape nothing needs fitting and ``()`` is returned.

    Args:
        groups: Scans per source (read from their headers, see :func:`scan_shape`).
        ndim: 2 or 3; for a 2D model on 3D scans the in-plane axes (all but ``slice_axis``)
            count.
        slice_axis: Axis cut for 2D training from 3D volumes.
        spacing: As in :func:`load_scan`.

    Returns:
        ``ndim`` sizes, or ``()``.

    Raises:
        ValueError: If a scan has fewer than ``ndim`` dimensions.
    """
    shapes = set()
    for scans in groups:
        for scan in scans:
            shape = scan_shape(scan, spacing)
            if len(shape) > ndim:  # slices of a volume: the in-plane axes
                shape = tuple(n for axis, n in enumerate(shape) if axis != slice_axis)
            if len(shape) != ndim:
                raise ValueError(
                    f"training_shape(): a {ndim}D model needs {ndim}D scans, got '{scan.image}' "
                    f"with shape {shape}"
                )
            shapes.add(shape)
    if len(shapes) <= 1:
        return ()
    return tuple(max(sizes) for sizes in zip(*shapes))


def label_map_scans(source: str | Path, ndim: int) -> list[Scan]:
    """Scans whose label maps feed synthesis: a label-map file itself (its own image), every
    file of a folder holding only label maps (names with one of :data:`LABEL_WORDS`, as
    SynthSeg's ``training_seg_01.nii.gz``), or the scans of a source (:func:`find_scans`) that
    have a label map.

    Raises:
        FileNotFoundError: If ``source`` does not exist.
        ValueError: As :func:`find_scans`.
    """
    path = Path(source)
    if path.is_file() and path.name.lower().endswith(SCAN_SUFFIXES):
        return [Scan(path, path)]
    if path.is_dir():
        files = _scan_files(path)
        if files and all(is_label_map(f) for f in files):  # a folder of label maps only
            return [Scan(f, f) for f in files]
    return [scan for scan in find_scans(path, ndim) if scan.seg is not None]


def fit_to_shape(
    array: np.ndarray,
    shape: tuple[int, ...],
    first_axis: int = 0,
    centre: tuple[float, ...] | None = None,
) -> np.ndarray:
    """Centre ``array`` in a grid of ``shape``: zero padding where it is smaller, central crop
    where it is larger, along axes ``first_axis`` onward (earlier axes are left alone). With
    ``centre`` (voxel coordinates along those axes), that point lands in the middle of the grid
    instead (zero padding wherever the window leaves the array).

    Padding and cropping are split evenly, the odd voxel going after the array. Values are
    never interpolated, so label ids and intensities stay exact.

    Args:
        array: Any array with ``array.ndim == first_axis + len(shape)``.
        shape: Target sizes of the last ``len(shape)`` axes.
        first_axis: First axis to fit (1 for a stack of slices along axis 0).

    Returns:
        A new array (a copy) of shape ``array.shape[:first_axis] + shape``, same dtype.

    Raises:
        ValueError: If ``shape`` does not match the number of axes to fit.
    """
    if array.ndim != first_axis + len(shape):
        raise ValueError(
            f"fit_to_shape(): 'shape' must give {array.ndim - first_axis} sizes, got {shape}"
        )
    out = np.zeros(array.shape[:first_axis] + tuple(shape), dtype=array.dtype)
    source, target = [slice(None)] * first_axis, [slice(None)] * first_axis
    if centre is not None:
        for size, want, middle in zip(array.shape[first_axis:], shape, centre):
            start = round(middle - (want - 1) / 2)  # array index of the grid's voxel 0
            low, high = max(start, 0), min(start + want, size)
            source.append(slice(low, max(low, high)))
            target.append(slice(low - start, low - start + max(0, high - low)))
        out[tuple(target)] = array[tuple(source)]
        return out
    for size, want in zip(array.shape[first_axis:], shape):
        if size >= want:
            start = (size - want) // 2
            source.append(slice(start, start + want))
            target.append(slice(None))
        else:
            start = (want - size) // 2
            source.append(slice(None))
            target.append(slice(start, start + size))
    out[tuple(target)] = array[tuple(source)]
    return out
