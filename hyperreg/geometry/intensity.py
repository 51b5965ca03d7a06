"""Intensity normalisation, the one rule every hyperreg entry point applies before a model.

Owns :data:`NORMALIZATIONS`, :data:`DEFAULT_NORMALIZATION`, :func:`winsorize` (an image
without its outlying voxels, in its own units: what the affine stage registers),
:func:`normalize_intensity` (that image scaled to [0, 1]: the network's and refinement's
inputs), :func:`intensity_window` (the two values a rule maps to 0 and 1) and
:func:`outside_fill`, the value a warped image takes outside the moving image; numpy only,
must not import torch or other hyperreg modules.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from hyperreg._errors import InputError

__all__ = [
    "DEFAULT_NORMALIZATION",
    "FILLS",
    "NORMALIZATIONS",
    "ROBUST_FACTOR",
    "ROBUST_PERCENTILES",
    "OutsideFill",
    "intensity_window",
    "normalize_intensity",
    "outside_fill",
    "winsorize",
]

NORMALIZATIONS = ("robust", "minmax", "none")
DEFAULT_NORMALIZATION = "robust"
"""The rule of every entry point (the affine stage, the network, refinement and training)."""
FILLS = ("zero", "edge", "min")

ROBUST_PERCENTILES = (0.1, 99.9)
"""Percentiles (in %) that anchor the ``"robust"`` rule: fewer than 0.1 % of the voxels cannot
move them."""
ROBUST_FACTOR = 2.5
"""How far the ``"robust"`` rule reaches beyond its anchors, in anchor spreads. Of the 70
intensity images of the project's shared data (2D and 3D, heads and brains, the bundled models'
training and held-out people among them) 69 keep every voxel, and the 0.7 mm studyforrest head
147 of its 40 million (maximum 278 -> 207); see benchmarks/RESULTS_clinical.md."""


def winsorize(data: np.ndarray, method: str = DEFAULT_NORMALIZATION) -> np.ndarray:
    """``data`` without its outlying voxels, in the image's own units: what ``method`` scales.

    ``"robust"``: with ``p_lo, p_hi`` the :data:`ROBUST_PERCENTILES` and ``s = p_hi - p_lo``,
    every voxel above ``p_lo + ROBUST_FACTOR * s`` takes the value ``p_hi`` and every voxel
    below ``p_hi - ROBUST_FACTOR * s`` the value ``p_lo`` (winsorised, but only beyond that
    reach). A handful of voxels far outside the image's range (metal, an electrode, a bad
    reconstruction: fewer than 0.1 % of the voxels) then become an ordinary bright voxel of
    the image and cannot squeeze the rest into a sliver of [0, 1], while an image without such
    voxels is returned unchanged. ANTs winsorises every image at fixed percentiles instead
    (``--winsorize-image-intensities``). An image whose anchors coincide (more than 99.8 % of
    one value) is returned unchanged: its few other voxels cannot be told from outliers.
    ``"minmax"`` and ``"none"`` return the data unchanged.

    The affine stage registers these intensities and the network and refinement see them
    scaled to [0, 1] (:func:`normalize_intensity`): one rule for every stage.

    Args:
        data: Image array of any shape, finite.
        method: One of :data:`NORMALIZATIONS`.

    Returns:
        float32 array of the same shape (``data`` itself when nothing changes and it is
        already float32).

    Raises:
        InputError: On an unknown ``method``.
    """
    _check_method("winsorize", method)
    values = np.asarray(data, dtype=np.float32)
    if method != "robust" or values.size == 0:
        return values
    p_lo, p_hi = (float(v) for v in np.percentile(values, ROBUST_PERCENTILES))
    if p_hi <= p_lo:
        return values
    reach = ROBUST_FACTOR * (p_hi - p_lo)
    above, below = values > p_lo + reach, values < p_hi - reach
    if not (above.any() or below.any()):
        return values
    out = values.copy()
    out[above], out[below] = p_hi, p_lo
    return out


def intensity_window(data: np.ndarray, method: str = DEFAULT_NORMALIZATION) -> tuple[float, float]:
    """The intensities ``(low, high)`` that ``method`` maps to 0 and 1, in the image's own units.

    ``"minmax"``: the image minimum and maximum; ``"robust"``: those of :func:`winsorize`
    (the image's own when it has no outlying voxels); ``"none"``: ``(0, 1)``.

    Args:
        data: Image array of any shape, finite.
        method: One of :data:`NORMALIZATIONS`.

    Returns:
        ``(low, high)`` as floats, ``low <= high`` (equal for a constant image).

    Raises:
        InputError: On an unknown ``method``.
    """
    _check_method("intensity_window", method)
    if method == "none":
        return 0.0, 1.0
    values = winsorize(data, method)
    if values.size == 0:
        return 0.0, 0.0
    return float(values.min()), float(values.max())


def normalize_intensity(data: np.ndarray, method: str = DEFAULT_NORMALIZATION) -> np.ndarray:
    """Scale intensities to [0, 1] (the documented default of every hyperreg entry point).

    ``"robust"`` (default) scales :func:`winsorize`'s image min-max: on an image without
    outlying voxels this is exactly ``"minmax"``, which maps the image minimum to 0 and its
    maximum to 1; ``"none"`` returns the data unchanged as float32. A constant image becomes
    all zeros. uint8/int16 inputs give the same result as their float originals, up to
    quantisation.

    Args:
        data: Image array of any shape.
        method: One of ``NORMALIZATIONS``.

    Returns:
        float32 array of the same shape.

    Raises:
        InputError: On an unknown ``method`` (a ValueError).
    """
    _check_method("normalize_intensity", method)
    data = winsorize(data, method)
    if method == "none":
        return data
    low, high = (float(data.min()), float(data.max())) if data.size else (0.0, 0.0)
    if high <= low:
        return np.zeros_like(data)
    return (data - np.float32(low)) / np.float32(high - low)


def _check_method(fn: str, method: str) -> None:
    if method not in NORMALIZATIONS:
        raise InputError(
            fn,
            "{0} must be one of {choices}, got {method!r}",
            "method",
            choices=NORMALIZATIONS,
            method=method,
        )


class OutsideFill(NamedTuple):
    """How to sample so that points outside the moving image take a chosen value.

    Attributes:
        padding: ``"zeros"`` or ``"border"``, the ``padding`` of
            :func:`hyperreg.method.spatial.warp` / ``sample_at``.
        offset: Subtract from the image before sampling and add back after. With zero padding
            the result is then ``offset`` outside the image and the ordinary (linear or nearest)
            interpolation inside, since interpolation weights sum to 1.
    """

    padding: str
    offset: float


def outside_fill(data: np.ndarray, fill: str | float = "zero") -> OutsideFill:
    """The sampling recipe for a background value outside the moving image.

    Warping samples the moving image at points that may fall outside it. By default they take 0
    (``"zero"``, as ITK and ANTs resample), which is wrong for images whose background is not 0
    (CT at −1024 HU, images with an offset). Recipe: ``warp(data - offset, disp,
    padding=padding) + offset``.

    Args:
        data: The moving image (any shape), used for ``"min"``.
        fill: ``"zero"`` (0 outside), ``"edge"`` (the nearest edge voxel's value, ``padding=
            "border"``), ``"min"`` (the image minimum, e.g. the −1024 background of a CT), or a
            finite number (that value, in the image's own units).

    Returns:
        An :class:`OutsideFill` ``(padding, offset)``.

    Raises:
        ValueError: If ``fill`` is neither one of :data:`FILLS` nor a finite number, or
            ``"min"`` is asked of an empty or non-finite image.

    Example:
        >>> outside_fill(np.array([-1024.0, 40.0]), "min")
        OutsideFill(padding='zeros', offset=-1024.0)
    """
    fn = "outside_fill"
    if isinstance(fill, str):
        if fill not in FILLS:
            raise InputError(
                fn,
                "{0} must be one of {fills} or a number, got {fill!r}",
                "fill",
                fills=FILLS,
                fill=fill,
            )
        if fill == "edge":
            return OutsideFill("border", 0.0)
        if fill == "zero":
            return OutsideFill("zeros", 0.0)
        values = np.asarray(data)
        if values.size == 0 or not np.all(np.isfinite(values)):
            raise ValueError(f"{fn}(): 'fill' 'min' needs a non-empty, finite image")
        return OutsideFill("zeros", float(values.min()))
    if isinstance(fill, bool) or not isinstance(fill, (int, float)) or not math.isfinite(fill):
        raise InputError(
            fn,
            "{0} must be one of {fills} or a finite number, got {fill!r}",
            "fill",
            fills=FILLS,
            fill=fill,
        )
    return OutsideFill("zeros", float(fill))
