"""One level of test-time refinement: where a flow is scored, and the Adam loop that lowers it.

A :class:`RefineLevel` turns a raw flow into ``(loss, image dissimilarity)`` of an objective
(:func:`hyperreg.registration.refine.refine_objective`): on the network's grid through the
model's own integration, resizing and cropping, or, coarse, on images average-pooled to the
velocity's grid. :func:`foreground_box` is where the loss is evaluated (the box of both images'
foreground, a :class:`LossBox`); :func:`optimise_level` runs Adam on one level, stops early when
the loss stops improving and keeps the best flow. The coarse-to-fine schedule, the checks and
the results are :mod:`hyperreg.registration.refine`'s. Must not import training, apps or cli.

References:
    Siebert, Hansen, Heinrich, ConvexAdam (MICCAI 2021; IEEE TMI 2024): Adam instance
    optimisation on a coarse grid after a first estimate.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from hyperreg.method.losses import NCCReference, ncc_reference
from hyperreg.method.model import HyperMorph
from hyperreg.method.objective import Objective
from hyperreg.method.spatial import integrate_velocity, resize_field, warp

__all__ = [
    "LevelResult",
    "LossBox",
    "QuarterLevel",
    "RefineLevel",
    "foreground_box",
    "level_steps",
    "optimise_level",
]

_PATIENCE = 5  # steps without a relative improvement of the best loss above _TOLERANCE: stop
_TOLERANCE = 2e-4
_BOX_MARGIN = 8  # fine-grid voxels of background kept around the foreground, plus NCC's half window


def _terms(
    objective: Objective,
    moved: Tensor,
    fixed: Tensor,
    field: Tensor,
    lam: float,
    shape,
    weight: Tensor | None = None,
    reference: NCCReference | None = None,
) -> tuple[Tensor, Tensor]:
    """``(loss, image dissimilarity)`` of one evaluation; ``shape`` is the fine image grid (it
    sets the regulariser's ``k``, so both levels weigh smoothness alike); ``weight`` (cost
    masks) weighs the similarity's voxels, the regulariser counts everywhere; ``reference``:
    the fixed image's NCC statistics, computed once per level."""
    image = objective.image_term(moved, fixed, weight, reference).float()
    smooth = objective.smoothness(field, shape).float()
    return ((1 - lam) * image + lam * smooth).mean(), image.mean()


def _pool(image: Tensor) -> Tensor:
    """Average-pool by 2 (a last odd voxel is averaged alone): size ``ceil(S / 2)``."""
    pool = F.avg_pool2d if image.ndim == 4 else F.avg_pool3d
    return pool(image, 2, ceil_mode=True)


