"""Test-time refinement (instance optimisation) of one pair's field, and inverse transforms.

:func:`refine_flow` starts from the network's prediction for the pair and optimises the raw
flow itself (the half-resolution velocity of a diffeomorphic model, else the displacement) with
Adam for a given number of steps, on the model's own training loss at the same λ:
``(1 − λ)·similarity + λ·smoothness``. The field goes through exactly the model's integration,
resizing and cropping (:meth:`~hyperreg.method.model.HyperMorph.flow_to_output`), so a refined
velocity still integrates to a diffeomorphism. :func:`refine_pair` is the
:func:`~hyperreg.registration.pairs.register_pair` counterpart (volumes in,
:class:`~hyperreg.registration.pairs.RegistrationResult` out, timings and similarities before and
after in ``extra``). :func:`inverse_displacement` is the inverse field ``exp(−v)``. Must not
import training, apps or cli.

References:
    Tian et al., uniGradICON (MICCAI 2024): ``--io_iterations`` instance optimisation after the
    network's pass. Balakrishnan et al., VoxelMorph (IEEE TMI 2019) for the loss and its
    ``loss_mult=int_downsize``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from hyperreg._checks import as_lambda_tensor, check_option
from hyperreg.geometry.io import Volume
from hyperreg.method.losses import gradient_loss, mi_loss, ncc_loss
from hyperreg.method.metrics import mean_dice
from hyperreg.method.model import HyperMorph, RegistrationOutput
from hyperreg.registration.pairs import (
    RegistrationResult,
    network_inputs,
    prepare_pair,
    result_from_output,
)

__all__ = [
    "MAX_REFINE_STEPS",
    "REFINE_SIMILARITIES",
    "RefinedFlow",
    "Refinement",
    "check_refinement",
    "inverse_displacement",
    "refine_flow",
    "refine_pair",
]

logger = logging.getLogger(__name__)

REFINE_SIMILARITIES = ("ncc", "mi")
MAX_REFINE_STEPS = 10000  # more than this is a typo, not a plan (a 2D step takes ~20 ms)


@dataclass(frozen=True)
class Refinement:
    """How to refine: Adam ``steps`` on the flow at learning rate ``lr`` with ``sim``.

    Attributes:
        steps: Adam steps, 0 (no refinement) to :data:`MAX_REFINE_STEPS`.
        sim: ``"ncc"`` (local NCC, window 9, as the model was trained) or ``"mi"`` (global
            mutual information, :func:`~hyperreg.method.losses.mi_loss`, for pairs of
            different contrast).
        lr: Adam learning rate, in voxels of the flow's grid per step (default 0.05).
    """

    steps: int = 50
    sim: str = "ncc"
    lr: float = 0.05


def check_refinement(fn: str, refinement: Refinement) -> None:
    """Raise ValueError unless ``refinement`` has a valid step count, similarity and lr."""
    steps = refinement.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_REFINE_STEPS:
        raise ValueError(
            f"{fn}(): 'steps' must be an integer in [0, {MAX_REFINE_STEPS}], got {steps!r}"
        )
    check_option(fn, "sim", refinement.sim, REFINE_SIMILARITIES)
    if not (isinstance(refinement.lr, (int, float)) and 0 < refinement.lr < 100):
        raise ValueError(f"{fn}(): 'lr' must lie in (0, 100) voxels per step, got {refinement.lr}")


class RefinedFlow(NamedTuple):
    """Output of :func:`refine_flow`.

    Attributes:
        flow: The refined raw flow (as :meth:`HyperMorph.predict_flow` returns it), detached.
        output: ``model.flow_to_output(flow, moving)`` for the refined flow.
        loss_before: Objective of the network's prediction.
        loss_after: Objective after refinement.
        similarity_before: Similarity (NCC in [0, 1] or MI in nats; higher is better) before.
        similarity_after: The same after refinement.
        seconds: Wall time of the optimisation (CUDA synchronised).
    """

    flow: Tensor
    output: RegistrationOutput
    loss_before: float
    loss_after: float
    similarity_before: float
    similarity_after: float
    seconds: float


def _objective(
    model: HyperMorph, out: RegistrationOutput, fixed: Tensor, lam: float, sim: str
) -> tuple[Tensor, Tensor]:
    """``((1 − λ)·sim + λ·smooth, sim)``, with the training loss's regulariser scale."""
    if sim == "ncc":
        similarity = ncc_loss(out.moved, fixed, window=9)
    else:
        similarity = mi_loss(out.moved, fixed)
    field = out.velocity if out.velocity is not None else out.disp
    smooth = gradient_loss(field)
    if field.shape[2] < fixed.shape[2] and model.config.int_downsize > 1:
        smooth = smooth * model.config.int_downsize  # VoxelMorph's loss_mult, as in training
    return (1 - lam) * similarity + lam * smooth, similarity


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def refine_flow(
    model: HyperMorph,
    moving: Tensor,
    fixed: Tensor,
    lam: float,
    refinement: Refinement,
    flow: Tensor | None = None,
) -> RefinedFlow:
    """Optimise one pair's raw flow on the model's loss, starting from the network's prediction.

    The model's weights are not changed (nor do they receive gradients); only a copy of the
    flow is a leaf of the optimisation. Runs on the device of ``moving`` (the model's).

    Args:
        model: A :class:`~hyperreg.method.model.HyperMorph` on the device of the images.
        moving: Normalised moving image ``(1, C, *S)``, float, values in [0, 1].
        fixed: Normalised fixed image, same shape.
        lam: λ in [0, 1], the loss weight (and the network's conditioning).
        refinement: Steps, similarity and learning rate (:class:`Refinement`).
        flow: Starting flow; default ``model.predict_flow(moving, fixed, lam)``.

    Returns:
        A :class:`RefinedFlow`. With ``steps == 0`` the flow is the network's and the
        before/after values agree.

    Raises:
        ValueError: If the images hold non-finite values, the batch is not 1, ``lam`` is out
            of range or ``refinement`` is invalid (:func:`check_refinement`).
    """
    fn = "refine_flow"
    check_refinement(fn, refinement)
    if moving.shape[0] != 1:
        raise ValueError(
            f"{fn}(): 'moving' must hold one pair (batch 1), got {tuple(moving.shape)}"
        )
    for name, image in (("moving", moving), ("fixed", fixed)):
        bad = int((~torch.isfinite(image)).sum())
        if bad:
            raise ValueError(f"{fn}(): '{name}' has {bad} non-finite voxels (NaN or inf)")
    lam = float(as_lambda_tensor(fn, lam, 1, moving.device).item())
    with torch.no_grad():
        start = model.predict_flow(moving, fixed, lam) if flow is None else flow
    param = start.detach().float().clone().requires_grad_(True)
    optimiser = torch.optim.Adam([param], lr=refinement.lr)
    _sync(moving.device)
    tic = time.perf_counter()
    loss_before = similarity_before = float("nan")
    with torch.enable_grad():
        for step in range(refinement.steps):
            out = model.flow_to_output(param, moving)
            loss, similarity = _objective(model, out, fixed, lam, refinement.sim)
            if step == 0:
                loss_before = float(loss.detach())
                similarity_before = -float(similarity.detach())
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
    with torch.no_grad():
        out = model.flow_to_output(param.detach(), moving)
        loss, similarity = _objective(model, out, fixed, lam, refinement.sim)
    _sync(moving.device)
    seconds = time.perf_counter() - tic
    if refinement.steps == 0:
        loss_before, similarity_before = float(loss), -float(similarity)
    logger.debug(
        "%s(): %d steps in %.2f s, loss %.4f -> %.4f",
        fn,
        refinement.steps,
        seconds,
        loss_before,
        float(loss),
    )
    return RefinedFlow(
        flow=param.detach(),
        output=out,
        loss_before=loss_before,
        loss_after=float(loss),
        similarity_before=similarity_before,
        similarity_after=-float(similarity),
        seconds=seconds,
    )


