"""Register scan pairs with a trained model at a chosen λ.

:func:`register_pair` works on loaded :class:`~hyperreg.io.Volume` objects (numpy in, numpy out),
:func:`register_files` adds the file boundary: it loads and validates every input first, registers,
and only then writes the outputs (each atomically), so bad input never leaves half-written files.
Must not import train or cli.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from hyperreg._checks import as_lambda_tensor
from hyperreg.data import normalize_intensity
from hyperreg.io import Volume, check_same_grid, load_volume, save_displacement, save_volume
from hyperreg.metrics import dice_per_label, field_summary
from hyperreg.model import HyperMorph
from hyperreg.spatial import warp

__all__ = ["RegistrationResult", "register_files", "register_pair"]

logger = logging.getLogger(__name__)


@dataclass
class RegistrationResult:
    """Outputs of one registration, on the fixed grid, as numpy arrays.

    Attributes:
        moved: Moved image, spatial shape of ``fixed``, float32, normalised intensities.
        disp: Displacement ``(N, *S)`` in voxels, i/j/k order, ``moved[x] = moving(x + disp(x))``.
        moved_seg: Moved label map (int32, nearest neighbour) or None.
        lam: The λ used.
        dice: ``{label: Dice}`` between moved and fixed label maps, or None.
        folding_fraction: Share of voxels with Jacobian determinant ≤ 0.
        log_jacobian_std: Standard deviation of log J.
    """

    moved: np.ndarray
    disp: np.ndarray
    moved_seg: np.ndarray | None
    lam: float
    dice: dict[int, float] | None = None
    folding_fraction: float = 0.0
    log_jacobian_std: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def mean_dice(self) -> float | None:
        """Mean Dice over the scored labels, or None without label maps."""
        if self.dice is None:
            return None
        values = [v for v in self.dice.values() if not math.isnan(v)]
        return float(np.mean(values)) if values else float("nan")


def _as_input(volume: Volume, normalization: str, device: torch.device) -> torch.Tensor:
    data = normalize_intensity(volume.data, normalization)
    return torch.from_numpy(data)[None, None].to(device)


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
) -> RegistrationResult:
    """Register ``moving`` to ``fixed`` at λ = ``lam`` on the model's device.

    Args:
        model: A trained :class:`~hyperreg.model.HyperMorph` (its ``ndim`` must match).
        moving: Moving image on the same grid as ``fixed``.
        fixed: Fixed image.
        lam: λ in [0, 1].
        moving_seg: Optional moving label map (same grid as ``moving``), warped with nearest
            neighbour.
        fixed_seg: Optional fixed label map; with ``moving_seg`` it enables Dice.
        normalization: Intensity normalisation, see :func:`hyperreg.data.normalize_intensity`.

    Returns:
        A :class:`RegistrationResult`.

    Raises:
        ValueError: If the grids differ, the dimensionality does not match the model, or ``lam``
            lies outside [0, 1].
    """
    check_same_grid(moving, fixed)
    for seg, image in ((moving_seg, moving), (fixed_seg, fixed)):
        if seg is not None and seg.spatial_shape != image.spatial_shape:
            raise ValueError(
                f"register_pair(): label map '{seg.path}' has shape {seg.spatial_shape}, its "
                f"image '{image.path}' has {image.spatial_shape}"
            )
    if fixed.ndim != model.config.ndim:
        raise ValueError(
            f"register_pair(): the model is {model.config.ndim}D but '{fixed.path}' is "
            f"{fixed.ndim}D with shape {fixed.spatial_shape}"
        )
    device = next(model.parameters()).device
    lam_t = as_lambda_tensor("register_pair", lam, 1, device)
    out = model(
        _as_input(moving, normalization, device), _as_input(fixed, normalization, device), lam_t
    )
    moved_seg = None
    if moving_seg is not None:
        seg = torch.from_numpy(moving_seg.data.astype(np.float32))[None, None].to(device)
        moved_seg = warp(seg, out.disp, mode="nearest").round().to(torch.int32)[0, 0].cpu().numpy()
    summary = field_summary(out.disp)
    dice = None
    if moved_seg is not None and fixed_seg is not None:
        dice = dice_per_label(moved_seg, fixed_seg.data)
    return RegistrationResult(
        moved=out.moved[0, 0].float().cpu().numpy(),
        disp=out.disp[0].float().cpu().numpy(),
        moved_seg=moved_seg,
        lam=float(lam_t.item()),
        dice=dice,
        folding_fraction=summary["folding_fraction"],
        log_jacobian_std=summary["log_jacobian_std"],
    )


PathLike = str | os.PathLike[str]
OUTPUT_SUFFIXES = (".nii.gz", ".nii")


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
) -> RegistrationResult:
    """Load, register and write: the file-level form of :func:`register_pair`.

    Every input is read and checked before anything is written; each output is written
    atomically with the fixed image's affine and disk layout. ``warp_out`` receives the
    displacement field (NIfTI, channel last, voxels, i/j/k order, fixed-image affine).

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: If an input is unreadable or invalid (4D series, non-finite voxels, grids
            that differ), ``moved_seg`` is asked for without ``moving_seg``, or ``lam`` is out of
            range.
    """
    if moved_seg is not None and moving_seg is None:
        raise ValueError("register_files(): 'moved_seg' needs 'moving_seg' (the label map to warp)")
    for name, out in (("moved", moved), ("warp_out", warp_out), ("moved_seg", moved_seg)):
        if out is not None and not str(out).endswith(OUTPUT_SUFFIXES):
            raise ValueError(
                f"register_files(): '{name}' must end in {OUTPUT_SUFFIXES}, got '{out}'"
            )
    moving_v = load_volume(moving)
    fixed_v = load_volume(fixed)
    moving_seg_v = load_volume(moving_seg, label=True) if moving_seg is not None else None
    fixed_seg_v = load_volume(fixed_seg, label=True) if fixed_seg is not None else None
    result = register_pair(
        model,
        moving_v,
        fixed_v,
        lam,
        moving_seg=moving_seg_v,
        fixed_seg=fixed_seg_v,
        normalization=normalization,
    )
    if moved is not None:
        save_volume(moved, result.moved, fixed_v)
    if warp_out is not None:
        save_displacement(warp_out, result.disp, fixed_v)
    if moved_seg is not None and result.moved_seg is not None:
        save_volume(moved_seg, result.moved_seg, fixed_v, label=True)
    return result
