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
is ``q - A_f x`` in LPS mm. :mod:`hyperreg.registration.pipeline` runs the model on the aligned
pair and samples its outputs through the chain. Must not import training, apps or cli.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import affine_3d
from hyperreg.method.spatial import sample_at

__all__ = ["composed_displacement", "sample_volume"]

logger = logging.getLogger(__name__)

_SLAB_VOXELS = 524_288  # fixed voxels per slab when sampling (bounds the float64 temporaries)


def _slabs(shape: tuple[int, ...]) -> list[slice]:
    """Slices along axis 0 that each hold at most about ``_SLAB_VOXELS`` voxels."""
    per_row = int(np.prod(shape[1:]))
    rows = max(1, _SLAB_VOXELS // max(per_row, 1))
    return [slice(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)]


def _slab_points(
    linear: np.ndarray,
    offset: np.ndarray,
    disp: np.ndarray | None,
    shape: tuple[int, ...],
    rows: slice,
) -> np.ndarray:
    """``linear @ (x + u(x)) + offset`` for the fixed voxels ``x`` of one slab, ``(R, *S')``
    float64 (``R = len(linear)``).

    The grid part ``linear @ x`` is a sum of one broadcast axis per column, so no grid of
    voxel coordinates is built: one float64 array per output row and a float64 temporary of
    one slab axis of ``u``."""
    axes = [np.arange(shape[0], dtype=np.float64)[rows]]
    axes += [np.arange(n, dtype=np.float64) for n in shape[1:]]
    slab = tuple(len(a) for a in axes)
    out = np.empty((linear.shape[0], *slab), np.float64)
    part = np.empty(slab, np.float64) if disp is not None else None
    for r in range(linear.shape[0]):
        row = out[r]
        row.fill(offset[r])
        for n, axis in enumerate(axes):
            row += linear[r, n] * axis.reshape((-1,) + (1,) * (len(axes) - 1 - n))
        if disp is None or part is None:
            continue
        for n in range(len(axes)):
            np.multiply(disp[n, rows], linear[r, n], out=part, dtype=np.float64)
            row += part
    return out


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
    ndim = fixed.ndim
    affine = affine_3d(fixed)
    matrix = transform.matrix @ affine
    inverse = np.linalg.pinv(affine[:3, :ndim])
    # w(x) = P (M A_f (x + u) - t_f) - x, folded into one map of x + u (float64, per slab)
    linear = inverse @ matrix[:3, :ndim]
    offset = inverse @ (matrix[:3, 3] - affine[:3, 3])
    shape = fixed.spatial_shape
    out = np.empty((ndim, *shape), np.float32)
    for rows in _slabs(shape):
        moved = _slab_points(linear, offset, disp, shape, rows)
        for n in range(ndim):  # minus x, one broadcast axis at a time
            axis = np.arange(shape[n], dtype=np.float64)[rows if n == 0 else slice(None)]
            moved[n] -= axis.reshape((-1,) + (1,) * (ndim - 1 - n))
        out[:, rows] = moved
    return out


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

    One interpolation: linear for images, nearest neighbour for label maps. Outside ``volume``
    the rule is ITK's (and so ANTs'): a point up to half a voxel beyond the edge takes the edge
    value, one further out takes 0 (``padding="border"``: the edge value everywhere). Works in
    slabs of the fixed grid so that a 256³ volume needs well under 1 GB. Positions are computed
    in float64 (one matrix from fixed voxels to ``volume``'s voxels); an image is then sampled
    in float32 (``sample_at(..., exact=False)``: values within float rounding of float64
    sampling), a label map is picked from its integer ids with the float64 nearest-voxel rule
    of ``sample_at(..., "nearest")`` (the same ids).

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
    to_voxel = np.linalg.inv(affine_3d(volume)) @ transform.matrix @ affine_3d(fixed)
    linear, offset = to_voxel[: volume.ndim, : fixed.ndim], to_voxel[: volume.ndim, 3]
    shape = fixed.spatial_shape
    if label:
        # nearest neighbour as an exact gather of the integer ids (no float round trip)
        data = np.asarray(volume.data)  # any memory order: no copy
        out = np.zeros(shape, np.int32)
        for rows in _slabs(shape):
            points = _slab_points(linear, offset, disp, shape, rows)
            out[rows] = _nearest(data, points, padding)
    else:
        image = torch.from_numpy(np.asarray(volume.data, dtype=np.float32))[None, None]
        out = np.empty(shape, np.float32)
        for rows in _slabs(shape):
            points = torch.from_numpy(_slab_points(linear, offset, disp, shape, rows))
            rule = "itk" if padding == "zeros" else padding  # ITK's rule outside the image
            sampled = sample_at(image, points[None], "bilinear", rule, exact=False)
            out[rows] = sampled[0, 0].numpy()
    return Volume(
        data=out,
        affine=fixed.affine,
        disk_shape=fixed.disk_shape,
        path=volume.path,
        codes=fixed.codes,
    )


def _nearest(data: np.ndarray, points: np.ndarray, padding: str) -> np.ndarray:
    """``data`` at the voxel nearest each point, int32; 0 outside with ``"zeros"``, the edge
    value with ``"border"``. ``points``: ``(N, *T)``.

    The same float64 arithmetic as ``sample_at(..., "nearest")`` before it (voxel -> [-1, 1]
    -> voxel as ``grid_sample`` with ``align_corners=True`` computes it, then round half to
    even), so a point half-way between two voxels picks the same one as that path did.
    """
    finite = np.isfinite(points).all(0)
    inside = finite.copy()
    index = np.empty_like(points)
    for axis, size in enumerate(data.shape):
        normalised = points[axis] * (2.0 / max(size - 1, 1)) - 1.0
        index[axis] = np.rint((normalised + 1.0) / 2.0 * (size - 1))
    index[:, ~finite] = 0.0
    picks = []
    for axis, size in enumerate(data.shape):
        if padding == "border":
            picks.append(np.clip(index[axis], 0, size - 1).astype(np.intp))
        else:
            inside &= (index[axis] >= 0) & (index[axis] <= size - 1)
            picks.append(np.clip(index[axis], 0, size - 1).astype(np.intp))
    values = data[tuple(picks)]
    out = (np.rint(values) if values.dtype.kind == "f" else values).astype(np.int32)
    if padding != "border":
        out[~inside] = 0
    return out
