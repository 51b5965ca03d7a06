"""Validation: the val_log.csv columns and known answers for the per-λ validation loss."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from hyperreg.config import ModelConfig
from hyperreg.training.data import ValidationPair
from hyperreg.method.losses import gradient_loss, mse_loss, ncc_loss
from hyperreg.method.model import HyperMorph
from hyperreg.training.validation import evaluate, validation_columns

TINY = {"enc_channels": (4, 4, 4, 4), "dec_channels": (4,) * 7, "hyper_hidden": (8, 8)}


def test_validation_columns_keep_old_order_and_append_loss() -> None:
    columns = validation_columns([0.1, 0.5])
    old = ["step", "score", "mean_dice"]
    old += ["dice_0.1", "folding_pct_0.1", "similarity_0.1"]
    old += ["dice_0.5", "folding_pct_0.5", "similarity_0.5"]
    assert columns[: len(old)] == old
    assert columns[len(old) :] == [
        "val_loss",
        "smoothness_0.1",
        "loss_0.1",
        "smoothness_0.5",
        "loss_0.5",
    ]


def _pairs(make_blobs, shape: tuple[int, ...]) -> list[ValidationPair]:
    """Two blob pairs: one with label maps, one without."""
    images = make_blobs(shape, batch=4)[:, 0].numpy()
    seg = [(image > 0.3).astype(np.int32) for image in images[:2]]
    return [
        ValidationPair("with_seg", images[0], images[1], seg[0], seg[1]),
        ValidationPair("no_seg", images[2], images[3], None, None),
    ]


@pytest.mark.parametrize(
    ("ndim", "int_steps", "sim"),
    [(2, 7, "ncc"), (2, 0, "mse"), (3, 7, "mse")],
    ids=["2d-velocity-ncc", "2d-displacement-mse", "3d-velocity-mse"],
)
def test_validation_loss_is_the_training_objective(make_blobs, ndim, int_steps, sim) -> None:
    shape = {2: (16, 20), 3: (8, 10, 12)}[ndim]
    model = HyperMorph(ModelConfig(ndim=ndim, int_steps=int_steps, **TINY))
    with torch.no_grad():  # move the field away from zero so smoothness is not trivially 0
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    pairs = _pairs(make_blobs, shape)
    lambdas = [0.0, 0.25, 1.0]
    model.objective = dataclasses.replace(
        model.objective, similarity=sim, ncc_window=5, mse_sigma=0.1
    )
    model.train()
    row = evaluate(model, pairs, lambdas)
    assert model.training  # the mode is restored
    assert set(row) == set(validation_columns(lambdas)[1:])

    # independent computation, straight from the model's forward pass
    model.eval()
    losses = []
    with torch.no_grad():
        for lam in lambdas:
            sims, smooths = [], []
            for pair in pairs:
                moving = torch.from_numpy(pair.moving)[None, None]
                fixed = torch.from_numpy(pair.fixed)[None, None]
                out = model(moving, fixed, lam)
                if sim == "ncc":
                    sims.append(float(ncc_loss(out.moved, fixed, window=5)))
                else:
                    sims.append(float(mse_loss(out.moved, fixed, sigma=0.1)))
                field = out.disp if int_steps == 0 else out.velocity
                assert field is not None
                # the training loss's VoxelMorph loss_mult for a half-resolution velocity
                scale = model.config.int_downsize if field.shape[2] < out.disp.shape[2] else 1
                smooths.append(scale * float(gradient_loss(field)))
            expected = (1 - lam) * np.mean(sims) + lam * np.mean(smooths)
            assert np.mean(smooths) > 0
            assert row[f"similarity_{lam:g}"] == pytest.approx(np.mean(sims), rel=1e-5, abs=1e-7)
            assert row[f"smoothness_{lam:g}"] == pytest.approx(np.mean(smooths), rel=1e-5)
            assert row[f"loss_{lam:g}"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
            losses.append(expected)
    # λ = 0 is pure similarity, λ = 1 pure smoothness
    assert row["loss_0"] == row["similarity_0"]
    assert row["loss_1"] == row["smoothness_1"]
    assert row["val_loss"] == pytest.approx(np.mean(losses), rel=1e-5, abs=1e-7)
    assert math.isfinite(row["mean_dice"])  # one pair has label maps


def test_a_model_trained_at_a_voxel_size_validates_its_pairs_as_loaded(make_blobs) -> None:
    """Validation pairs are loaded at the training voxel size: a 2 mm model registers them as
    they are (no network-grid resampling), giving what the same weights at spacing 0 give."""
    import dataclasses

    torch.manual_seed(0)
    model = HyperMorph(ModelConfig(ndim=2, **TINY))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    pairs = _pairs(make_blobs, (16, 20))
    plain = evaluate(model, pairs, [0.3])
    model.config = dataclasses.replace(model.config, spacing=2.0)
    at_2mm = evaluate(model, pairs, [0.3])
    assert at_2mm == pytest.approx(plain, nan_ok=True)
