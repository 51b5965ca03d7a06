"""Validation during training: Dice, folding and similarity on held-out pairs at a few λ.

Each pair is registered with :func:`hyperreg.inference.register_pair` (the inference code path,
on already-normalised arrays), Dice and folding come from :mod:`hyperreg.metrics`. The score that
picks the best checkpoint is the mean Dice over pairs and λ values, or, for pairs without label
maps, minus the mean similarity loss. Must not import train or cli.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hyperreg.data import ValidationPair
from hyperreg.inference import register_pair
from hyperreg.io import Volume
from hyperreg.losses import mse_loss, ncc_loss
from hyperreg.metrics import mean_dice
from hyperreg.model import HyperMorph

__all__ = ["evaluate", "validation_columns"]


def validation_columns(lambdas: Sequence[float]) -> list[str]:
    """Columns of ``val_log.csv``: step, score, mean Dice, then Dice/folding %/similarity per λ."""
    columns = ["step", "score", "mean_dice"]
    for lam in lambdas:
        columns += [f"dice_{lam:g}", f"folding_pct_{lam:g}", f"similarity_{lam:g}"]
    return columns


def _volume(array: np.ndarray) -> Volume:
    return Volume(array, np.eye(4), array.shape)


@torch.no_grad()
def evaluate(
    model: HyperMorph,
    pairs: Sequence[ValidationPair],
    lambdas: Sequence[float],
    sim: str = "ncc",
    ncc_window: int = 9,
    mse_sigma: float = 0.05,
) -> dict[str, Any]:
    """Register every pair at every λ and average the metrics.

    Args:
        model: The model (any mode; it is put in eval mode and restored).
        pairs: Validation pairs with normalised images.
        lambdas: λ values to evaluate.
        sim: ``"ncc"`` or ``"mse"``: similarity loss reported per λ.
        ncc_window: NCC window.
        mse_sigma: MSE scale.

    Returns:
        A dict with the keys of :func:`validation_columns` (except ``step``): Dice is NaN where
        no pair has label maps; ``folding_pct`` is percent of voxels with J ≤ 0.
    """
    was_training = model.training
    model.eval()
    row: dict[str, Any] = {}
    dice_all: list[float] = []
    sim_all: list[float] = []
    try:
        for lam in lambdas:
            dices, folds, sims = [], [], []
            for pair in pairs:
                has_seg = pair.moving_seg is not None and pair.fixed_seg is not None
                result = register_pair(
                    model,
                    _volume(pair.moving),
                    _volume(pair.fixed),
                    lam,
                    moving_seg=_volume(pair.moving_seg) if has_seg else None,
                    fixed_seg=_volume(pair.fixed_seg) if has_seg else None,
                    normalization="none",
                )
                if has_seg:
                    dices.append(mean_dice(result.moved_seg, pair.fixed_seg))
                folds.append(100.0 * result.folding_fraction)
                moved = torch.from_numpy(result.moved)[None, None]
                fixed = torch.from_numpy(pair.fixed)[None, None]
                if sim == "ncc":
                    sims.append(float(ncc_loss(moved, fixed, window=ncc_window)))
                else:
                    sims.append(float(mse_loss(moved, fixed, sigma=mse_sigma)))
            dice = float(np.nanmean(dices)) if dices else float("nan")
            row[f"dice_{lam:g}"] = dice
            row[f"folding_pct_{lam:g}"] = float(np.mean(folds))
            row[f"similarity_{lam:g}"] = float(np.mean(sims))
            dice_all.append(dice)
            sim_all.append(float(np.mean(sims)))
    finally:
        model.train(was_training)
    finite = [d for d in dice_all if not math.isnan(d)]
    row["mean_dice"] = float(np.mean(finite)) if finite else float("nan")
    row["score"] = row["mean_dice"] if finite else -float(np.mean(sim_all))
    return row
