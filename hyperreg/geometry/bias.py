"""Bias-field correction (N4, SimpleITK): the optional ``--bias-correct`` of every registration
command.

:func:`correct_bias` returns a copy of a volume divided by the smooth multiplicative field that
N4 (Tustison et al. 2010, as ANTs' ``N4BiasFieldCorrection``) estimates on a shrunk copy inside a
head mask. The registration pipeline hands the corrected copies to the affine stage and the
network and still samples its outputs from the files as read. numpy and SimpleITK; must not
import torch or model code.

References:
    N. J. Tustison et al., "N4ITK: Improved N3 Bias Correction", IEEE TMI 29(6), 2010.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import SimpleITK as sitk

from hyperreg._errors import InputError
from hyperreg.geometry.io import Volume

__all__ = ["BIAS_ITERATIONS", "BIAS_SHRINK", "correct_bias"]

logger = logging.getLogger(__name__)

BIAS_SHRINK = 4
"""Shrink factor of the copy N4 fits on (per axis, at most the axis length over 8)."""
BIAS_ITERATIONS = (50, 50, 50, 50)
"""N4 iterations per fitting level (4 levels, each doubling the B-spline control points)."""


def correct_bias(volume: Volume, *, shrink: int = BIAS_SHRINK) -> Volume:
    """``volume`` with its smooth multiplicative bias field removed (N4), same grid.

    The field is fitted on a copy shrunk ``shrink`` times per axis, inside the foreground of an
    Otsu threshold (the head or brain; all voxels above the minimum when Otsu leaves nothing),
    and evaluated on the full grid: ``corrected = data / exp(log_field)``, which keeps the
    image's units on average over the mask. Works for 2D and 3D volumes.

    Args:
        volume: An image (not a label map), finite; intensities are shifted to be positive for
            the fit when they are not (N4 models a multiplicative field of positive values).
        shrink: Shrink factor (>= 1) of the fitting copy.

    Returns:
        A :class:`~hyperreg.geometry.io.Volume` with the same affine, path and codes and
        float32 data.

    Raises:
        InputError: If ``volume`` is constant or not finite (nothing to correct), or ``shrink``
            is below 1.
    """
    fn = "correct_bias"
    if isinstance(shrink, bool) or not isinstance(shrink, int) or shrink < 1:
        raise InputError(fn, "{0} must be an integer >= 1, got {shrink!r}", "shrink", shrink=shrink)
    data = np.asarray(volume.data, dtype=np.float32)
    if data.size == 0 or not np.all(np.isfinite(data)) or float(np.ptp(data)) == 0.0:
        raise InputError(
            fn,
            "'{path}' is constant or holds non-finite values: there is no bias field to estimate",
            "volume",
            path=volume.path,
        )
    offset = 0.0
    if float(data.min()) <= 0.0:  # N4 needs positive intensities: shift, fit, shift back
        offset = 1e-3 * float(np.ptp(data)) - float(data.min())
    image = sitk.GetImageFromArray(np.ascontiguousarray((data + offset).T))
    image.SetSpacing([float(s) for s in volume.spacing])
    mask = sitk.OtsuThreshold(image, 0, 1, 200)
    if not np.any(sitk.GetArrayViewFromImage(mask)):
        mask = sitk.Cast(image > float(data.min() + offset), sitk.sitkUInt8)
    factors = [max(1, min(shrink, size // 8)) for size in image.GetSize()]
    small = sitk.Shrink(image, factors)
    small_mask = sitk.Shrink(mask, factors)
    corrector = sitk.N4BiasFieldCorrectionImageFilter()
    corrector.SetMaximumNumberOfIterations(list(BIAS_ITERATIONS))
    corrector.Execute(small, small_mask)
    log_field = sitk.GetArrayFromImage(corrector.GetLogBiasFieldAsImage(image)).T
    inside = sitk.GetArrayViewFromImage(mask).T.astype(bool)
    # N4's field is defined up to a constant: centre its log on the mask so the corrected image
    # keeps the original's units on average there
    log_field = log_field - float(np.mean(log_field[inside]))
    corrected = (data + offset) / np.exp(log_field) - offset
    logger.debug(
        "%s(): '%s' field range %.3f-%.3f (shrink %s)",
        fn,
        volume.path,
        float(np.exp(log_field.min())),
        float(np.exp(log_field.max())),
        factors,
    )
    return dataclasses.replace(volume, data=corrected.astype(np.float32))
