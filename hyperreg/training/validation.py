"""Validation during training: Dice, folding, similarity and loss on held-out pairs at a few λ.

Each pair is registered at every λ by the inference engine
(:func:`hyperreg.registration.engine.run`, on already-normalised arrays) with the model's own
passes and flip averaging, as ``hyperreg register`` runs it (no refinement, no verdict); Dice is
:func:`~hyperreg.method.metrics.registration_dice` over the input maps' labels, as every command
scores it. The validation loss at each λ is the model's training objective
(:class:`~hyperreg.method.objective.Objective`): ``(1 − λ)·D + λ·k·R``, ``D`` the image term
plus the label term the model trained with (when it has one and the pair has label maps), ``R``
the smoothness of the field training regularises (the last pass's). The score that picks the
best checkpoint is the mean Dice over pairs and λ values, or, for pairs without label maps,
minus the mean similarity loss. Must not import train or cli.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.io import Volume
from hyperreg.method.metrics import input_labels
from hyperreg.method.model import HyperMorph
from hyperreg.method.spatial import warp
from hyperreg.registration.engine import run
from hyperreg.registration.prepared import PreparedPair
from hyperreg.registration.settings import resolve_settings
from hyperreg.training.data import ValidationPair

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


def _prepared(pair: ValidationPair, spacing: float) -> PreparedPair:
    """A validation pair as the engine takes it: already on one grid, no affine stage."""
    moving, fixed = _volume(pair.moving, spacing), _volume(pair.fixed, spacing)
    has_seg = pair.moving_seg is not None and pair.fixed_seg is not None
    moving_seg = _volume(pair.moving_seg, spacing) if has_seg else None
    fixed_seg = _volume(pair.fixed_seg, spacing) if has_seg else None
    labels = input_labels(pair.moving_seg, pair.fixed_seg) if has_seg else None
    return PreparedPair(
        moving=moving, fixed=fixed, moving_seg=moving_seg, fixed_seg=fixed_seg,
        transform=AffineTransform.identity(), chained=False, aligned=moving,
        aligned_seg=moving_seg, labels=labels, dice_before=None, dice_affine=None,
        affine=None, normalization="none", notes=[],
    )  # fmt: skip


def _index_maps(pair: ValidationPair) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair's label maps as ``(1, 1, *S)`` index maps (0 background, 1.. the ids of
    either map), as training's label term takes them."""
    assert pair.moving_seg is not None and pair.fixed_seg is not None
    ids = np.union1d(np.unique(pair.moving_seg), np.unique(pair.fixed_seg))
    ids = np.union1d(ids, [0])
    maps = [np.searchsorted(ids, seg).astype(np.int64) for seg in (pair.moving_seg, pair.fixed_seg)]
    moving, fixed = (torch.from_numpy(m)[None, None] for m in maps)
    return moving, fixed


def _data_term(
    model: HyperMorph, pair: ValidationPair, disp_array: np.ndarray, lam: float
) -> tuple[float, float]:
    """``(image term S, data term D)`` of the model's objective for one registered pair: the
    moved image as training sees it (the model's warp, edge values outside; ``PairResult.moved``
    pads with zeros as ANTs does), and the label term with label maps."""
    disp = torch.from_numpy(disp_array)[None]
    moved = warp(torch.from_numpy(pair.moving)[None, None], disp, exact=False)
    fixed = torch.from_numpy(pair.fixed)[None, None]
    labels: dict[str, Any] = {}
    if pair.moving_seg is not None and pair.fixed_seg is not None:
        moving_labels, fixed_labels = _index_maps(pair)
        labels = dict(moving_labels=moving_labels, fixed_labels=fixed_labels)
    terms = model.objective(moved, fixed, disp, lam, disp=disp, **labels)
    return float(terms.image[0]), float(terms.similarity[0])


def _shares_labels(pair: ValidationPair) -> bool:
    """Whether the pair's two label maps share a label id other than 0: Dice over maps with
    none in common is 0 for every label and says nothing about the registration (such a pair
    is scored by similarity)."""
    if pair.moving_seg is None or pair.fixed_seg is None:
        return False
    moving, fixed = np.unique(pair.moving_seg), np.unique(pair.fixed_seg)
    return bool(np.setdiff1d(np.intersect1d(moving, fixed), [0]).size)


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
        validation loss ``(1 − λ)·D_λ + λ·smoothness_λ``, ``D_λ`` the pair mean of the
        objective's data term (the image term plus the label term the model trained with);
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
        # the engine registers each pair at every λ (batched λ, the model's passes and flips)
        settings = resolve_settings(model, lambdas, judged=False, never_worse=False, fn="evaluate")
        per_pair = [(pair, run(_prepared(pair, spacing), model, settings)) for pair in pairs]
        scored_pairs = {id(pair) for pair in pairs if _shares_labels(pair)}
        for index, lam in enumerate(lambdas):
            dices, folds, sims, datas, smooths = [], [], [], [], []
            for pair, results in per_pair:
                result = results[index]
                if result.dice is not None and id(pair) in scored_pairs:
                    dices.append(result.mean_dice)
                folds.append(100.0 * result.folding_fraction)
                image, data = _data_term(model, pair, result.disp, float(lam))
                sims.append(image)
                datas.append(data)
                smooths.append(result.smoothness)
            scored = [d for d in dices if not math.isnan(d)]  # NaN: the pair shares no label
            dice = float(np.mean(scored)) if scored else float("nan")
            similarity, smoothness = float(np.mean(sims)), float(np.mean(smooths))
            loss = (1.0 - lam) * float(np.mean(datas)) + lam * smoothness
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
