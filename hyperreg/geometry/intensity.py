"""Intensity normalisation, the one rule every hyperreg entry point applies before a model.

Owns :data:`NORMALIZATIONS` and :func:`normalize_intensity`, and :func:`outside_fill`, the value
a warped image takes outside the moving image; numpy only, must not import torch or other
hyperreg modules.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from hyperreg._errors import InputError

__all__ = ["FILLS", "NORMALIZATIONS", "OutsideFill", "normalize_intensity", "outside_fill"]

NORMALIZATIONS = ("minmax", "none")
FILLS = ("zero", "edge", "min")


def normalize_intensity(data: np.ndarray, method: str = "minmax") -> np.ndarray:
    """Scale intensities to [0, 1] (the documented default of every hyperreg entry point).

    ``"minmax"`` maps the image minimum to 0 and its maximum to 1 (a constant image becomes all
    zeros); ``"none"`` returns the data unchanged as float32. uint8/int16 inputs therefore give
    the same result as their float originals, up to quantisation.

    Args:
        data: Image array of any shape.
        method: One of ``NORMALIZATIONS``.

    Returns:
        float32 array of the same shape.

    Raises:
        ValueError: On an unknown ``method``.
    """
    if method not in NORMALIZATIONS:
        raise ValueError(
            f"normalize_intensity(): 'method' must be one of {NORMALIZATIONS}, got {method!r}"
        )
    data = np.asarray(data, dtype=np.float32)
    if method == "none":
        return data
    low, high = float(data.min()), float(data.max())
    if high <= low:
        return np.zeros_like(data)
    return (data - low) / (high - low)


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
