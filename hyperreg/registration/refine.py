"""Test-time refinement (instance optimisation) of one pair's field, and inverse transforms.

:func:`refine_flow` starts from the network's prediction for the pair and optimises the raw
flow itself (the half-resolution velocity of a diffeomorphic model, else the displacement) with
Adam on the model's own objective at the same λ (``model.objective``,
:class:`~hyperreg.method.objective.Objective`: ``(1 − λ)·similarity + λ·k·smoothness``) on the
network's grid, through exactly the model's integration, resizing and cropping
(:meth:`~hyperreg.method.model.HyperMorph.flow_to_output`), so a refined velocity still
integrates to a diffeomorphism. With ``Refinement(levels=2)`` it runs coarse to fine: first on
images average-pooled to the velocity's own grid (the 4 mm level for the bundled 3D model,
whose network works at 2 mm), where a step costs about 1/8 of a fine one. The loss is
evaluated on the box of both images' foreground (the flow outside it is left as predicted).
Each level stops early when its loss stops improving and keeps
its best flow; a loss that becomes NaN is an error (RuntimeError), never a silent fall-back.
:func:`refine_pair` is the :func:`~hyperreg.registration.lambdas.register_pair`
counterpart (volumes in, :class:`~hyperreg.registration.results.RegistrationResult` out, its
``refinement`` the :class:`~hyperreg.registration.results.RefineStats`: timings, similarities
and losses before and after). :func:`inverse_displacement` is the inverse field ``exp(−v)``.
One level's loss and Adam loop are :mod:`hyperreg.registration.refine_levels`'s. Must not
import training, apps or cli.

References:
    Tian et al., uniGradICON (MICCAI 2024): ``--io_iterations`` instance optimisation after the
    network's pass. Siebert, Hansen, Heinrich, ConvexAdam (MICCAI 2021; IEEE TMI 2024): Adam
    instance optimisation on a coarse (2 mm) grid after a first estimate. Balakrishnan et al.,
    VoxelMorph (IEEE TMI 2019) for the loss and its ``loss_mult=int_downsize``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from hyperreg._checks import as_lambda_tensor, check_option
from hyperreg._errors import InputError
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.geometry.io import Volume
from hyperreg.method.losses import ncc_loss
from hyperreg.method.metrics import mean_dice
from hyperreg.method.model import HyperMorph, RegistrationOutput
from hyperreg.method.objective import Objective
from hyperreg.method.similarities import REFINE_SIMILARITIES
from hyperreg.registration.pairs import (
    RegistrationResult,
    network_inputs,
    prepare_pair,
    result_from_output,
    smoothness_of,
)
from hyperreg.registration.masks import mask_tensors
from hyperreg.registration.refine_levels import (
    QuarterLevel,
    RefineLevel,
    foreground_box,
    level_steps,
    optimise_level,
)
from hyperreg.registration.results import RefineStats

__all__ = [
    "MAX_REFINE_STEPS",
    "REFINE_LEVELS",
    "REFINE_SIMILARITIES",
    "RefinedFlow",
    "Refinement",
    "check_refinement",
    "inverse_displacement",
    "refine_flow",
    "refine_objective",
    "refine_pair",
    "with_model_similarity",
]

logger = logging.getLogger(__name__)

MAX_REFINE_STEPS = 10000  # more than this is a typo, not a plan (a 2D step takes ~20 ms)


REFINE_LEVELS = (1, 2, 3)
_COARSE_LR = 2.0  # the coarse level's Adam rate, times ``lr``
_QUARTER_LR = 2.0  # the quarter level's Adam rate, times ``lr`` (voxels of its own grid)
_Scores = tuple[float, float]  # (loss, image dissimilarity) of one flow


@dataclass(frozen=True)
class Refinement:
    """How to refine: at most ``steps`` Adam steps per level on the flow, with ``sim``.

    The defaults (30 steps at lr 0.15, fine level) need no tuning: on the native OASIS pair
    with the bundled 3D model (λ 0.1) they reach the aseg Dice of 100 steps at lr 0.05 (0.646
    against 0.645, same affine) in 30 steps instead of 100 (22 s against 67 s at 1 thread), and
    on the 2D neurite-oasis slices 0.688 in 30 steps as in 100; no folding
    (``benchmarks/RESULTS_speed.md``, "Refinement schedules").

    Attributes:
        steps: Most Adam steps, 0 (no refinement) to :data:`MAX_REFINE_STEPS` (default 30):
            per level, except that with three levels the coarse and fine levels take half as
            many each (:func:`~hyperreg.registration.refine_levels.level_steps`). A level stops
            earlier when its loss has not improved by 0.02 % for 5 steps.
        sim: A name of :data:`~hyperreg.method.similarities.REFINE_SIMILARITIES`: ``"ncc"``
            (local NCC with the model's window), ``"mse"``, or ``"mi"`` (global mutual
            information, :func:`~hyperreg.method.losses.mi_loss`, for pairs of different
            contrast); None (default): the similarity the model was trained with
            (:func:`with_model_similarity`). Every other setting is the model's objective.
        lr: Adam learning rate at the fine level, in voxels of the flow's grid per step
            (default 0.15; it was 0.05 with 50-100 steps); the coarse and quarter levels use
            twice this (in voxels of their own grids).
        levels: ``1`` (default): the fine level only (the network's grid); ``2``: first a
            coarse level (images average-pooled to the velocity's grid, NCC window halved so
            it spans the same millimetres), then the fine level; ``3``: first a quarter level
            (:class:`~hyperreg.registration.refine_levels.QuarterLevel`, a correction on half
            the velocity's grid), then the coarse and the fine level. Models without a
            half-resolution velocity always refine at the fine level only. Measured on the
            native OASIS pair with the bundled 3D model (λ 0.1): the coarse level lowers
            the loss as much or more but gives Dice 0.639 against 0.644 for the fine level
            alone (40 steps, lr 0.1), 0.643 against 0.645 (100 steps, lr 0.05); on the 2D
            neurite-oasis slices with the bundled 2D model it reaches the Dice of 100 fine
            steps (0.688) in 20 + 20 steps, 3x faster (``benchmarks/RESULTS_speed.md``). With
            ``3`` (30 quarter, 15 coarse, 15 fine steps for 30) and the bundled 3D model's
            default ``register`` (1 thread, loaded machine): on the three held-out IXI pairs at
            2 mm mean DLMUSE Dice 0.6591 against 0.6583 with the refinement's CPU time about a
            fifth lower, but on the native OAS1_0002 -> OAS1_0001 pair aseg Dice 0.6227
            against 0.6279, so it is not the default.
    """

    steps: int = 30
    sim: str | None = None
    lr: float = 0.15
    levels: int = 1


def check_refinement(fn: str, refinement: Refinement) -> None:
    """Raise ValueError unless ``refinement`` has a valid step count, similarity, lr, levels."""
    steps = refinement.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_REFINE_STEPS:
        message = "{0} must be an integer in [0, {limit}], got {steps!r}"
        raise InputError(fn, message, "steps", limit=MAX_REFINE_STEPS, steps=steps)
    if refinement.sim is not None:
        check_option(fn, "sim", refinement.sim, REFINE_SIMILARITIES)
    if not (isinstance(refinement.lr, (int, float)) and 0 < refinement.lr < 100):
        message = "{0} must lie in (0, 100) voxels per step, got {lr}"
        raise InputError(fn, message, "lr", lr=refinement.lr)
    check_option(fn, "levels", refinement.levels, REFINE_LEVELS)


class RefinedFlow(NamedTuple):
    """Output of :func:`refine_flow`.

    Attributes:
        flow: The refined raw flow (as :meth:`HyperMorph.predict_flow` returns it), detached;
            the network's when the refinement fell back.
        output: ``model.flow_to_output(flow, moving)`` for the refined flow.
        loss_before: Objective of the network's prediction (fine level).
        loss_after: Objective after refinement (fine level).
        similarity_before: Similarity (NCC in [0, 1] or MI in nats; higher is better) before.
        similarity_after: The same after refinement.
        seconds: Wall time of the optimisation (CUDA synchronised).
        steps: Adam steps taken per level, coarse first (``(0, n)`` without a coarse level).
        quarter_steps: Adam steps taken at the quarter level (0 without it).
        fell_back: True when the loss did not fall below the network's and the network's
            field was returned.
    """

    flow: Tensor
    output: RegistrationOutput
    loss_before: float
    loss_after: float
    similarity_before: float
    similarity_after: float
    seconds: float
    steps: tuple[int, int] = (0, 0)
    fell_back: bool = False
    quarter_steps: int = 0

    def stats(self, refinement: Refinement) -> RefineStats:
        """The typed statistics of this refinement, run with ``refinement``."""
        return RefineStats(
            steps=refinement.steps,
            similarity=refinement.sim,
            seconds=self.seconds,
            similarity_before=self.similarity_before,
            similarity_after=self.similarity_after,
            loss_before=self.loss_before,
            loss_after=self.loss_after,
            steps_taken=self.steps,
            quarter_steps=self.quarter_steps,
            fell_back=self.fell_back,
        )


def with_model_similarity(model: HyperMorph, refinement: Refinement) -> Refinement:
    """``refinement`` with its similarity set: its own, else the one ``model`` was trained with
    (``model.objective.similarity``; an MSE-trained model is refined with MSE)."""
    if refinement.sim is not None:
        return refinement
    objective = getattr(model, "objective", None)
    sim = objective.similarity if objective is not None else "ncc"
    return dataclasses.replace(refinement, sim=sim)


def refine_objective(model: HyperMorph, refinement: Refinement) -> Objective:
    """The objective a refinement minimises: the model's (``model.objective``, as trained),
    with the image similarity of ``refinement.sim`` and no label term (test-time pairs are
    registered by intensity)."""
    objective: Objective = getattr(model, "objective", None) or Objective(
        int_downsize=model.config.int_downsize if model.config.int_steps > 0 else 1
    )
    sim = refinement.sim or objective.similarity  # None: the model's own
    return dataclasses.replace(objective, similarity=sim, label_loss="none")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _coarse_to_fine(
    model: HyperMorph, fine: RefineLevel, start: Tensor, refinement: Refinement
) -> tuple[Tensor, tuple[int, int, int], bool, _Scores | None, _Scores | None]:
    """The schedule of :func:`refine_flow` from ``start`` (the flow on ``fine``'s box), with the
    most steps of :func:`~hyperreg.registration.refine_levels.level_steps`: Adam on the quarter
    level at ``2 · lr``, on the coarse level at ``2 · lr``, then on ``fine`` at ``lr``; a level
    that diverged ends it. Returns ``(flow, steps taken per level (quarter, coarse, fine),
    diverged, (loss, image dissimilarity) of the flow on ``fine`` or None when the fine level
    did not run, the same of ``start`` when the fine level ran first and scored it, else
    None)``."""
    most = level_steps(model, refinement.steps, refinement.levels)
    current, steps, diverged, scores, start_scores = start, [0, 0, 0], False, None, None
    pooled = (model, fine.objective, fine.moving, fine.fixed, fine.lam, True, fine.masks)
    coarse = RefineLevel(*pooled) if most[0] or most[1] else None
    if most[0] and coarse is not None:
        quarter = QuarterLevel(coarse, current)
        found = optimise_level(quarter, quarter.zeros(), _QUARTER_LR * refinement.lr, most[0])
        current, steps[0], diverged = quarter.velocity(found.flow), found.taken, found.diverged
    if most[1] and coarse is not None and not diverged:
        found = optimise_level(coarse, current, _COARSE_LR * refinement.lr, most[1])
        current, steps[1], diverged = found.flow, found.taken, found.diverged
    if most[2] and not diverged:
        found = optimise_level(fine, current, refinement.lr, most[2])
        current, steps[2], diverged = found.flow, found.taken, found.diverged
        scores = (found.loss, found.image)
        start_scores = found.start if most[:2] == (0, 0) else None
    return current, (steps[0], steps[1], steps[2]), diverged, scores, start_scores


def refine_flow(
    model: HyperMorph,
    moving: Tensor,
    fixed: Tensor,
    lam: float,
    refinement: Refinement,
    flow: Tensor | None = None,
    masks: tuple[Tensor | None, Tensor | None] | None = None,
) -> RefinedFlow:
    """Optimise one pair's raw flow on the model's objective, coarse to fine, starting from the
    network's prediction.

    The levels (:func:`~hyperreg.registration.refine_levels.level_steps`; all but the fine one
    need a half-resolution velocity): quarter (``levels`` 3), a correction on
    half the velocity's grid with the images average-pooled by 4
    (:class:`~hyperreg.registration.refine_levels.QuarterLevel`), Adam at ``2 · lr``; coarse
    (``levels`` 2 or 3), the images average-pooled by 2 to the velocity's grid, the velocity
    integrated there (scaling and squaring, the model's step count) warping the pooled moving
    image, Adam at ``2 · lr``; fine, the network's grid through
    :meth:`~hyperreg.method.model.HyperMorph.flow_to_output`, Adam at ``lr``. All evaluate
    ``(1 − λ)·S + λ·k·R`` of :func:`refine_objective` with the same ``k`` (the regulariser of
    the same velocity); each runs at most its steps, stops early after 5 steps without a
    0.02 % gain and keeps its best flow. The result is the network's field when the refined
    loss is not below the network's; a loss that becomes NaN is an error.

    The model's weights are not changed (nor do they receive gradients); only a copy of the
    flow is a leaf of the optimisation. Runs on the device of ``moving`` (the model's).

    Args:
        model: A :class:`~hyperreg.method.model.HyperMorph` on the device of the images.
        moving: Normalised moving image ``(1, C, *S)``, float, values in [0, 1].
        fixed: Normalised fixed image, same shape.
        lam: λ in [0, 1], the loss weight (and the network's conditioning).
        refinement: Steps, similarity, learning rate, levels (:class:`Refinement`).
        flow: Starting flow; default ``model.predict_flow(moving, fixed, lam)``.
        masks: Cost masks ``(fixed, moving)`` like the images (``(1, 1, *S)``, 1 inside, 0
            outside; either None), or None: the similarity counts only voxels inside the fixed
            mask and the warped moving mask (:class:`~hyperreg.registration.refine_levels.
            RefineLevel`); the regulariser counts everywhere.

    Returns:
        A :class:`RefinedFlow`. With ``steps == 0`` the flow is the network's and the
        before/after values agree.

    Raises:
        TypeError: If ``moving`` or ``fixed`` is not a tensor.
        ValueError: If the images hold non-finite values, the batch is not 1, ``lam`` is out
            of range or ``refinement`` is invalid (:func:`check_refinement`).
        RuntimeError: If the objective becomes NaN or infinite (before or during the
            optimisation).

    References:
        ConvexAdam (Siebert et al., 2021): Adam instance optimisation on a coarse grid;
        VoxelMorph's scaling and squaring (Dalca et al., MICCAI 2018).
    """
    fn = "refine_flow"
    check_refinement(fn, refinement)
    for name, image in (("moving", moving), ("fixed", fixed)):
        if not isinstance(image, Tensor):
            raise TypeError(
                f"{fn}(): '{name}' must be a tensor (1, C, *S), got {type(image).__name__}"
            )
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
    start = start.detach().float()
    refinement = with_model_similarity(model, refinement)  # its statistics name the similarity
    objective = refine_objective(model, refinement)
    _sync(moving.device)
    tic = time.perf_counter()
    # the loss on the foreground's box: NCC of background windows is 0 and the flow outside
    # the box is not changed, so this is the whole objective up to a constant and a factor
    box = foreground_box(model, moving, fixed, objective.ncc_window)
    batch = (slice(None), slice(None))
    fine = RefineLevel(
        model, objective, box.crop(moving), box.crop(fixed), lam, False, box.crop_masks(masks)
    )
    current, steps, diverged, scores, start_scores = _coarse_to_fine(
        model, fine, start[batch + box.flow], refinement
    )
    if start_scores is None:  # the fine level did not score the start first
        with torch.no_grad():
            start_scores = tuple(float(v) for v in fine(start[batch + box.flow]))
    loss0, image0 = start_scores
    loss_before, similarity_before = loss0, -image0
    with torch.no_grad():
        loss, image = fine(current) if scores is None else scores  # scored by the fine level
        pasted = start.clone()
        pasted[batch + box.flow] = current
        current = pasted
    if diverged or not math.isfinite(float(loss)) or not math.isfinite(loss_before):
        raise RuntimeError(
            f"the refinement's loss became NaN or infinite (after {steps[0]} quarter, "
            f"{steps[1]} coarse and {steps[2]} fine steps, loss before {loss_before:.4g}); "
            "rerun without refinement (0 steps, --refine 0) or with a smaller learning rate "
            "(--refine-lr)"
        )
    fell_back = float(loss) > loss_before
    if fell_back:
        current, loss, image = start, loss0, image0
    with torch.no_grad():
        out = model.flow_to_output(current, moving)
    _sync(moving.device)
    seconds = time.perf_counter() - tic
    message = "%s(): %s steps (quarter, coarse, fine) in %.2f s, loss %.4f -> %.4f"
    logger.debug(message, fn, steps, seconds, loss_before, float(loss))
    return RefinedFlow(
        flow=current.detach(),
        output=out,
        loss_before=loss_before,
        loss_after=float(loss),
        similarity_before=similarity_before,
        similarity_after=-float(image),
        seconds=seconds,
        steps=(steps[1], steps[2]),
        fell_back=fell_back,
        quarter_steps=steps[0],
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
            "int_steps > 0"
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
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = False,
    inverse: bool = False,
    labels: Sequence[int] | None = None,
    images: bool = True,
    masks: tuple[Volume | None, Volume | None] | None = None,
) -> RegistrationResult:
    """Register ``moving`` to ``fixed`` at λ, refining the network's field for this pair.

    As :func:`~hyperreg.registration.lambdas.register_pair` (same preparation, same outputs on the
    fixed grid), with :func:`refine_flow` between the network and the result.
    ``refinement.steps == 0`` gives register_pair's result (the field the network predicts).

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving, fixed, lam, moving_seg, fixed_seg, normalization, resample: As
            :func:`~hyperreg.registration.lambdas.register_pair`.
        refinement: Steps, similarity, learning rate; default :class:`Refinement` ().
        inverse: Also compute the inverse displacement (``result.inverse_disp``).
        labels: Label ids scored for Dice; default those in both the moved and fixed maps.
        images: False returns the field and its statistics only (see
            :func:`~hyperreg.registration.pairs.result_from_output`).
        masks: Cost masks ``(fixed, moving)`` on the fixed grid (float in [0, 1], the moving
            one where ``moving`` is; :func:`~hyperreg.registration.masks.masks_on_fixed_grid`),
            or None: the similarity refined counts only voxels inside.

    Returns:
        A :class:`~hyperreg.registration.results.RegistrationResult` whose ``refinement`` holds
        the :class:`~hyperreg.registration.results.RefineStats` (step budget and steps taken,
        wall time, objective and similarity before and after, whether the network's field was
        kept), with ``ncc`` (local NCC of the result), ``smoothness`` and, with label maps,
        ``dice_before`` (unregistered).

    Raises:
        TypeError: If ``moving`` or ``fixed`` is not a :class:`~hyperreg.geometry.io.Volume`
            (tensors go to :func:`refine_flow`).
        ValueError: As :func:`~hyperreg.registration.lambdas.register_pair` and
            :func:`refine_flow` (non-finite voxels, bad step count), and for ``inverse`` with a
            model without a velocity field.
    """
    fn = "refine_pair"
    for name, volume in (("moving", moving), ("fixed", fixed)):
        if not isinstance(volume, Volume):
            hint = (
                "; for tensors (1, C, *S) call refine_flow(model, moving, fixed, lam, refinement)"
                if isinstance(volume, Tensor)
                else ""
            )
            raise TypeError(
                f"{fn}(): '{name}' must be a Volume (hyperreg.geometry.io.load_volume), got "
                f"{type(volume).__name__}{hint}"
            )
    refinement = with_model_similarity(model, refinement or Refinement())
    check_refinement(fn, refinement)
    if inverse and model.config.int_steps == 0:
        inverse_displacement(model, torch.zeros(0), torch.zeros(0))  # raises the clear error
    moving, moving_seg, fixed_seg, notes = prepare_pair(
        fn, model, moving, fixed, moving_seg, fixed_seg, resample=resample
    )
    device = next(model.parameters()).device
    moving_t, fixed_t, grid = network_inputs(model, moving, fixed, normalization, device, notes)
    masks_t = mask_tensors(model, fixed, masks, device)
    refined = refine_flow(model, moving_t, fixed_t, lam, refinement, masks=masks_t)
    out = refined.output
    result = result_from_output(
        out, 0, float(lam), moving_seg, fixed_seg, notes, labels, moving=moving, grid=grid,
        images=images,
    )
    result.smoothness = float(smoothness_of(model, out)[0])
    result.ncc = -float(ncc_loss(out.moved.float(), fixed_t))
    result.refinement = refined.stats(refinement)
    if result.dice is not None and moving_seg is not None and fixed_seg is not None:
        result.dice_before = mean_dice(moving_seg.data, fixed_seg.data, list(result.dice))
    if inverse:
        inv = inverse_displacement(model, refined.flow, moving_t)
        inv = grid.to_fixed(inv) if grid is not None else inv
        result.inverse_disp = inv[0].float().cpu().numpy().astype(np.float32)
    return result
