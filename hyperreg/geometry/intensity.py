"""Intensity normalisation, the one rule every hyperreg entry point applies before a model.

Owns :data:`NORMALIZATIONS` and :func:`normalize_intensity`; numpy only, must not import torch
or other hyperreg modules.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NORMALIZATIONS", "normalize_intensity"]

NORMALIZATIONS = ("minmax", "none")


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
