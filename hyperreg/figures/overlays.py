"""Overlays for the alignment check: the strongest edges of an image and label boundaries.

:func:`edge_mask` finds an image's strongest edges, :func:`label_boundaries` the borders of a
label map's structures, and :func:`overlay_edges` paints such a mask over a drawn slice. Numpy
(and matplotlib's colours, lazily) only; never torch or model code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["edge_mask", "label_boundaries", "overlay_edges"]


def edge_mask(image: np.ndarray, fraction: float = 0.1) -> np.ndarray:
    """Boolean map of the strongest edges of a 2D image: the ``fraction`` of pixels with the
    largest gradient magnitude (central differences, ``np.gradient``), among those with a
    non-zero gradient.

    Args:
        image: Array of shape ``(H, W)``.
        fraction: Share of the non-flat pixels to keep, in (0, 1].

    Returns:
        Boolean array of shape ``(H, W)``; all False for a constant image.

    Raises:
        ValueError: If ``image`` is not 2D or ``fraction`` is outside (0, 1].
    """
    fn = "edge_mask"
    image = np.asarray(image, dtype=np.float64)
    if image.ndim != 2:
        raise ValueError(f"{fn}(): 'image' must be 2D (H, W), got {tuple(image.shape)}")
    if not 0 < fraction <= 1:
        raise ValueError(f"{fn}(): 'fraction' must lie in (0, 1], got {fraction}")
    rows, cols = np.gradient(image)
    magnitude = np.hypot(rows, cols)
    moving = magnitude[magnitude > 0]
    if moving.size == 0:
        return np.zeros(image.shape, dtype=bool)
    return magnitude >= np.quantile(moving, 1 - fraction)


def overlay_edges(ax: Any, mask: np.ndarray, color: str = "red") -> Any:
    """Paint the True pixels of a 2D ``mask`` (e.g. :func:`edge_mask` of the fixed image's
    oriented view) opaquely in ``color`` over what ``ax`` shows; other pixels stay transparent.
    Returns the ``AxesImage``."""
    from matplotlib.colors import to_rgba

    rgba = np.zeros((*np.shape(mask), 4))
    rgba[np.asarray(mask, dtype=bool)] = to_rgba(color)
    return ax.imshow(rgba, interpolation="nearest")


def label_boundaries(labels: np.ndarray) -> np.ndarray:
    """Boolean map of label boundaries of a 2D label map: pixels whose label differs from that
    of a face neighbour (right or below, or left or above), background (0) included, so every
    structure is outlined on both sides of its border.

    Args:
        labels: Integer-valued array of shape ``(H, W)``.

    Returns:
        Boolean array of shape ``(H, W)``.

    Raises:
        ValueError: If ``labels`` is not 2D.

    Example:
        >>> label_boundaries(np.array([[0, 0, 2], [0, 0, 2]])).astype(int)
        array([[0, 1, 1],
               [0, 1, 1]])
    """
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(
            f"label_boundaries(): 'labels' must be 2D (H, W), got {tuple(labels.shape)}"
        )
    edges = np.zeros(labels.shape, dtype=bool)
    for axis in (0, 1):
        step = np.diff(labels, axis=axis) != 0
        lead = [slice(None), slice(None)]
        trail = [slice(None), slice(None)]
        lead[axis], trail[axis] = slice(None, -1), slice(1, None)
        edges[tuple(lead)] |= step
        edges[tuple(trail)] |= step
    return edges
