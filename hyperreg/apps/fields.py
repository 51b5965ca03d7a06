"""A saved displacement field on files: one image or label map warped, and its Jacobian map.

:func:`warp_file` is one file through :func:`hyperreg.apps.transforms.warp_files` (``hyperreg
warp`` with a field); :func:`jacobian_file` writes the Jacobian determinant map of a saved field
and its folding summary (``hyperreg jacobian``). Fields are hyperreg's voxel format or ITK's
(:mod:`hyperreg.geometry.fields`). Must not import cli.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from hyperreg._errors import passed_as
from hyperreg.apps.transforms import warp_files
from hyperreg.geometry.fields import load_displacement
from hyperreg.geometry.io import Volume, save_volume
from hyperreg.method.metrics import field_summary
from hyperreg.method.spatial import jacobian_determinant
from hyperreg.registration.pairs import PathLike, check_outputs

__all__ = ["JacobianResult", "WarpResult", "jacobian_file", "warp_file"]


class WarpResult(NamedTuple):
    """Output of :func:`warp_file`.

    Attributes:
        moved: The warped image (float32) or label map (int32), on the field's grid.
        grid: The field's (fixed) grid; ``moved`` was written with its affine and layout.
        resampled: Message if the input lay on another grid (sampled once onto the field's
            grid through both affines), else None.
    """

    moved: np.ndarray
    grid: Volume
    resampled: str | None


def warp_file(
    moving: PathLike,
    warp_field: PathLike,
    moved: PathLike,
    *,
    nearest: bool = False,
    resample: bool = True,
) -> WarpResult:
    """Apply a saved displacement field to an image or label map and write the result.

    One file through :func:`warp_files` (which this calls): the field
    (either on-disk format, see :func:`hyperreg.geometry.fields.load_displacement`) lives on the
    fixed grid, ``moved[x] = moving(x + u(x))`` with ``u`` in voxels, and a ``moving`` file on
    another grid is sampled **once**, through both affines at those points (not resampled onto
    the field's grid first and then warped). Intensities are not normalised. Outside the image
    the rule is ITK's and ANTs': the edge value up to half a voxel beyond the edge, 0 further
    out (:func:`hyperreg.registration.chain.sample_volume`, as ``register`` writes outputs).

    Args:
        moving: Image or label map to warp (NIfTI, MGZ or npz).
        warp_field: Displacement field written by ``hyperreg register --warp`` (voxel or ITK).
        moved: Output NIfTI, written atomically with the field's affine and layout: float32 for
            images; for label maps (``nearest``) the smallest integer type, unscaled.
        nearest: Treat ``moving`` as a label map: read with rounding to integers, warp with
            nearest neighbour (only input label ids appear), write as integers.
        resample: Accept a ``moving`` on another grid (default); False makes that an error.

    Returns:
        A :class:`WarpResult`.

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: If an input is unreadable or invalid, ``moved`` has a wrong suffix, the
            dimensionality of ``moving`` and the field differ, or the grids differ with
            ``resample=False``.
    """
    written = warp_files(
        [moving], [moved], warp_field=warp_field, nearest=nearest, resample=resample
    )[0]
    return WarpResult(moved=written.data, grid=written.grid, resampled=written.resampled)


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
    check_outputs("jacobian_file", (warp_field,), out=out)
    with passed_as(path="warp_field"):
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
