"""Transforms on files: the affine stage alone, and applying a saved chain.

:func:`affine_files` runs only the affine stage (:func:`hyperreg.geometry.affine.register_affine`)
and writes the moved image, the moved label map and the ITK transform file. :func:`warp_files`
applies a saved chain (an ITK affine and/or a displacement field) to any number of images and
label maps in one call, each sampled once from its own grid (one file through it, and a
field's Jacobian map: :mod:`hyperreg.apps.fields`). The affine stage in front of the deformable
one (``register``, ``sweep``, ``tune``, ``batch``) is run by
:func:`hyperreg.registration.pipeline.load_pair`.

Frames and units: transforms are world maps from a **fixed** point to the **moving** point that
lands on it (RAS mm in memory; LPS mm in the ITK file, as ``antsApplyTransforms`` and SimpleITK
read it); displacement fields are hyperreg's voxel format or ITK's (see
:mod:`hyperreg.geometry.fields`). Must not import cli.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hyperreg.geometry.affine import (
    AFFINE_INITS,
    TRANSFORM_SUFFIXES,
    AffineTransform,
    load_affine,
    save_affine,
)
from hyperreg.geometry.fields import load_displacement
from hyperreg.geometry.io import Volume, check_same_grid, same_grid, save_volume
from hyperreg.geometry.inspect import looks_like_label_map
from hyperreg.geometry.intensity import outside_fill
from hyperreg.geometry.resample import describe_grid
from hyperreg.method.metrics import registration_dice
from hyperreg.registration.chain import sample_volume
from hyperreg.registration.pairs import PathLike, check_outputs
from hyperreg._errors import InputError, passed_as
from hyperreg.registration.inputs import load_input
from hyperreg.registration.pipeline import load_pair

__all__ = [
    "AffineResult",
    "WarpedFile",
    "affine_files",
    "check_transform_path",
    "warp_files",
]

logger = logging.getLogger(__name__)


def check_transform_path(fn: str, name: str, path: PathLike | None) -> None:
    """Raise unless ``path`` (an output) ends in one of ``TRANSFORM_SUFFIXES``."""
    if path is not None and not str(path).lower().endswith(TRANSFORM_SUFFIXES):
        raise InputError(
            fn,
            "{0} must end in one of {suffixes} (an ITK transform file), got '{path}'",
            name,
            suffixes=TRANSFORM_SUFFIXES,
            path=path,
        )


class AffineResult(NamedTuple):
    """Output of :func:`affine_files`.

    Attributes:
        transform: The :class:`~hyperreg.geometry.affine.AffineTransform` (fixed RAS -> moving
            RAS, mm), with its MI before/after and wall time.
        dice: ``{label: Dice}`` of the moved and fixed label maps, or None.
        dice_before: Mean Dice with no registration (both maps on the fixed grid), or None.
        shared_labels: The label ids both input maps hold (the others of ``dice`` are in one
            map only and count as they score, usually 0), or None without both maps.
    """

    transform: AffineTransform
    dice: dict[int, float] | None
    dice_before: float | None
    shared_labels: list[int] | None = None

    @property
    def mean_dice(self) -> float | None:
        """Mean Dice over the scored labels, or None without label maps."""
        if self.dice is None:
            return None
        values = [v for v in self.dice.values() if not np.isnan(v)]
        return float(np.mean(values)) if values else float("nan")


def affine_files(
    moving: PathLike,
    fixed: PathLike,
    *,
    init: str = "affine",
    moved: PathLike | None = None,
    affine_out: PathLike | None = None,
    moving_seg: PathLike | None = None,
    fixed_seg: PathLike | None = None,
    moved_seg: PathLike | None = None,
    seed: int = 0,
    npz_geometry: str | None = None,
    initial_affine: PathLike | None = None,
    bias_correct: bool = False,
    replace_nonfinite: float | None = None,
    fixed_mask: PathLike | None = None,
    moving_mask: PathLike | None = None,
) -> AffineResult:
    """Run only the affine stage on two files and write its outputs (``hyperreg affine``).

    The stage is ``register``'s own (:func:`~hyperreg.registration.pipeline.load_pair`, its
    reruns for other contrasts and a cut field of view included), so the transform written is
    the one ``register`` starts from. Every input is read and checked, and the registration
    runs, before anything is written.

    Args:
        moving: Moving image (NIfTI, MGZ or npz), any grid, orientation and spacing.
        fixed: Fixed image; the outputs take its grid, affine, layout and header codes.
        init: ``"affine"`` (default), ``"rigid"`` or ``"none"`` (identity: the moving image is
            only resampled through the headers).
        moved: Output for the moved image (float32, the moving image's intensities; 0 outside
            it), or None.
        affine_out: Output ITK transform (``.mat`` binary, ``.tfm``/``.txt`` text):
            ``AffineTransform_double_3_3``, LPS mm, fixed point -> moving point, as
            ``antsApplyTransforms -t`` and ``sitk.ReadTransform`` take it.
        moving_seg: Moving label map, warped with nearest neighbour (for ``moved_seg``/Dice).
        fixed_seg: Fixed label map: with ``moving_seg``, Dice over the labels of the two input
            maps (:func:`~hyperreg.method.metrics.registration_dice`).
        moved_seg: Output for the moved label map (integer type), or None.
        seed: Seed of the metric sampling (3D).
        npz_geometry: Geometry of npz inputs (no header): ``"fixed"``, ``"identity"`` or None
            (an npz input is an error), see :func:`hyperreg.registration.inputs.load_input`.
        initial_affine: An ITK ``.mat``/``.tfm`` to start from (refined by the stage; with
            ``init="none"`` applied as is), checked against the pair
            (:func:`~hyperreg.geometry.affine.load_initial_affine`).
        bias_correct: Register bias-corrected copies (N4,
            :func:`~hyperreg.registration.pipeline.model_image`); the outputs are sampled from
            the files as read.
        replace_nonfinite: The value NaN/inf voxels of the images take (logged with their
            count; label maps must be finite); None (default): such an image is an error.
        fixed_mask, moving_mask: Cost masks (0/1 files; ANTs' ``-x``), or None: the metric
            counts only voxels inside them (:func:`~hyperreg.registration.masks.load_mask`;
            a mask on another grid is resampled onto its image's, with a logged note).

    Returns:
        An :class:`AffineResult`.

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: On unreadable inputs or bad output suffixes, 2D with 3D, an empty or
            constant image, images that do not overlap in world space with ``init="none"``
            (:func:`~hyperreg.registration.inputs.check_registrable`), or a diverging
            registration (see :func:`~hyperreg.geometry.affine.register_affine`).
    """
    fn = "affine_files"
    if init not in AFFINE_INITS:
        raise InputError(
            fn,
            "{0} must be one of {choices}, got {init!r}",
            "init",
            choices=AFFINE_INITS,
            init=init,
        )
    if moved_seg is not None and moving_seg is None:
        raise InputError(fn, "{0} needs {1} (the label map to warp)", "moved_seg", "moving_seg")
    inputs = (moving, fixed, moving_seg, fixed_seg)
    check_outputs(fn, inputs, moved=moved, moved_seg=moved_seg)
    check_transform_path(fn, "affine_out", affine_out)
    if affine_out is not None and Path(affine_out).resolve() in {
        Path(p).resolve() for p in inputs if p is not None
    }:
        raise InputError(
            fn, "{0} would overwrite the input '{path}'", "affine_out", path=affine_out
        )
    # register's own affine stage (its reruns for other contrasts and a cut field of view
    # included): the affine of 'affine' is the one 'register' starts from
    pair = load_pair(
        moving,
        fixed,
        moving_seg=moving_seg,
        fixed_seg=fixed_seg,
        init=init,
        initial_affine=initial_affine,
        seed=seed,
        npz_geometry=npz_geometry,
        bias_correct=bias_correct,
        replace_nonfinite=replace_nonfinite,
        fixed_mask=fixed_mask,
        moving_mask=moving_mask,
        contrast="auto",
    )
    for note in pair.notes:  # as register says them: a resampled input always, the rest -v
        logger.log(logging.WARNING if note.startswith("resampled") else logging.DEBUG, "%s", note)
    transform, grid = pair.transform, pair.fixed  # outputs sampled from the files as read
    moved_seg_v = None
    dice = dice_before = shared = None
    if pair.moving_seg is not None:
        moved_seg_v = sample_volume(pair.moving_seg, transform, None, grid, label=True)
        if pair.fixed_seg is not None:
            dice = registration_dice(moved_seg_v.data, pair.fixed_seg.data, labels=pair.labels)
            dice_before, shared = pair.dice_before, pair.shared_labels
    if affine_out is not None:
        save_affine(affine_out, transform, grid.ndim)
    if moved is not None:
        save_volume(moved, sample_volume(pair.moving, transform, None, grid).data, grid)
    if moved_seg is not None and moved_seg_v is not None:
        save_volume(moved_seg, moved_seg_v.data, grid, label=True)
    return AffineResult(transform, dice, dice_before, shared)


class WarpedFile(NamedTuple):
    """One output of :func:`warp_files`.

    Attributes:
        moved: The path written.
        label: Whether it was a label map (nearest neighbour, integer output).
        shape: Its spatial shape (the target grid's).
        data: The array written: float32 for images, int32 for label maps, shape ``shape``.
        grid: The target grid (the field's, or ``fixed``'s); ``data`` has its affine and layout.
        resampled: A message when the file lay on another grid than the target (it was then
            sampled once, through both headers and the chain), else None.
    """

    moved: Path
    label: bool
    shape: tuple[int, ...]
    data: np.ndarray
    grid: Volume
    resampled: str | None


def _load_seg(seg: PathLike, name: str, geometry: dict) -> Volume:
    with passed_as(path=name):  # errors of the file name the argument that gave it
        return load_input(seg, label=True, **geometry)


def _check_fill(fn: str, fill: str | float, labels: Sequence[bool]) -> None:
    """``fill`` is a valid background, and has an image to apply to when it is not 0."""
    outside_fill(np.zeros(1, np.float32), fill)  # InputError of argument "fill"
    if all(labels) and fill != "zero":
        raise InputError(
            fn,
            "{0} {fill!r} applies to images; label maps always take 0 (the background) outside "
            "the moving file",
            "fill",
            fill=fill,
        )


def _sample_filled(
    volume: Volume,
    transform: AffineTransform,
    disp: np.ndarray | None,
    grid: Volume,
    label: bool,
    fill: str | float,
) -> np.ndarray:
    """:func:`sample_volume` with ``fill`` outside an image (sample ``data - offset`` with the
    fill's padding, add ``offset``); label maps take 0 outside."""
    if label or fill == "zero":
        return sample_volume(volume, transform, disp, grid, label=label).data
    recipe = outside_fill(volume.data, fill)
    shifted = dataclasses.replace(volume, data=volume.data - np.float32(recipe.offset))
    sampled = sample_volume(shifted, transform, disp, grid, padding=recipe.padding).data
    return (sampled + np.float32(recipe.offset)).astype(np.float32)


def _warp_labels(
    fn: str,
    moving: Sequence[PathLike],
    moved: Sequence[PathLike],
    warp_field: PathLike | None,
    affine: PathLike | None,
    fixed: PathLike | None,
    nearest: bool | Sequence[bool],
) -> list[bool]:
    """One label-map flag per moving file, after the checks of :func:`warp_files`' arguments."""
    if warp_field is None and affine is None:
        raise InputError(fn, "give {0} and/or {1} (the transform to apply)", "warp_field", "affine")
    labels = [bool(nearest)] * len(moving) if isinstance(nearest, bool) else list(nearest)
    if not (len(moving) == len(moved) == len(labels)) or not moving:
        raise InputError(
            fn,
            "{1} and {0} must list the same number of files (at least one), got {m} and {n}"
            + ("" if len(labels) == len(moving) else " ({k} 'nearest' flags)"),
            "moved",
            "moving",
            m=len(moving),
            n=len(moved),
            k=len(labels),
        )
    if warp_field is None and fixed is None:
        raise InputError(
            fn, "{0} is needed to give the output grid when there is no field", "fixed"
        )
    return labels


def _target_grid(
    fn: str, warp_field: PathLike | None, fixed: PathLike | None, read: dict[str, Any]
) -> tuple[Volume, np.ndarray | None]:
    """The output grid of :func:`warp_files` (the field's, else ``fixed``'s, read with
    ``read``: :func:`load_input`'s options) and the field's displacement (None without a
    field); ``fixed`` must lie on the field's grid."""
    if warp_field is None:
        with passed_as(path="fixed"):
            return load_input(fixed, **read), None
    with passed_as(path="warp_field"):
        field = load_displacement(warp_field)
    if fixed is not None:
        with passed_as(path="fixed"):
            fixed_v = load_input(fixed, **read)
        if not same_grid(fixed_v, field.grid):
            raise InputError(
                fn,
                "{0} '{fixed}' must lie on the grid of the field {1} '{field}' (the field "
                "defines the output grid); drop {0} or give the matching one",
                "fixed",
                "warp_field",
                fixed=fixed,
                field=warp_field,
            )
    return field.grid, field.disp


def warp_files(
    moving: Sequence[PathLike],
    moved: Sequence[PathLike],
    *,
    warp_field: PathLike | None = None,
    affine: PathLike | None = None,
    fixed: PathLike | None = None,
    nearest: bool | Sequence[bool] = False,
    resample: bool = True,
    npz_geometry: str | None = None,
    fill: str | float = "zero",
    replace_nonfinite: float | None = None,
) -> list[WarpedFile]:
    """Apply a saved chain (affine, then displacement field) to several files, one interpolation.

    Fixed voxel ``x`` takes each moving file at the world point ``M @ A_f @ (x + u(x))``
    (``M`` the affine, identity without ``affine``; ``u`` the field in voxels of its grid, zero
    without ``warp_field``), sampled from the file's own grid: a composed field written by
    ``hyperreg register --warp`` alone, or ``--affine-out`` with ``--field-out``, give the same
    result, which is ``register``'s ``--moved`` of an affine chain. Points outside a moving file
    take 0 by default, as the chain in ``register`` and ITK/ANTs resample, whatever the grids;
    ``fill`` chooses another value for images (label maps always take 0, the background).

    Args:
        moving: Images and/or label maps to warp (NIfTI, MGZ or npz), any grids.
        moved: One output NIfTI per ``moving``, written with the target grid's affine, layout
            and header codes: float32, or the smallest integer type for label maps.
        warp_field: Displacement field (voxel or ITK format, detected); its grid is the target.
        affine: ITK affine transform file (hyperreg, ANTs or SimpleITK), fixed -> moving.
        fixed: Target grid when there is no field (required then); with a field it must lie on
            the field's grid.
        nearest: Label map(s): nearest neighbour, integer output; one bool for all, or one per
            ``moving``.
        resample: Without ``affine``, a moving file on another grid than the field's is an error
            when False.
        npz_geometry: Geometry of npz inputs (no header): ``"fixed"`` (the target grid's),
            ``"identity"`` or None (an npz input is an error), see
            :func:`hyperreg.registration.inputs.load_input`.
        fill: Value of images outside the moving file
            (:func:`hyperreg.geometry.intensity.outside_fill`): ``"zero"`` (default), ``"edge"``
            (the nearest edge voxel), ``"min"`` (the image minimum, e.g. a CT's −1024) or a
            finite number in the image's units.
        replace_nonfinite: The value NaN/inf voxels of the images take (logged with their
            count; label maps must be finite); None (default): such an image is an error.

    Returns:
        One :class:`WarpedFile` per output, in order.

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: If neither ``warp_field`` nor ``affine`` is given, the counts of
            ``moving``/``moved``/``nearest`` differ, an output suffix is wrong or repeats, the
            transform file is not a transform, a file's dimensionality differs from the target
            grid's, or ``fixed`` is missing (no field) or off the field's grid; ``fill`` is not
            one of those (``InputError``, argument ``fill``), or is not ``"zero"`` when every
            file is a label map.
    """
    fn = "warp_files"
    labels = _warp_labels(fn, moving, moved, warp_field, affine, fixed, nearest)
    _check_fill(fn, fill, labels)
    sources = (*moving, warp_field, affine, fixed)
    names = {f"moved[{n}]": "moved" for n in range(len(moved))}  # each one of 'moved'
    with passed_as(**names):
        check_outputs(fn, sources, **{name: path for name, path in zip(names, moved)})
    with passed_as(path="affine"):
        transform = load_affine(affine) if affine is not None else AffineTransform.identity()
    read = dict(npz_geometry=npz_geometry, replace_nonfinite=replace_nonfinite)
    grid, disp = _target_grid(fn, warp_field, fixed, read)
    volumes = []
    for path, label in zip(moving, labels):
        with passed_as(path="moving"):
            volume = load_input(path, label=label, fixed=grid, **read)
        if volume.ndim != grid.ndim:
            raise InputError(
                fn,
                "'{path}' is {n}D but the target grid is {m}D (shape {shape}); both must be 2D "
                "or both 3D",
                "moving",
                path=path,
                n=volume.ndim,
                m=grid.ndim,
                shape=grid.spatial_shape,
            )
        if affine is None and not resample:
            check_same_grid(volume, grid)
        if not label and looks_like_label_map(volume):
            warnings.warn(
                f"'{path}' looks like a label map (few integer ids, piecewise constant) but is "
                "warped as an intensity image, with linear interpolation that blends ids into "
                "values no label has; warp it as a label map instead (nearest neighbour: "
                f"--labels '{path}' or --nearest on the command line, nearest=True in Python)",
                stacklevel=2,
            )
        volumes.append(volume)
    outputs = []
    for volume, out, label in zip(volumes, moved, labels):
        data = _sample_filled(volume, transform, disp, grid, label, fill)
        note = None
        if not same_grid(volume, grid):
            note = (
                f"sampled '{volume.path}' ({describe_grid(volume)}) once through both headers "
                f"onto the target grid ({describe_grid(grid)})"
            )
        save_volume(out, data, grid, label=label)
        outputs.append(WarpedFile(Path(out), label, grid.spatial_shape, data, grid, note))
    return outputs