def inverse_displacement(model: HyperMorph, flow: Tensor, moving: Tensor) -> Tensor:
    """Inverse of the transform a raw flow encodes: the displacement of ``exp(−v)``.

    For a stationary velocity ``v``, ``φ = exp(v)`` and ``φ⁻¹ = exp(−v)``; hyperreg integrates
    ``−v`` exactly as the forward field (same scaling and squaring, resizing and crop). The
    inverse field lives on the fixed grid too and maps the moving image's grid back: warping the
    moved image with it gives the moving image again (up to interpolation and the field's
    integration error), ``inverse(x) ≈ −forward(x + inverse(x))``.

    Args:
        model: A diffeomorphic :class:`~hyperreg.method.model.HyperMorph` (``int_steps > 0``).
        flow: Raw velocity ``(B, N, *P')`` (:meth:`HyperMorph.predict_flow`, or refined).
        moving: Any ``(B, C, *S)`` tensor on the image grid (sets the crop).

    Returns:
        ``(B, N, *S)`` inverse displacement in voxels, i/j/k order.

    Raises:
        ValueError: If the model has no velocity field (``int_steps == 0``: its displacement
            is not invertible by integration).
    """
    if model.config.int_steps == 0:
        raise ValueError(
            "inverse_displacement(): model without a velocity field (int_steps 0 predicts "
            "displacements directly), so it has no exact inverse; use a model trained with "
            "--int-steps > 0"
        )
    with torch.no_grad():
        return model.flow_to_output(-flow, moving).disp


