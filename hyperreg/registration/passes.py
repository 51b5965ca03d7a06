"""The network applied more than once to a pair: each pass registers the previous pass's moved
image to the fixed image, and the fields are composed.

This is the recursive cascade of Zhao et al., "Recursive Cascaded Networks for Unsupervised
Medical Image Registration" (ICCV 2019), at test time and with one set of weights for every
pass. A model sees its own moved images in training only with
:attr:`hyperreg.config.TrainConfig.cascade_every`, so the number of passes is a measured setting,
not a property of the method (``docs/commands.md`` and a bundled model's card say what helped on
held-out people). Refinement, when asked for, refines the last pass's field with the earlier
passes' composed field held fixed.

Composition, for displacements in voxels of the fixed grid with ``moved[x] = moving(x + u(x))``:
after ``u1`` then ``u2`` (``u2`` registers ``moving ∘ (id + u1)`` to the fixed image),
``u(x) = u2(x) + u1(x + u2(x))``. The moving image is warped by the composed field at every pass
(one interpolation of the input each time, never of an earlier pass's output). Must not import
training, apps or cli.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.geometry.io import Volume
from hyperreg.method.losses import ncc_loss
from hyperreg.method.model import HyperMorph, RegistrationOutput
from hyperreg.method.spatial import compose_displacements, warp
from hyperreg.registration.pairs import network_inputs, result_from_output, smoothness_of
from hyperreg.registration.masks import mask_tensors
from hyperreg.registration.refine import Refinement, refine_flow
from hyperreg.registration.results import RegistrationResult

__all__ = ["MAX_PASSES", "register_passes"]

MAX_PASSES = 4
"""Most network passes one registration may ask for."""


def register_passes(
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    lam: float,
    passes: int,
    refinement: Refinement | None = None,
    *,
    moving_seg: Volume | None = None,
    fixed_seg: Volume | None = None,
    labels: Sequence[int] | None = None,
    normalization: str = DEFAULT_NORMALIZATION,
    images: bool = True,
    ncc: bool = False,
    masks: tuple[Volume | None, Volume | None] | None = None,
) -> RegistrationResult:
    """Register ``moving`` to ``fixed`` at λ with ``passes`` network passes, composed.

    The pair is brought to the network's grid and normalised once
    (:func:`~hyperreg.registration.pairs.network_inputs`); every pass sees the normalised
    moving image warped by the composed field so far (not normalised again: a warped image's
    maximum is lower, and min-max scaling would brighten it), and the composed field comes back
    to the fixed grid once.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving: Moving image **on the fixed grid** (e.g. after the affine stage).
        fixed: Fixed image.
        lam: λ in [0, 1], the same for every pass.
        passes: Network passes, 1 to :data:`MAX_PASSES` (1 is the network's own field).
        refinement: Refines the last pass's field (:func:`~hyperreg.registration.refine.
            refine_flow`), or None.
        moving_seg, fixed_seg: Label maps on the fixed grid (Dice), or None.
        labels: Label ids scored for Dice; default those of the input maps.
        normalization: Intensity normalisation of the inputs.
        images: False returns the field and its statistics only.
        ncc: Also compute the local NCC of the moved and the fixed image (``result.ncc``).
        masks: Cost masks ``(fixed, moving)`` on the fixed grid for the refinement's
            similarity (:func:`~hyperreg.registration.refine.refine_pair`), or None.

    Returns:
        A :class:`~hyperreg.registration.results.RegistrationResult` with the composed field
        (``disp`` on the fixed grid, its folding and log J; moved image and label map warped
        once from the inputs); ``smoothness`` and ``refinement`` are the last pass's.

    Raises:
        ValueError: If ``passes`` is not an integer in [1, MAX_PASSES], or as
            :func:`~hyperreg.registration.lambdas.register_pair` and ``refine_flow``.
    """
    if isinstance(passes, bool) or not isinstance(passes, int) or not 1 <= passes <= MAX_PASSES:
        raise ValueError(
            f"register_passes(): 'passes' must be an integer from 1 to {MAX_PASSES}, got {passes!r}"
        )
    notes: list[str] = []
    device = next(model.parameters()).device
    moving_t, fixed_t, grid = network_inputs(model, moving, fixed, normalization, device, notes)
    total: torch.Tensor | None = None
    current, stats = moving_t, None
    for index in range(passes):
        if index == passes - 1 and refinement is not None and refinement.steps > 0:
            masks_t = mask_tensors(model, fixed, masks, device)
            if masks_t is not None and masks_t[1] is not None and total is not None:
                masks_t = (masks_t[0], warp(masks_t[1], total))  # as the moving image so far
            refined = refine_flow(model, current, fixed_t, float(lam), refinement, masks=masks_t)
            out, stats = refined.output, refined.stats(refinement)
        else:
            with torch.no_grad():
                out = model(current, fixed_t, float(lam))
        with torch.no_grad():
            total = out.disp if total is None else compose_displacements(total, out.disp)
            current = out.moved if index == 0 else warp(moving_t, total)
    assert total is not None  # passes >= 1
    composed = RegistrationOutput(moved=current, disp=total, velocity=None)
    result = result_from_output(
        composed, 0, float(lam), moving_seg, fixed_seg, notes, labels, moving=moving, grid=grid,
        images=images,
    )  # fmt: skip
    result.smoothness = float(smoothness_of(model, out)[0])
    result.refinement = stats
    if ncc:
        result.ncc = -float(ncc_loss(current.float(), fixed_t))
    return result
