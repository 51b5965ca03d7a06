"""The model's own image similarity of a pair, scored on the network grid.

What the verdict (:mod:`hyperreg.registration.verdict`) compares: the pair as it came, after
the affine stage and registered, each brought to the network grid as the model sees a pair
(:func:`network_input`) and scored against the fixed image with the image term of the objective
the model was trained (or is refined) on (:func:`network_similarity`). Must not import
training, apps or cli.
"""

from __future__ import annotations

import numpy as np
import torch

from hyperreg.geometry.io import Volume, same_grid
from hyperreg.method.model import HyperMorph
from hyperreg.method.objective import Objective
from hyperreg.registration.pairs import network_grid, network_tensor

__all__ = ["network_input", "network_similarity", "on_fixed_grid"]


def on_fixed_grid(data: np.ndarray, fixed: Volume, like: Volume) -> Volume:
    """``data`` (the fixed grid's shape) as a :class:`Volume` on ``fixed``'s grid, named after
    ``like`` (the moving image), so messages about it name the moving file."""
    return Volume(
        data=data,
        affine=fixed.affine,
        disk_shape=fixed.disk_shape,
        path=like.path,
        codes=fixed.codes,
    )


@torch.no_grad()
def network_input(
    model: HyperMorph, volume: Volume, fixed: Volume, normalization: str
) -> torch.Tensor:
    """``volume`` (any grid) as the model sees it for a pair on ``fixed``: resampled (linear,
    through the headers) to the network grid (:func:`~hyperreg.registration.pairs.
    network_grid`; the fixed grid for a model without one) unless already on it, then
    normalised (:func:`~hyperreg.registration.pairs.model_input`), ``(1, 1, *S)`` on the
    model's device; a tensor the registration already made of ``volume`` is reused
    (:func:`~hyperreg.registration.pairs.network_tensor`).

    Raises:
        InputError: With ``normalization="none"`` and intensities outside [0, 1].
    """
    device = next(model.parameters()).device
    grid = network_grid(model, fixed)
    target = fixed if grid is None else grid.grid
    grid_or_none = None if same_grid(volume, target) else target
    return network_tensor(volume, grid_or_none, normalization, device)


@torch.no_grad()
def network_similarity(
    objective: Objective,
    moving: torch.Tensor,
    fixed: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> float:
    """The similarity of two :func:`network_input` tensors: the negative of
    ``objective.image_term``, so higher is better (local NCC in [0, 1]; ``-MSE/σ²``; MI in
    nats); ``weight`` (``(1, 1, *S)``, cost masks on the network grid) weighs local NCC's
    voxels."""
    return -float(objective.image_term(moving, fixed, weight)[0])
