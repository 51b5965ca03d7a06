"""An image of one contrast drawn in another's intensities: :func:`intensity_map`.

The bundled networks were trained on T1-weighted images; a T2 or FLAIR moving image, where CSF
is bright and grey matter brighter than white matter, is far from anything they saw. Over two
images on one grid (the moving image after the affine stage, the fixed image),
:func:`intensity_map` finds for each intensity of the moving image the fixed image's mean
intensity where the moving image has it (the regression of the fixed intensity on the moving
one, in quantile bins), and :meth:`IntensityMap.apply` draws any moving image with those
values: a T2 becomes a T1-like image with the moving image's anatomy. Used only to give the
network a moving image in the contrast it knows; outputs are still sampled from the moving
file. Numpy only; must not import torch or other hyperreg modules (but ``_errors``).

References:
    Roche, Malandain, Pennec, Ayache. The correlation ratio as a new similarity measure for
    multimodal image registration. MICCAI 1998 (the fixed intensity's conditional mean given
    the moving one, the best function of one image predicting the other).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hyperreg._errors import InputError

__all__ = ["MAP_BINS", "IntensityMap", "intensity_map"]

MAP_BINS = 64
"""Quantile bins of the moving intensities: one mean fixed intensity each."""


@dataclass(frozen=True)
class IntensityMap:
    """A piecewise-linear map of moving intensities onto fixed ones.

    Attributes:
        moving: ``(K,)`` increasing moving intensities (each bin's median), moving units.
        fixed: ``(K,)`` the fixed image's mean intensity in each bin, fixed units.
    """

    moving: np.ndarray
    fixed: np.ndarray

    def apply(self, data: np.ndarray) -> np.ndarray:
        """``data`` (moving units, any shape) in fixed units, float32: linear between the
        bins, constant beyond the first and last (so outlying voxels stay in range);
        non-finite voxels stay non-finite."""
        data = np.asarray(data)
        out = np.interp(np.nan_to_num(data, nan=0.0), self.moving, self.fixed)
        return np.where(np.isfinite(data), out, data).astype(np.float32)


def intensity_map(moving: np.ndarray, fixed: np.ndarray, bins: int = MAP_BINS) -> IntensityMap:
    """The map drawing ``moving`` in ``fixed``'s intensities (both on one grid).

    Over every voxel finite in both (the background counts: it keeps the map's dark end where
    both images are dark), the moving intensities are cut into ``bins`` quantile bins (fewer
    where quantiles tie, e.g. a large background of one value) and each bin takes the fixed
    image's mean over its voxels, at the bin's median moving intensity. The map need not be
    monotone: a T2's bright CSF maps to a T1's dark CSF.

    Args:
        moving: The moving image on the fixed grid, shape ``S``, any units.
        fixed: The fixed image, shape ``S``.
        bins: Quantile bins, ``>= 2`` (default :data:`MAP_BINS`).

    Returns:
        An :class:`IntensityMap`.

    Raises:
        InputError: If the shapes differ, ``bins < 2``, or fewer than two distinct moving
            intensities are finite where the fixed image is.
    """
    fn = "intensity_map"
    moving, fixed = np.asarray(moving), np.asarray(fixed)
    if moving.shape != fixed.shape:
        message = "{0} has shape {a} but {1} has shape {b}; give both on one grid"
        raise InputError(fn, message, "moving", "fixed", a=moving.shape, b=fixed.shape)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise InputError(fn, "{0} must be an integer >= 2, got {bins!r}", "bins", bins=bins)
    both = np.isfinite(moving) & np.isfinite(fixed)
    m = moving[both].astype(np.float64)
    f = fixed[both].astype(np.float64)
    edges = np.unique(np.quantile(m, np.linspace(0.0, 1.0, bins + 1))) if m.size else m
    if edges.size < 2:
        raise InputError(fn, "{0} has fewer than two intensity levels to map", "moving")
    index = np.clip(np.searchsorted(edges, m, side="right") - 1, 0, edges.size - 2)
    counts = np.bincount(index, minlength=edges.size - 1)
    means = np.bincount(index, weights=f, minlength=edges.size - 1)
    used = np.flatnonzero(counts)
    order = np.argsort(index, kind="stable")
    groups = np.split(m[order], np.cumsum(counts)[:-1])
    centres = np.array([np.median(groups[b]) for b in used])
    return IntensityMap(moving=centres, fixed=means[used] / counts[used])
