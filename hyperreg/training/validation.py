"""Validation during training: Dice, folding, similarity and loss on held-out pairs at a few λ.

Each pair is registered at every λ in one batched pass with
:func:`hyperreg.registration.lambdas.sweep_lambdas` (the inference code path, on
already-normalised arrays), Dice and folding come from :mod:`hyperreg.method.metrics`. The
validation loss at each λ is the HyperMorph training objective ``(1 − λ)·similarity +
λ·smoothness``, with smoothness the :func:`~hyperreg.method.losses.gradient_loss` of the
field training regularises (the velocity when the model integrates one, else the displacement).
The score that picks the best checkpoint is the mean Dice over pairs and λ values, or, for pairs
without label maps, minus the mean similarity loss. Must not import train or cli.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hyperreg.training.data import ValidationPair
from hyperreg.registration.lambdas import sweep_lambdas
from hyperreg.geometry.io import Volume
from hyperreg.method.metrics import mean_dice
from hyperreg.method.model import HyperMorph
from hyperreg.method.spatial import warp

__all__ = ["evaluate", "validation_columns"]


def validation_columns(lambdas: Sequence[float]) -> list[str]:
    """Columns of ``val_log.csv``.

    ``step, score, mean_dice``, then ``dice_λ, folding_pct_λ, similarity_λ`` per λ, then
    ``val_loss`` (mean validation loss over the λ values) and ``smoothness_λ, loss_λ`` per λ.
    """
    columns = ["step", "score", "mean_dice"]
    for lam in lambdas:
        columns += [f"dice_{lam:g}", f"folding_pct_{lam:g}", f"similarity_{lam:g}"]
    columns.append("val_loss")
    for lam in lambdas:
        columns += [f"smoothness_{lam:g}", f"loss_{lam:g}"]
    return columns


def _volume(array: np.ndarray, spacing: float) -> Volume:
    """A validation array as a volume with the model's voxel size, so it is registered as it is
    (validation pairs are loaded at the training voxel size; no network-grid resampling)."""
    affine = np.diag([spacing or 1.0] * 3 + [1.0])
    return Volume(array, affine, array.shape)


@torch.no_grad()
def evaluate(
    model: HyperMorph,
    pairs: Sequence[ValidationPair],
    lambdas: Sequence[float],
) -> dict[str, Any]:
    """Register every pair at every λ and average the metrics over the pairs.

    Args:
        model: The model (any mode; it is put in eval mode and restored).
        pairs: Validation pairs with normalised images.
        lambdas: λ values to evaluate.

    Returns:
        A dict with the keys of :func:`validation_columns` (except ``step``): Dice is NaN where
        no pair has label maps; ``folding_pct`` is percent of voxels with J ≤ 0;
        ``similarity_λ`` is the pair mean of the image term of the model's objective
        (``model.objective``, :mod:`hyperreg.method.objective`) for the moved image;
        ``smoothness_λ`` the pair mean of :func:`~hyperreg.method.losses.gradient_loss` of the
        velocity (of the displacement for a model without integration), in voxels²; ``loss_λ`` the
        HyperMorph validation loss ``(1 − λ)·similarity_λ + λ·smoothness_λ`` (the training
        objective on image pairs, averaged over pairs);
        ``val_loss`` the mean of ``loss_λ`` over ``lambdas``.
    """
    was_training = model.training
    model.eval()
    spacing = float(model.config.spacing)
    row: dict[str, Any] = {}
    dice_all: list[float] = []
    sim_all: list[float] = []
    loss_all: list[float] = []
    try:
        # one batched pass per pair registers it at every λ (sweep_lambdas)
        per_pair = []
        for pair in pairs:
            has_seg = pair.moving_seg is not None and pair.fixed_seg is not None
            results = sweep_lambdas(
                model,
                _volume(pair.moving, spacing),
                _volume(pair.fixed, spacing),
                list(lambdas),
                moving_seg=_volume(pair.moving_seg, spacing) if has_seg else None,
                fixed_seg=_volume(pair.fixed_seg, spacing) if has_seg else None,
                normalization="none",
            )
            per_pair.append((pair, has_seg, results))
        for index, lam in enumerate(lambdas):
            dices, folds, sims, smooths = [], [], [], []
            for pair, has_seg, results in per_pair:
                result = results[index]
                if has_seg:
                    dices.append(mean_dice(result.moved_seg, pair.fixed_seg))
                folds.append(100.0 * result.folding_fraction)
                # the moved image as training sees it (the model's warp, edge values outside;
                # result.moved pads with zeros as ANTs does)
                disp = torch.from_numpy(result.disp)[None]
                moved = warp(torch.from_numpy(pair.moving)[None, None], disp, exact=False)
                fixed = torch.from_numpy(pair.fixed)[None, None]
                sims.append(float(model.objective.image_term(moved, fixed)[0]))
                smooths.append(result.smoothness)
            scored = [d for d in dices if not math.isnan(d)]  # NaN: the pair shares no label
            dice = float(np.mean(scored)) if scored else float("nan")
            similarity, smoothness = float(np.mean(sims)), float(np.mean(smooths))
            loss = (1.0 - lam) * similarity + lam * smoothness
            row[f"dice_{lam:g}"] = dice
            row[f"folding_pct_{lam:g}"] = float(np.mean(folds))
            row[f"similarity_{lam:g}"] = similarity
            row[f"smoothness_{lam:g}"] = smoothness
            row[f"loss_{lam:g}"] = loss
            dice_all.append(dice)
            sim_all.append(similarity)
            loss_all.append(loss)
    finally:
        model.train(was_training)
    finite = [d for d in dice_all if not math.isnan(d)]
    row["mean_dice"] = float(np.mean(finite)) if finite else float("nan")
    row["score"] = row["mean_dice"] if finite else -float(np.mean(sim_all))
    row["val_loss"] = float(np.mean(loss_all))
    return row
