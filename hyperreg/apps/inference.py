"""Register scan pairs with a trained model at a chosen λ, and apply or inspect saved fields.

:func:`register_pair` works on loaded :class:`~hyperreg.geometry.io.Volume` objects (numpy in, numpy out),
:func:`register_files` adds the file boundary: it loads and validates every input first, registers,
and only then writes the outputs (each atomically), so bad input never leaves half-written files.
Registration is voxel-to-voxel on the fixed grid: a moving image (or label map) on another grid is
first resampled onto it through both affines (:func:`hyperreg.geometry.resample.resample_to`), unless
resampling is turned off, in which case differing grids are an error. :func:`warp_file` applies a
saved displacement field (either on-disk format) to another image or label map;
:func:`jacobian_file` writes its Jacobian determinant map. Must not import train or cli.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from hyperreg._checks import as_lambda_tensor, check_option
from hyperreg.training.data import normalize_intensity
from hyperreg.geometry.fields import (
    DISPLACEMENT_FORMATS,
    check_itk_grid,
    load_displacement,
    save_displacement,
)
from hyperreg.geometry.io import (
    _SAVE_SUFFIXES,
    Volume,
    check_same_grid,
    load_volume,
    same_grid,
    save_volume,
)
from hyperreg.method.losses import gradient_loss
from hyperreg.method.metrics import dice_per_label, field_summary, mean_dice
from hyperreg.method.model import HyperMorph, RegistrationOutput
from hyperreg.geometry.resample import describe_grid, resample_to
from hyperreg.method.spatial import jacobian_determinant, warp

__all__ = [
    "JacobianResult",
    "RegistrationResult",
    "WarpResult",
    "jacobian_file",
    "register_files",
    "register_pair",
    "warp_file",
]

logger = logging.getLogger(__name__)


@dataclass
class RegistrationResult:
    """Outputs of one registration, on the fixed grid, as numpy arrays.

    Attributes:
        moved: Moved image, spatial shape of ``fixed``, float32, in the moving image's own
            intensity units (the model sees normalised intensities; the output does not).
        disp: Displacement ``(N, *S)`` in voxels, i/j/k order, ``moved[x] = moving(x + disp(x))``.
        moved_seg: Moved label map (int32, nearest neighbour) or None.
        lam: The λ used.
        dice: ``{label: Dice}`` between moved and fixed label maps, or None.
        folding_fraction: Share of voxels with Jacobian determinant ≤ 0.
        log_jacobian_std: Standard deviation of log J.
        extra: More scalars: ``"smoothness"`` (:func:`~hyperreg.method.losses.gradient_loss` of the
            field training regularises: the velocity when the model integrates one, else the
            displacement; voxels²) from :func:`register_pair`, ``"dice_before"`` (mean Dice of
            the unregistered label maps) when both label maps are given, ``"ncc"`` from sweeps.
        resampled: One message per input that was resampled onto the fixed grid, e.g.
            ``"resampled moving 'm.nii.gz' (shape (150, 181), ...) onto the fixed grid (...)"``.
    """

    moved: np.ndarray
    disp: np.ndarray
    moved_seg: np.ndarray | None
    lam: float
    dice: dict[int, float] | None = None
    folding_fraction: float = 0.0
    log_jacobian_std: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    resampled: list[str] = field(default_factory=list)

    @property
    def mean_dice(self) -> float | None:
        """Mean Dice over the scored labels, or None without label maps."""
        if self.dice is None:
            return None
        values = [v for v in self.dice.values() if not math.isnan(v)]
        return float(np.mean(values)) if values else float("nan")


def _onto_grid(
    fn: str,
    volume: Volume,
    grid: Volume,
    role: str,
    *,
    label: bool,
    resample: bool,
    target: str = "fixed",
) -> tuple[Volume, str | None]:
    """``volume`` on ``grid``: unchanged, resampled (with a message), or a ValueError."""
    if same_grid(volume, grid):
        return volume, None
    if not resample:
        check_same_grid(volume, grid)  # raises, naming both files, shapes and spacings
    moved = resample_to(volume, grid, label=label)
    message = (
        f"resampled {role} '{volume.path}' ({describe_grid(volume)}) onto the {target} grid "
        f"({describe_grid(grid)})"
    )
    logger.debug("%s(): %s", fn, message)
    return moved, message


def _as_input(volume: Volume, normalization: str, device: torch.device) -> torch.Tensor:
    data = normalize_intensity(volume.data, normalization)
    if normalization == "none" and data.size and (data.min() < 0 or data.max() > 1):
        raise ValueError(
            f"'{volume.path}' has intensities in [{data.min():g}, {data.max():g}], outside the "
            "[0, 1] the model expects; use the default min-max normalisation instead of 'none'"
        )
    return torch.from_numpy(data)[None, None].to(device)


def _prepare_pair(
    fn: str,
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    moving_seg: Volume | None,
    fixed_seg: Volume | None,
    *,
    resample: bool,
) -> tuple[Volume, Volume | None, Volume | None, list[str]]:
    """Check a pair against the model and bring every input onto the fixed grid.

    Returns ``(moving, moving_seg, fixed_seg, notes)`` on the fixed grid, with one note per input
    that was resampled. Raises as :func:`register_pair` documents.
    """
    if fixed.ndim != model.config.ndim:
        raise ValueError(
            f"{fn}(): the model is {model.config.ndim}D but '{fixed.path}' is "
            f"{fixed.ndim}D with shape {fixed.spatial_shape}"
        )
    if not resample:
        check_same_grid(moving, fixed)
        for seg, image in ((moving_seg, moving), (fixed_seg, fixed)):
            if seg is not None and not same_grid(seg, image):
                raise ValueError(
                    f"{fn}(): label map '{seg.path}' must lie on the grid of its image "
                    f"'{image.path}', got {describe_grid(seg)} vs {describe_grid(image)}; "
                    "resample it first (resample=True)"
                )
    notes: list[str] = []
    moving, note = _onto_grid(fn, moving, fixed, "moving", label=False, resample=resample)
    notes += [note] if note else []
    if moving_seg is not None:
        moving_seg, note = _onto_grid(
            fn, moving_seg, fixed, "moving label map", label=True, resample=resample
        )
        notes += [note] if note else []
    if fixed_seg is not None:
        fixed_seg, note = _onto_grid(
            fn, fixed_seg, fixed, "fixed label map", label=True, resample=resample
        )
        notes += [note] if note else []
    return moving, moving_seg, fixed_seg, notes


def _result_from_output(
    out: RegistrationOutput,
    index: int,
    lam: float,
    moving_seg: Volume | None,
    fixed_seg: Volume | None,
    notes: list[str],
    labels: Sequence[int] | None = None,
    moving: Volume | None = None,
) -> RegistrationResult:
    """The :class:`RegistrationResult` of sample ``index`` of a model output (fixed grid).

    With ``moving`` (on the fixed grid), ``moved`` is ``moving`` warped in its own intensity
    units, as ANTs and VoxelMorph write it; otherwise the model's normalised moved image.
    """
    disp = out.disp[index : index + 1].float()
    if moving is not None:
        raw = torch.from_numpy(moving.data.astype(np.float32))[None, None].to(disp.device)
        moved = warp(raw, disp)[0, 0].cpu().numpy()
    else:
        moved = out.moved[index, 0].float().cpu().numpy()
    moved_seg = None
    if moving_seg is not None:
        seg = torch.from_numpy(moving_seg.data.astype(np.float32))[None, None].to(disp.device)
        moved_seg = warp(seg, disp, mode="nearest").round().to(torch.int32)[0, 0].cpu().numpy()
    summary = field_summary(disp)
    dice = None
    if moved_seg is not None and fixed_seg is not None:
        dice = dice_per_label(moved_seg, fixed_seg.data, labels)
    return RegistrationResult(
        moved=moved,
        disp=disp[0].cpu().numpy(),
        moved_seg=moved_seg,
        lam=lam,
        dice=dice,
        folding_fraction=summary["folding_fraction"],
        log_jacobian_std=summary["log_jacobian_std"],
        resampled=list(notes),
    )


@torch.no_grad()
def register_pair(
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    lam: float,
    *,
    moving_seg: Volume | None = None,
    fixed_seg: Volume | None = None,
    normalization: str = "minmax",
    resample: bool = False,
) -> RegistrationResult:
    """Register ``moving`` to ``fixed`` at λ = ``lam`` on the model's device.

    Registration is voxel-to-voxel on the fixed grid. With ``resample=True``, ``moving`` (linear
    interpolation) and ``moving_seg`` / ``fixed_seg`` (nearest neighbour, label ids preserved)
    are first resampled onto the fixed grid through their own affines when they are not on it
    (:func:`hyperreg.geometry.io.same_grid` false: shape, spacing, orientation or position differ), and
    ``RegistrationResult.resampled`` says which. Intensities are normalised after resampling.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph` (its ``ndim`` must match).
        moving: Moving image, on the fixed grid unless ``resample`` is True.
        fixed: Fixed image.
        lam: λ in [0, 1].
        moving_seg: Optional moving label map (int32), on the grid of ``moving`` (or anywhere
            in world space with ``resample``), warped with nearest neighbour.
        fixed_seg: Optional fixed label map; with ``moving_seg`` it enables Dice.
        normalization: Intensity normalisation, see :func:`hyperreg.training.data.normalize_intensity`.
        resample: Resample inputs that are not on the fixed grid (default False: they are an
            error, as in :func:`hyperreg.geometry.io.check_same_grid`).

    Returns:
        A :class:`RegistrationResult`; every array is on the fixed grid.

    Raises:
        ValueError: If the grids differ and ``resample`` is False, a label map is not on its
            image's grid (without ``resample``), the dimensionality does not match the model or
            between the images, or ``lam`` lies outside [0, 1].
    """
    fn = "register_pair"
    moving, moving_seg, fixed_seg, notes = _prepare_pair(
        fn, model, moving, fixed, moving_seg, fixed_seg, resample=resample
    )
    device = next(model.parameters()).device
    lam_t = as_lambda_tensor(fn, lam, 1, device)
    out = model(
        _as_input(moving, normalization, device), _as_input(fixed, normalization, device), lam_t
    )
    result = _result_from_output(
        out, 0, float(lam_t.item()), moving_seg, fixed_seg, notes, moving=moving
    )
    regularised = out.velocity if out.velocity is not None else out.disp
    result.extra["smoothness"] = float(gradient_loss(regularised.float()))
    if result.dice is not None and moving_seg is not None and fixed_seg is not None:
        result.extra["dice_before"] = mean_dice(moving_seg.data, fixed_seg.data, list(result.dice))
    return result


PathLike = str | os.PathLike[str]
OUTPUT_SUFFIXES = _SAVE_SUFFIXES  # what io.save_volume and fields.save_displacement write


def _check_outputs(
    fn: str, inputs: Sequence[PathLike | None] = (), **outputs: PathLike | None
) -> None:
    """Check output paths before any work: suffix, distinct, not an input, folder creatable."""
    sources = {Path(p).resolve() for p in inputs if p is not None}
    seen: dict[Path, str] = {}
    for name, out in outputs.items():
        if out is None:
            continue
        if not str(out).endswith(OUTPUT_SUFFIXES):
            raise ValueError(f"{fn}(): '{name}' must end in {OUTPUT_SUFFIXES}, got '{out}'")
        path = Path(out).resolve()
        if path in seen:
            raise ValueError(
                f"{fn}(): '{name}' and '{seen[path]}' are the same file '{out}'; give each "
                "output its own path"
            )
        if path in sources:
            raise ValueError(
                f"{fn}(): '{name}' would overwrite the input '{out}'; choose another path"
            )
        if path.is_dir():
            raise ValueError(f"{fn}(): '{name}' is a folder, not a file: '{out}'")
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise ValueError(f"{fn}(): cannot write '{out}': '{folder}' is a file, not a folder")
        if not os.access(folder, os.W_OK):
            raise ValueError(f"{fn}(): cannot write '{out}': folder '{folder}' is not writable")
        seen[path] = name


def register_files(
    model: HyperMorph,
    moving: PathLike,
    fixed: PathLike,
    lam: float,
    *,
    moved: PathLike | None = None,
    warp_out: PathLike | None = None,
    moving_seg: PathLike | None = None,
    fixed_seg: PathLike | None = None,
    moved_seg: PathLike | None = None,
    normalization: str = "minmax",
    resample: bool = True,
    warp_format: str = "voxel",
) -> RegistrationResult:
    """Load, register and write: the file-level form of :func:`register_pair`.

    Every input is read and checked before anything is written; each output is written
    atomically with the fixed image's affine and disk layout. Inputs not on the fixed grid are
    resampled onto it first (see :func:`register_pair`; ``resample=False`` makes that an error).
    ``warp_out`` receives the displacement field on the fixed grid in ``warp_format``: ``"voxel"``
    (channel last, voxels, i/j/k order) or ``"itk"`` (LPS world mm, vector intent, 5D; see
    :func:`hyperreg.geometry.fields.save_displacement`).

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving: Moving image file (NIfTI, MGZ or npz).
        fixed: Fixed image file; every output takes its grid, affine and disk layout.
        lam: λ in [0, 1].
        moved: Output for the moved image (float32, normalised intensities), or None.
        warp_out: Output for the displacement field, or None.
        moving_seg: Moving label map file (rounded to integers), or None.
        fixed_seg: Fixed label map file (for Dice), or None.
        moved_seg: Output for the moved label map (unscaled integer type), or None.
        normalization: Intensity normalisation, see :func:`hyperreg.training.data.normalize_intensity`.
        resample: Resample inputs on other grids onto the fixed grid (default True).
        warp_format: ``"voxel"`` (default) or ``"itk"``.

    Returns:
        The :class:`RegistrationResult` (``resampled`` lists what was resampled).

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: If an input is unreadable or invalid (4D series, non-finite voxels, grids
            that differ with ``resample=False``), ``moved_seg`` is asked for without
            ``moving_seg``, an output suffix or ``warp_format`` is wrong, the ITK format cannot
            represent a 2D fixed grid (:func:`hyperreg.geometry.fields.check_itk_grid`), or ``lam`` is out
            of range.
    """
    fn = "register_files"
    if moved_seg is not None and moving_seg is None:
        raise ValueError(f"{fn}(): 'moved_seg' needs 'moving_seg' (the label map to warp)")
    check_option(fn, "warp_format", warp_format, DISPLACEMENT_FORMATS)
    _check_outputs(
        fn,
        (moving, fixed, moving_seg, fixed_seg),
        moved=moved,
        warp_out=warp_out,
        moved_seg=moved_seg,
    )
    moving_v = load_volume(moving)
    fixed_v = load_volume(fixed)
    moving_seg_v = load_volume(moving_seg, label=True) if moving_seg is not None else None
    fixed_seg_v = load_volume(fixed_seg, label=True) if fixed_seg is not None else None
    if warp_out is not None and warp_format == "itk":
        check_itk_grid(fixed_v)
    result = register_pair(
        model,
        moving_v,
        fixed_v,
        lam,
        moving_seg=moving_seg_v,
        fixed_seg=fixed_seg_v,
        normalization=normalization,
        resample=resample,
    )
    if moved is not None:
        save_volume(moved, result.moved, fixed_v)
    if warp_out is not None:
        save_displacement(warp_out, result.disp, fixed_v, format=warp_format)
    if moved_seg is not None and result.moved_seg is not None:
        save_volume(moved_seg, result.moved_seg, fixed_v, label=True)
    return result


class WarpResult(NamedTuple):
    """Output of :func:`warp_file`.

    Attributes:
        moved: The warped image (float32) or label map (int32), on the field's grid.
        grid: The field's (fixed) grid; ``moved`` was written with its affine and layout.
        resampled: Message if the input was first resampled onto the field's grid, else None.
    """

    moved: np.ndarray
    grid: Volume
    resampled: str | None


@torch.no_grad()
def warp_file(
    moving: PathLike,
    warp_field: PathLike,
    moved: PathLike,
    *,
    nearest: bool = False,
    resample: bool = True,
) -> WarpResult:
    """Apply a saved displacement field to an image or label map and write the result.

    The field (either on-disk format, see :func:`hyperreg.geometry.fields.load_displacement`) lives on the
    fixed grid and points into the moving image on that same grid (hyperreg registers on the
    fixed grid), so ``moved[x] = moving(x + u(x))`` with ``u`` in voxels. A ``moving`` file on
    another grid is first resampled onto the field's grid through both affines, as
    :func:`register_files` does. Intensities are not normalised. Samples outside the image take
    the edge value (``padding="border"``, as in registration).

    Args:
        moving: Image or label map to warp (NIfTI, MGZ or npz).
        warp_field: Displacement field written by ``hyperreg register --warp`` (voxel or ITK).
        moved: Output NIfTI, written atomically with the field's affine and layout: float32 for
            images; for label maps (``nearest``) the smallest integer type, unscaled.
        nearest: Treat ``moving`` as a label map: read with rounding to integers, warp with
            nearest neighbour (only input label ids appear), write as integers.
        resample: Resample a ``moving`` on another grid (default); False makes that an error.

    Returns:
        A :class:`WarpResult`.

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: If an input is unreadable or invalid, ``moved`` has a wrong suffix, the
            dimensionality of ``moving`` and the field differ, or the grids differ with
            ``resample=False``.
    """
    fn = "warp_file"
    _check_outputs(fn, (moving, warp_field), moved=moved)
    field_ = load_displacement(warp_field)
    moving_v = load_volume(moving, label=nearest)
    moving_v, note = _onto_grid(
        fn, moving_v, field_.grid, "moving", label=nearest, resample=resample, target="field"
    )
    image = torch.from_numpy(moving_v.data.astype(np.float64))[None, None]
    disp = torch.from_numpy(field_.disp.astype(np.float64))[None]
    out = warp(image, disp, mode="nearest" if nearest else "bilinear")[0, 0].numpy()
    data = np.rint(out).astype(np.int32) if nearest else out.astype(np.float32)
    save_volume(moved, data, field_.grid, label=nearest)
    return WarpResult(moved=data, grid=field_.grid, resampled=note)


class JacobianResult(NamedTuple):
    """Output of :func:`jacobian_file`.

    Attributes:
        jacobian: Jacobian determinant of ``φ(x) = x + u(x)``, shape of the fixed grid, float32.
        folding_fraction: Share of voxels with ``J <= 0``, in [0, 1].
        log_jacobian_std: Standard deviation of ``log J`` (J clipped at 1e-9).
    """

    jacobian: np.ndarray
    folding_fraction: float
    log_jacobian_std: float


@torch.no_grad()
def jacobian_file(warp_field: PathLike, out: PathLike) -> JacobianResult:
    """Write the Jacobian determinant map of a saved displacement field.

    Args:
        warp_field: Displacement field (voxel or ITK format, see
            :func:`hyperreg.geometry.fields.load_displacement`).
        out: Output NIfTI: float32 determinants (dimensionless, per voxel of the fixed grid,
            :func:`hyperreg.method.spatial.jacobian_determinant`), fixed affine and layout, atomic.

    Returns:
        A :class:`JacobianResult` with the map and its folding summary.

    Raises:
        FileNotFoundError: If ``warp_field`` is missing.
        ValueError: If the field is unreadable or invalid, a grid size is below 2, or ``out``
            has a wrong suffix.
    """
    _check_outputs("jacobian_file", (warp_field,), out=out)
    field_ = load_displacement(warp_field)
    disp = torch.from_numpy(field_.disp)[None]
    summary = field_summary(disp)
    jacobian = jacobian_determinant(disp)[0, 0].numpy().astype(np.float32)
    save_volume(out, jacobian, field_.grid)
    return JacobianResult(
        jacobian=jacobian,
        folding_fraction=summary["folding_fraction"],
        log_jacobian_std=summary["log_jacobian_std"],
    )
