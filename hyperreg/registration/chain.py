"""An affine followed by a displacement field, applied as one transform (one interpolation).

This module owns the composition of the two stages of a native-space registration: a world
affine :class:`~hyperreg.geometry.affine.AffineTransform` (fixed RAS point -> moving RAS point)
and a displacement field ``u`` on the fixed grid computed on the affinely aligned moving image.
A fixed voxel ``x`` goes to the moving world point

    ``q(x) = M @ A_f @ (x + u(x))``        (``M``: the affine, ``A_f``: the fixed voxel-to-RAS)

and every output (moved image, moved label map, the composed field written by ``--warp``)
samples the **original** moving file on its own grid at ``q``, so there is one interpolation,
not one per stage. The composed field in hyperreg's voxel format is
``w(x) = A_f^-1 q(x) - x`` (fixed voxels; with the identity affine ``w = u``); in ITK format it
is ``q - A_f x`` in LPS mm. :func:`register_chain` runs the model on the aligned pair and
returns the result of the whole chain. Must not import training, apps or cli.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from hyperreg.geometry.affine import AffineTransform, resample_affine
from hyperreg.geometry.io import Volume, same_grid
from hyperreg.geometry.resample import affine_3d, resample_to
from hyperreg.method.metrics import dice_per_label, mean_dice
from hyperreg.method.model import HyperMorph
from hyperreg.method.spatial import sample_at
from hyperreg.registration.pairs import RegistrationResult, register_pair

__all__ = [
    "align",
    "composed_displacement",
    "finish_chain",
    "is_identity",
    "moving_points",
    "register_chain",
    "sample_volume",
]

logger = logging.getLogger(__name__)

_SLAB_VOXELS = 2_000_000  # fixed voxels per slab when sampling (bounds float64 memory)


def _slabs(shape: tuple[int, ...]) -> list[slice]:
    """Slices along axis 0 that each hold at most about ``_SLAB_VOXELS`` voxels."""
    per_row = int(np.prod(shape[1:]))
    rows = max(1, _SLAB_VOXELS // max(per_row, 1))
    return [slice(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)]


def moving_points(
    transform: AffineTransform,
    disp: np.ndarray | None,
    fixed: Volume,
    rows: slice | None = None,
) -> np.ndarray:
    """World RAS points (mm) in the moving image of every fixed voxel: ``M A_f (x + u(x))``.

    Args:
        transform: Fixed-world to moving-world affine (identity for ``--init none``).
        disp: Displacement ``(N, *S)`` in voxels of the fixed grid (i/j/k order), defined on the
            affinely aligned moving image, or None (the affine alone).
        fixed: The fixed grid (``S = fixed.spatial_shape``).
        rows: Optional slice of fixed axis 0 (the points of a slab only).

    Returns:
        ``(3, *S')`` float64 RAS mm, ``S'`` = ``S`` with axis 0 cut to ``rows``.
    """
    shape = fixed.spatial_shape
    rows = rows if rows is not None else slice(0, shape[0])
    axes = [np.arange(shape[0], dtype=np.float64)[rows]] + [
        np.arange(n, dtype=np.float64) for n in shape[1:]
    ]
    voxels = np.stack(np.meshgrid(*axes, indexing="ij"), 0)
    if disp is not None:
        voxels += disp[:, rows].astype(np.float64)
    matrix = transform.matrix @ affine_3d(fixed)
    linear = matrix[:3, : fixed.ndim]
    return np.einsum("rn,n...->r...", linear, voxels) + matrix[:3, 3].reshape(
        (3,) + (1,) * fixed.ndim
    )


def composed_displacement(
    transform: AffineTransform, disp: np.ndarray | None, fixed: Volume
) -> np.ndarray:
    """The chain as one displacement field in hyperreg's voxel format: ``A_f^-1 q(x) - x``.

    Applied by :func:`sample_volume`-style resampling of the moving file through both affines
    (``hyperreg warp``), or, saved with ``format="itk"``, by ANTs and SimpleITK: it sends fixed
    voxel ``x`` to the same moving world point as the affine followed by ``disp``.

    Args:
        transform: Fixed-world to moving-world affine.
        disp: Deformable displacement ``(N, *S)`` in fixed voxels, or None.
        fixed: The fixed grid.

    Returns:
        ``(N, *S)`` float32, voxels of the fixed grid, i/j/k order. 2D: the in-plane part (the
        least-squares fit when the moving point leaves the fixed slice plane).
    """
    world = moving_points(transform, disp, fixed)
    affine = affine_3d(fixed)
    offset = world - affine[:3, 3].reshape((3,) + (1,) * fixed.ndim)
    inverse = np.linalg.pinv(affine[:3, : fixed.ndim])
    voxels = np.einsum("nr,r...->n...", inverse, offset)
    grid = np.stack(
        np.meshgrid(*[np.arange(n, dtype=np.float64) for n in fixed.spatial_shape], indexing="ij")
    )
    return (voxels - grid).astype(np.float32)


@torch.no_grad()
def sample_volume(
    volume: Volume,
    transform: AffineTransform,
    disp: np.ndarray | None,
    fixed: Volume,
    *,
    label: bool = False,
    padding: str = "zeros",
) -> Volume:
    """``volume`` (on its own grid) sampled at the chain's moving points, onto ``fixed``'s grid.

    One interpolation: linear for images, nearest neighbour for label maps; points outside
    ``volume`` take 0, as ITK and ANTs resample (``padding="border"``: the edge value). Works in
    slabs of the fixed grid so that a 256³ volume needs well under 1 GB.

    Args:
        volume: Moving image (float) or label map (integer), any grid; 2D slices must lie in the
            fixed slice's plane.
        transform: Fixed-world to moving-world affine.
        disp: Deformable displacement ``(N, *S)`` in fixed voxels, or None.
        fixed: The grid of the result.
        label: Label map: nearest neighbour, int32 out (float32 otherwise).
        padding: ``"zeros"`` (default) or ``"border"``, see
            :func:`~hyperreg.method.spatial.sample_at`.

    Returns:
        A :class:`Volume` on ``fixed``'s grid (affine, disk shape and header codes), with
        ``volume``'s path.
    """
    to_voxel = np.linalg.inv(affine_3d(volume))
    data = torch.from_numpy(volume.data.astype(np.float64))[None, None]
    out = np.empty(fixed.spatial_shape, np.float64)
    for rows in _slabs(fixed.spatial_shape):
        world = moving_points(transform, disp, fixed, rows)
        voxels = np.einsum("rc,c...->r...", to_voxel[:3, :3], world)
        voxels += to_voxel[:3, 3].reshape((3,) + (1,) * fixed.ndim)
        points = torch.from_numpy(np.ascontiguousarray(voxels[: volume.ndim]))[None]
        sampled = sample_at(data, points, "nearest" if label else "bilinear", padding)
        out[rows] = sampled[0, 0].numpy()
    result = np.rint(out).astype(np.int32) if label else out.astype(np.float32)
    return Volume(
        data=result,
        affine=fixed.affine,
        disk_shape=fixed.disk_shape,
        path=volume.path,
        codes=fixed.codes,
    )


def is_identity(transform: AffineTransform, moving: Volume, fixed: Volume) -> bool:
    """Whether the chain's affine is the identity and ``moving`` already lies on the fixed grid
    (then nothing needs composing: the plain field is the whole transform)."""
    return bool(np.allclose(transform.matrix, np.eye(4), atol=1e-9)) and same_grid(moving, fixed)


def align(
    moving: Volume, fixed: Volume, transform: AffineTransform, *, label: bool = False
) -> Volume:
    """``moving`` on the fixed grid through ``transform`` (the model's input; one interpolation).

    Returns ``moving`` itself when :func:`is_identity`.
    """
    if is_identity(transform, moving, fixed):
        return moving
    return resample_affine(moving, fixed, transform, label=label)


def finish_chain(
    result: RegistrationResult,
    moving: Volume | None,
    fixed: Volume,
    transform: AffineTransform,
    *,
    moving_seg: Volume | None = None,
    fixed_seg: Volume | None = None,
    labels: Sequence[int] | None = None,
    baselines: bool = True,
) -> RegistrationResult:
    """Replace the outputs of a registration of the aligned pair by those of the whole chain.

    ``result.moved`` and ``result.moved_seg`` are sampled again from the **original** ``moving``
    (None: ``result.moved`` is left as it is, for callers that score label maps only) and
    ``moving_seg`` through ``transform`` and ``result.disp`` (:func:`sample_volume`); Dice
    (over ``labels``, default those in both maps) and, with ``baselines``,
    ``extra["dice_before"]`` (no registration) and ``extra["dice_affine"]`` (the affine alone)
    are computed against ``fixed_seg`` (moved onto the fixed grid if needed). ``result.disp``
    stays the deformable field alone. Modifies and returns ``result``.
    """
    if moving is not None:
        result.moved = sample_volume(moving, transform, result.disp, fixed).data
    if moving_seg is not None:
        moved_seg = sample_volume(moving_seg, transform, result.disp, fixed, label=True)
        result.moved_seg = moved_seg.data
        if fixed_seg is not None:
            if not same_grid(fixed_seg, fixed):
                fixed_seg = resample_to(fixed_seg, fixed, label=True)
            result.dice = dice_per_label(moved_seg.data, fixed_seg.data, labels)
        if fixed_seg is not None and baselines:
            labels = list(result.dice or {})
            before = resample_to(moving_seg, fixed, label=True).data
            affine_only = sample_volume(moving_seg, transform, None, fixed, label=True).data
            result.extra["dice_before"] = mean_dice(before, fixed_seg.data, labels)
            result.extra["dice_affine"] = mean_dice(affine_only, fixed_seg.data, labels)
    if moving is not None:
        result.resampled.append(
            f"moving '{moving.path}' sampled once through the {transform.kind} stage and the "
            "field onto the fixed grid"
        )
    return result


def register_chain(
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    lam: float,
    transform: AffineTransform,
    *,
    moving_seg: Volume | None = None,
    fixed_seg: Volume | None = None,
    normalization: str = "minmax",
) -> RegistrationResult:
    """Deformable registration at λ of the affinely aligned pair, outputs through the chain.

    The moving image is resampled once through ``transform`` onto the fixed grid for the model
    only (:func:`align`); the moved image and the moved label map are then sampled from the
    **original** ``moving`` and ``moving_seg`` at the chain's points (:func:`finish_chain`), one
    interpolation each.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph` of the pair's dimensionality.
        moving: Moving image ``(I, J[, K])``, any grid in world space.
        fixed: Fixed image.
        lam: λ in [0, 1].
        transform: The affine stage's result (fixed RAS -> moving RAS, mm).
        moving_seg: Optional moving label map (int32), on any grid in the moving world space.
        fixed_seg: Optional fixed label map (moved onto the fixed grid if needed).
        normalization: Intensity normalisation of the model inputs.

    Returns:
        A :class:`RegistrationResult` whose ``disp`` is the **deformable** field alone (on the
        fixed grid, relative to the aligned image; :func:`composed_displacement` of it and
        ``transform`` is the whole chain); ``extra`` holds ``"dice_before"`` (no registration)
        and ``"dice_affine"`` (the affine alone) when both label maps are given.

    Raises:
        ValueError: As :func:`~hyperreg.registration.pairs.register_pair`.
    """
    aligned = align(moving, fixed, transform)
    result = register_pair(model, aligned, fixed, lam, normalization=normalization)
    return finish_chain(
        result, moving, fixed, transform, moving_seg=moving_seg, fixed_seg=fixed_seg
    )