def refine_pair(
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    lam: float,
    refinement: Refinement | None = None,
    *,
    moving_seg: Volume | None = None,
    fixed_seg: Volume | None = None,
    normalization: str = "minmax",
    resample: bool = False,
    inverse: bool = False,
    labels: Sequence[int] | None = None,
) -> RegistrationResult:
    """Register ``moving`` to ``fixed`` at λ, refining the network's field for this pair.

    As :func:`~hyperreg.registration.pairs.register_pair` (same preparation, same outputs on the
    fixed grid), with :func:`refine_flow` between the network and the result.
    ``refinement.steps == 0`` gives register_pair's result (the field the network predicts).

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving, fixed, lam, moving_seg, fixed_seg, normalization, resample: As
            :func:`~hyperreg.registration.pairs.register_pair`.
        refinement: Steps, similarity, learning rate; default :class:`Refinement` ().
        inverse: Also compute the inverse displacement (``result.inverse_disp``).
        labels: Label ids scored for Dice; default those in both the moved and fixed maps.

    Returns:
        A :class:`~hyperreg.registration.pairs.RegistrationResult` whose ``extra`` holds
        ``refine_steps``, ``refine_seconds`` (optimisation wall time), ``loss_before`` /
        ``loss_after`` (the objective), ``similarity_before`` / ``similarity_after`` (NCC or MI,
        higher is better; ``refine_sim`` 0 for NCC, 1 for MI), ``ncc`` (local NCC of the result),
        ``smoothness`` and, with label maps, ``dice_before`` (unregistered).

    Raises:
        ValueError: As :func:`~hyperreg.registration.pairs.register_pair` and
            :func:`refine_flow` (non-finite voxels, bad step count), and for ``inverse`` with a
            model without a velocity field.
    """
    fn = "refine_pair"
    refinement = refinement if refinement is not None else Refinement()
    check_refinement(fn, refinement)
    if inverse and model.config.int_steps == 0:
        inverse_displacement(model, torch.zeros(0), torch.zeros(0))  # raises the clear error
    moving, moving_seg, fixed_seg, notes = prepare_pair(
        fn, model, moving, fixed, moving_seg, fixed_seg, resample=resample
    )
    device = next(model.parameters()).device
    moving_t, fixed_t, grid = network_inputs(model, moving, fixed, normalization, device, notes)
    refined = refine_flow(model, moving_t, fixed_t, lam, refinement)
    out = refined.output
    result = result_from_output(
        out, 0, float(lam), moving_seg, fixed_seg, notes, labels, moving=moving, grid=grid
    )
    regularised = out.velocity if out.velocity is not None else out.disp
    result.extra.update(
        smoothness=float(gradient_loss(regularised.float())),
        ncc=-float(ncc_loss(out.moved.float(), fixed_t)),
        refine_steps=float(refinement.steps),
        refine_seconds=refined.seconds,
        refine_sim=float(REFINE_SIMILARITIES.index(refinement.sim)),
        loss_before=refined.loss_before,
        loss_after=refined.loss_after,
        similarity_before=refined.similarity_before,
        similarity_after=refined.similarity_after,
    )
    if result.dice is not None and moving_seg is not None and fixed_seg is not None:
        result.extra["dice_before"] = mean_dice(moving_seg.data, fixed_seg.data, list(result.dice))
    if inverse:
        inv = inverse_displacement(model, refined.flow, moving_t)
        inv = grid.to_fixed(inv) if grid is not None else inv
        result.inverse_disp = inv[0].float().cpu().numpy().astype(np.float32)
    return result