class RefineLevel:
    """One level of the optimisation: images and how a flow becomes ``(loss, similarity)``.

    Calling it with a raw flow (as :meth:`~hyperreg.method.model.HyperMorph.predict_flow`
    returns it, cropped to the loss box) gives ``(loss, image dissimilarity)``, both scalar
    tensors: ``(1 − λ)·S + λ·k·R`` of ``objective`` and ``S`` alone (lower is better).

    Args:
        model: The :class:`~hyperreg.method.model.HyperMorph` whose flow is refined.
        objective: The objective (:func:`~hyperreg.registration.refine.refine_objective`).
        moving: Normalised moving image ``(1, C, *S)`` on the network's grid (or its box).
        fixed: Normalised fixed image, same shape; its grid sets the regulariser's ``k``.
        lam: λ in [0, 1].
        coarse: The coarse level: images average-pooled by 2 to the velocity's grid, the
            velocity integrated there (no upsampling), NCC window halved (odd, at least 3) so
            it spans the same millimetres.
        masks: ``(fixed mask, moving mask)`` tensors ``(1, 1, *S)`` like the images (1 inside,
            0 outside; either None), or None: the similarity counts each voxel by the fixed
            mask times the moving mask warped with the moving image (ANTs' ``-x``).
    """

    def __init__(
        self,
        model: HyperMorph,
        objective: Objective,
        moving: Tensor,
        fixed: Tensor,
        lam: float,
        coarse: bool,
        masks: tuple[Tensor | None, Tensor | None] | None = None,
    ) -> None:
        self.model, self.objective, self.lam, self.coarse = model, objective, lam, coarse
        self.shape = tuple(fixed.shape[2:])  # the fine grid
        self.moving = _pool(moving) if coarse else moving
        self.fixed = _pool(fixed) if coarse else fixed
        self.masks = masks
        pooled = [None if m is None or not coarse else _pool(m) for m in masks or (None, None)]
        self._masks = masks if not coarse or masks is None else (pooled[0], pooled[1])
        if coarse and objective.similarity == "ncc":  # the same window in mm on half the voxels
            window = max(3, (objective.ncc_window // 2) | 1)
            self.objective = dataclasses.replace(objective, ncc_window=window)
        # the fixed image's local NCC statistics are the same at every step: once per level
        self._reference = None
        if self.objective.similarity == "ncc":
            self._reference = ncc_reference(self.fixed, self.objective.ncc_window)

    def __call__(self, flow: Tensor) -> tuple[Tensor, Tensor]:
        if not self.coarse:
            out = self.model.flow_to_output(flow, self.moving)
            field = out.velocity if out.velocity is not None else out.disp
            weight = self._weight(out.disp)
            terms = (self.objective, out.moved, self.fixed, field, self.lam, self.shape, weight)
            return _terms(*terms, self._reference)
        # the velocity's own grid: integrated as the model does, no upsampling
        crop = (slice(None), slice(None), *[slice(0, n) for n in self.moving.shape[2:]])
        velocity = flow[crop]
        disp = integrate_velocity(flow, self.model.config.int_steps)[crop]
        moved = warp(self.moving, disp, exact=False)
        weight = self._weight(disp)
        terms = (self.objective, moved, self.fixed, velocity, self.lam, self.shape, weight)
        return _terms(*terms, self._reference)

    def _weight(self, disp: Tensor) -> Tensor | None:
        """The similarity's voxel weights for ``disp`` (this level's grid), or None."""
        return _similarity_weight(self._masks, self.objective, disp)


def _similarity_weight(
    masks: tuple[Tensor | None, Tensor | None] | None, objective: Objective, disp: Tensor
) -> Tensor | None:
    """The similarity's voxel weights of a level with cost ``masks`` (its grid) for ``disp``,
    or None without masks."""
    if masks is None:
        return None
    fixed_mask, moving_mask = masks
    # no gradient through the warped mask: moving it is no way to lower the loss (with
    # one, the optimiser shrank a masked-out square: squeezing it out of the count)
    weight = None if moving_mask is None else warp(moving_mask, disp.detach(), exact=False)
    if fixed_mask is not None:
        weight = fixed_mask if weight is None else weight * fixed_mask
    if weight is None or objective.similarity != "ncc":
        return weight
    # eroded by the NCC window: a voxel whose window reaches outside the masks does not
    # count, so what lies outside (a cavity's dark inside) pulls on no voxel's similarity
    window = objective.ncc_window
    pool = F.max_pool2d if weight.ndim == 4 else F.max_pool3d
    return -pool(-weight, window, stride=1, padding=window // 2)


class QuarterLevel:
    """The quarter-resolution level: a correction ``w`` on half the velocity's grid.

    The velocity becomes ``v0 + up(w)`` (``v0`` the flow it starts from, ``up`` trilinear
    upsampling by 2 with the vectors doubled, :func:`~hyperreg.method.spatial.resize_field`).
    On this level it is approximated by ``pool(v0) / 2 + w``: the velocity average-pooled by 2
    (in voxels of the quarter grid), integrated there with the model's step count, warping the
    images average-pooled by 4 (the velocity's grid pooled once more), NCC window halved again
    (odd, at least 3); the regulariser is that of the pooled velocity, with the fine grid's
    ``k``. A step costs about 1/8 of a coarse step. Calling it with ``w`` gives ``(loss,
    image dissimilarity)`` as :class:`RefineLevel` does; :meth:`velocity` gives ``v0 + up(w)``.

    Args:
        coarse: The coarse :class:`RefineLevel` of the same pair (its pooled images, masks and
            window are pooled and halved once more).
        start: ``v0``, the raw flow ``(1, N, *P')`` (cropped to the loss box) it corrects.
    """

    def __init__(self, coarse: RefineLevel, start: Tensor) -> None:
        self.model, self.lam, self.shape = coarse.model, coarse.lam, coarse.shape
        self.start = start.detach()
        self.base = _pool(self.start) / 2  # in voxels of the quarter grid
        self.moving, self.fixed = _pool(coarse.moving), _pool(coarse.fixed)
        masks = coarse._masks
        self._masks = None if masks is None else (_pool_or_none(masks[0]), _pool_or_none(masks[1]))
        self.objective = coarse.objective
        if self.objective.similarity == "ncc":
            window = max(3, (coarse.objective.ncc_window // 2) | 1)
            self.objective = dataclasses.replace(coarse.objective, ncc_window=window)
        self._reference = None
        if self.objective.similarity == "ncc":
            self._reference = ncc_reference(self.fixed, self.objective.ncc_window)

    def zeros(self) -> Tensor:
        """The correction's start: no change, ``(1, N, *ceil(P' / 2))``."""
        return torch.zeros_like(self.base)

    def velocity(self, correction: Tensor) -> Tensor:
        """``v0 + up(w)``: the raw flow on the velocity's grid, detached."""
        up = resize_field(correction.detach(), 2.0, self.start.shape[2:])
        return self.start + up

    def __call__(self, correction: Tensor) -> tuple[Tensor, Tensor]:
        velocity = self.base + correction
        crop = (slice(None), slice(None), *[slice(0, n) for n in self.moving.shape[2:]])
        disp = integrate_velocity(velocity, self.model.config.int_steps)[crop]
        moved = warp(self.moving, disp, exact=False)
        weight = _similarity_weight(self._masks, self.objective, disp)
        terms = (self.objective, moved, self.fixed, velocity[crop], self.lam, self.shape, weight)
        return _terms(*terms, self._reference)


def _pool_or_none(mask: Tensor | None) -> Tensor | None:
    return None if mask is None else _pool(mask)


def level_steps(model: HyperMorph, steps: int, levels: int) -> tuple[int, int, int]:
    """The most Adam steps of each level, ``(quarter, coarse, fine)``, for a refinement of
    ``model`` with ``steps`` (``n``) on ``levels``: 1 ``(0, 0, n)``, 2 ``(0, n, n)``, 3
    ``(n, ⌈n/2⌉, ⌈n/2⌉)``. A model without a half-resolution velocity refines at the fine
    level only: ``(0, 0, n)``."""
    if steps == 0 or levels == 1 or not (model.config.int_steps > 0 and model.half_res):
        return 0, 0, steps
    if levels == 2:
        return 0, steps, steps
    half = -(-steps // 2)
    return steps, half, half


class LevelResult(NamedTuple):
    """Output of :func:`optimise_level`: the best flow, its loss and image dissimilarity (as
    :class:`RefineLevel` gives them; ``inf`` and NaN when no step was scored), the Adam steps
    taken, whether a non-finite loss stopped it, and ``(loss, image dissimilarity)`` of the
    start (its first evaluation; None when no step ran)."""

    flow: Tensor
    loss: float
    image: float
    taken: int
    diverged: bool
    start: tuple[float, float] | None = None


def optimise_level(level: RefineLevel, start: Tensor, lr: float, steps: int) -> LevelResult:
    """Adam from ``start`` for at most ``steps``; returns the best flow and its scores
    (:class:`LevelResult`). Stops after :data:`_PATIENCE` steps without a relative gain of
    :data:`_TOLERANCE` on the best loss; a non-finite loss stops it as diverged.

    Only a copy of ``start`` is optimised (``lr`` in voxels of the flow's grid per step); the
    model's weights receive no gradients."""
    param = start.detach().clone().requires_grad_(True)
    optimiser = torch.optim.Adam([param], lr=lr)
    best, best_loss, best_image, stale = start.detach(), math.inf, math.nan, 0
    taken, first = 0, None
    with torch.enable_grad():
        for taken in range(1, steps + 1):
            loss, image = level(param)
            value = float(loss.detach())
            first = first or (value, float(image.detach()))
            if not math.isfinite(value):
                return LevelResult(best, best_loss, best_image, taken, True, first)
            if value < best_loss - _TOLERANCE * abs(best_loss if math.isfinite(best_loss) else 0):
                best, best_loss, stale = param.detach().clone(), value, 0
                best_image = float(image.detach())
            else:
                stale += 1
                if stale >= _PATIENCE:
                    break
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
    with torch.no_grad():  # the last step's result has not been scored yet
        loss, image = level(param.detach())
        value = float(loss)
    if not math.isfinite(value):
        return LevelResult(best, best_loss, best_image, taken, True, first)
    if value < best_loss:
        best, best_loss, best_image = param.detach().clone(), value, float(image)
    return LevelResult(best, best_loss, best_image, taken, False, first)


class LossBox(NamedTuple):
    """Where the loss is evaluated: image slices and the matching flow slices (spatial axes)."""

    image: tuple[slice, ...]
    flow: tuple[slice, ...]

    def crop(self, image: Tensor) -> Tensor:
        """``image`` ``(B, C, *S)`` cropped to the box."""
        return image[(slice(None), slice(None), *self.image)]

    def crop_masks(
        self, masks: tuple[Tensor | None, Tensor | None] | None
    ) -> tuple[Tensor | None, Tensor | None] | None:
        """Cost masks (:class:`RefineLevel`'s ``masks``) cropped to the box."""
        if masks is None:
            return None
        return tuple(None if m is None else self.crop(m) for m in masks)  # type: ignore[return-value]


def foreground_box(model: HyperMorph, moving: Tensor, fixed: Tensor, window: int) -> LossBox:
    """The foreground of either image (above 1 % of its range), dilated by :data:`_BOX_MARGIN`
    and half the NCC window, grown to a multiple of 16 voxels at an even start per axis (so a
    crop is a valid model input and its flow is a slice of the full flow); an axis the box
    would fill is kept whole.

    NCC of background windows is 0 and the flow outside the box is not changed, so the loss on
    the box is the whole objective up to a constant and a factor."""
    mask = (moving[0].amax(0) > 0.01 * moving.max()) | (fixed[0].amax(0) > 0.01 * fixed.max())
    divisor = model.unet.divisor
    margin = _BOX_MARGIN + window // 2
    image, flow = [], []
    for axis, size in enumerate(mask.shape):
        other = tuple(a for a in range(mask.ndim) if a != axis)
        hits = torch.nonzero(mask.any(dim=other) if other else mask).flatten()
        if hits.numel() == 0:
            return LossBox((slice(None),) * mask.ndim, (slice(None),) * mask.ndim)
        low = max(0, int(hits.min()) - margin)
        high = min(size, int(hits.max()) + 1 + margin)
        length = -(-(high - low) // divisor) * divisor
        if length >= size:  # the whole axis
            image.append(slice(0, size))
            flow.append(slice(None))
            continue
        start = min(low - low % 2, size - length)
        start -= start % 2
        image.append(slice(start, start + length))
        factor = 2 if model.half_res else 1
        flow.append(slice(start // factor, (start + length) // factor))
    return LossBox(tuple(image), tuple(flow))
