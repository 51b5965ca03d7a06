"""Where the anatomy lies in a scan: the slices with brain in them and the foreground centre.

Used to choose the 2D training and validation slices cut from 3D volumes and to place each
person in the training grid (:class:`~hyperreg.training.data.PairSampler`,
:func:`~hyperreg.training.holdout.validation_pairs`, :mod:`hyperreg.training.synth`). NumPy
only; must not import any other training module.
"""

from __future__ import annotations

import numpy as np

__all__ = ["brain_slices", "foreground_centre"]


def brain_slices(volumes: list[np.ndarray], axis: int, min_fraction: float = 0.3) -> np.ndarray:
    """Slice indices along ``axis`` where every volume has ≥ min_fraction of its largest area."""
    keep = None
    for data in volumes:
        other = tuple(a for a in range(data.ndim) if a != axis)
        area = (data > 0.05 * data.max()).sum(axis=other)
        ok = area >= min_fraction * area.max()
        keep = ok if keep is None else keep & ok
    indices = np.flatnonzero(keep)
    if indices.size == 0:
        raise ValueError("PairSampler(): the scans share no slice with brain in it")
    return indices


def foreground_centre(
    image: np.ndarray,
    seg: np.ndarray | None,
    first_axis: int = 0,
    shape: tuple[int, ...] | None = None,
    margin: int = 8,
) -> tuple[float, ...]:
    """Where to centre a scan in the training grid (voxel coordinates, axes ``first_axis`` on).

    The centre of mass of the foreground: the label map's non-zero voxels when there is one,
    else the image above 10 % of its maximum (a crude affine start; ANTs starts from the centres
    of mass too), used to put each person, scanned in their own position, in the middle of the
    training grid. With ``shape`` (a 3D grid in RAS order, so the last axis is superior), the
    last axis is instead placed so the top of the foreground lies ``margin`` voxels below the
    top of the grid: heads with and without a neck, brains and label maps of the whole head
    then all keep the top of the brain and lose the neck, not the vertex.
    """
    mask = seg > 0 if seg is not None else image > 0.1 * float(image.max())
    if first_axis:
        mask = mask.any(axis=tuple(range(first_axis)))
    if not mask.any():
        return tuple((n - 1) / 2 for n in mask.shape)
    centre = [float(np.mean(axis)) for axis in np.nonzero(mask)]
    if shape is not None:
        top = int(np.flatnonzero(mask.any(axis=tuple(range(mask.ndim - 1))))[-1])
        centre[-1] = top + margin - (shape[-1] - 1) / 2
    return tuple(centre)
