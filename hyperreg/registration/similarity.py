"""The model's own image similarity of images on the fixed grid, scored on the network grid.

:func:`network_similarities` is what the verdict (:mod:`hyperreg.registration.verdict`)
compares: the pair as it came, after the affine stage and registered, each scored against the
fixed image exactly as the model sees a pair (resampled to the network grid,
:func:`~hyperreg.registration.pairs.network_grid`, then normalised,
:func:`~hyperreg.registration.pairs.model_input`) with the image term of the objective the
model was trained (or is refined) on. Must not import training, apps or cli.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import resample_to
from hyperreg.method.model import HyperMorph
from hyperreg.method.objective import Objective
from hyperreg.registration.pairs import model_input, network_grid

__all__ = ["network_similarities", "on_fixed_grid"]


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
def network_similarities(
    model: HyperMorph,
    images: Sequence[Volume],
    fixed: Volume,
    normalization: str,
    objective: Objective,
) -> list[float]:
    """The similarity of each of ``images`` to ``fixed``, as the model scores a pair.

    Each image (on the fixed grid) and the fixed image are resampled (linear) to the network
    grid when the model has one, normalised (``normalization``) and compared with
    ``objective.image_term``; the result is its negative, so higher is better (local NCC in
    [0, 1]; ``-MSE/σ²``; MI in nats).

    Args:
        model: The model that registers the pair (its grid and device are used).
        images: Volumes on ``fixed``'s grid (e.g. :func:`on_fixed_grid`).
        fixed: The fixed image.
        normalization: As the pair's model inputs (``"minmax"`` or ``"none"``).
        objective: The objective whose image term scores (the model's, or a refinement's).

    Returns:
        One float per image, in order.

    Raises:
        InputError: With ``normalization="none"`` and intensities outside [0, 1].
    """
    device = next(model.parameters()).device
    grid = network_grid(model, fixed)
    target = fixed if grid is None else resample_to(fixed, grid.grid)
    fixed_t = model_input(target, normalization, device)
    scores = []
    for image in images:
        sampled = image if grid is None else resample_to(image, grid.grid)
        moving_t = model_input(sampled, normalization, device)
        scores.append(-float(objective.image_term(moving_t, fixed_t)[0]))
    return scores
