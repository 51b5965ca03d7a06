"""Intensity helpers: the background value outside a warped image (hyperreg.geometry.intensity)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hyperreg.geometry.intensity import outside_fill
from hyperreg.method.spatial import warp


def _ct_like() -> np.ndarray:
    image = np.full((12, 10), -1024.0)
    image[3:9, 2:8] = np.linspace(0, 400, 36).reshape(6, 6)
    return image


@pytest.mark.parametrize(("fill", "outside"), [("zero", 0.0), ("min", -1024.0), (-1000.0, -1000.0)])
def test_fill_recipe_gives_the_value_outside_and_the_same_interpolation_inside(
    fill: str | float, outside: float
) -> None:
    image = _ct_like()
    padding, offset = outside_fill(image, fill)
    disp = torch.zeros(1, 2, 12, 10, dtype=torch.float64)
    disp[:, 0] = 3.5  # sample 3.5 rows further: the last 3-4 rows fall outside the image
    moving = torch.from_numpy(image)[None, None]
    moved = warp(moving - offset, disp, padding=padding) + offset
    plain = warp(moving, disp, padding="zeros")
    torch.testing.assert_close(moved[..., -3:, :], torch.full_like(moved[..., -3:, :], outside))
    torch.testing.assert_close(moved[..., :8, :], plain[..., :8, :], rtol=0, atol=1e-9)


def test_edge_fill_and_bad_options() -> None:
    assert outside_fill(_ct_like(), "edge") == ("border", 0.0)
    with pytest.raises(ValueError, match=r"'fill' must be one of \('zero', 'edge', 'min'\)"):
        outside_fill(_ct_like(), "mean")
    with pytest.raises(ValueError, match="finite number"):
        outside_fill(_ct_like(), float("nan"))
    with pytest.raises(ValueError, match="'min' needs a non-empty, finite image"):
        outside_fill(np.array([]), "min")
