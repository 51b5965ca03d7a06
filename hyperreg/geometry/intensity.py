"""Intensity normalisation, the one rule every hyperreg entry point applies before a model.

Owns :data:`NORMALIZATIONS`, :data:`DEFAULT_NORMALIZATION`, :func:`intensity_window` (the two
values a rule maps to 0 and 1), :func:`normalize_intensity` (the network's and refinement's
inputs), :func:`winsorize` (the same window in the image's own units, for the affine stage),
and :func:`outside_fill`, the value a warped image takes outside the moving image; numpy only,
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
"""Percentiles (in %) that anchor the ``"robust"`` window: a few hundred or thousand voxels
(0.1 % of the image) cannot move them."""
ROBUST_FACTOR = 2.5
"""How far beyond the anchors' spread the ``"robust"`` window reaches. Every clean T1 head and
brain of the project's shared data has its maximum within 2.4 spreads of the 0.1st percentile
(benchmarks/RESULTS_clinical.md), so the rule leaves such images exactly as min-max does."""


def intensity_window(data: np.ndarray, method: str = DEFAULT_NORMALIZATION) -> tuple[float, float]:
    """The intensities ``(low, high)`` that ``method`` maps to 0 and 1, in the image's own units.

    ``"minmax"``: the image minimum and maximum. ``"robust"``: the minimum and maximum of the
    voxels within reach of the bulk of the image: with ``p_lo, p_hi`` the
    :data:`ROBUST_PERCENTILES` and ``s = p_hi - p_lo``, ``high`` is the largest value at most
    ``p_lo + ROBUST_FACTOR * s`` and ``low`` the smallest at least ``p_hi - ROBUST_FACTOR * s``.
    A handful of voxels far outside the image's range (metal, electrodes, a bad
    reconstruction: fewer than 0.1 % of the voxels) then cannot squeeze the rest of the image
    into a sliver of [0, 1]: the rest keeps the range it has without them. An image without
    such voxels keeps its minimum and maximum (ANTs winsorises at fixed percentiles instead,
    ``--winsorize-image-intensities``, which changes every image). ``"none"``: ``(0, 1)``.

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
    values = np.asarray(data)
    if values.size == 0:
        return 0.0, 0.0
    low, high = float(values.min()), float(values.max())
    if method == "robust" and high > low:
        p_lo, p_hi = (float(v) for v in np.percentile(values, ROBUST_PERCENTILES))
        reach = ROBUST_FACTOR * (p_hi - p_lo)
        if p_hi > p_lo and high > p_lo + reach:  # the largest value within reach
            high = float(np.max(values, where=values <= p_lo + reach, initial=p_hi))
        if p_hi > p_lo and low < p_hi - reach:
            low = float(np.min(values, where=values >= p_hi - reach, initial=p_lo))
    return low, high


def winsorize(data: np.ndarray, method: str = DEFAULT_NORMALIZATION) -> np.ndarray:
    """``data`` clipped to :func:`intensity_window`, still in the image's own units.

    What the affine stage registers (its histogram bins span the image's range, as the
    network's inputs do), so that it sees the same intensities as the network up to a linear
    map. ``"minmax"`` and ``"none"`` return the data unchanged.

    Args:
        data: Image array of any shape.
        method: One of :data:`NORMALIZATIONS`.

    Returns:
        float32 array of the same shape (``data`` itself when nothing is clipped and it is
        already float32).

    Raises:
        InputError: On an unknown ``method``.
    """
    values = np.asarray(data, dtype=np.float32)
    _check_method("winsorize", method)
    if method != "robust":
        return values
    low, high = intensity_window(values, method)
    if values.size == 0 or (float(values.min()) >= low and float(values.max()) <= high):
        return values
    return np.clip(values, np.float32(low), np.float32(high))


def normalize_intensity(data: np.ndarray, method: str = DEFAULT_NORMALIZATION) -> np.ndarray:
    """Scale intensities to [0, 1] (the documented default of every hyperreg entry point).

    ``"robust"`` (default) maps the window of :func:`intensity_window` to [0, 1] and clips what
    lies outside it: on an image without outlying voxels this is exactly ``"minmax"``, which
    maps the image minimum to 0 and its maximum to 1; ``"none"`` returns the data unchanged
    as float32. A constant image becomes all zeros. uint8/int16 inputs give the same result as
    their float originals, up to quantisation.

    Args:
        data: Image array of any shape.
        method: One of ``NORMALIZATIONS``.

    Returns:
        float32 array of the same shape.

    Raises:
        InputError: On an unknown ``method`` (a ValueError).
    """
    _check_method("normalize_intensity", method)
    data = np.asarray(data, dtype=np.float32)
    if method == "none":
        return data
    low, high = intensity_window(data, method)
    if high <= low:
        return np.zeros_like(data)
    scaled = (data - np.float32(low)) / np.float32(high - low)
    if method == "robust":
        np.clip(scaled, 0.0, 1.0, out=scaled)
    return scaled


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
