"""The objective, written once: known answers, and the same numbers wherever it is used."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.method.losses import gradient_loss, ncc_loss
from hyperreg.method.model import HyperMorph, load_checkpoint, save_checkpoint
from hyperreg.method.objective import Objective, one_hot, pooled_one_hot
from hyperreg.training.data import batch_of, foreground_centre, label_indices
from hyperreg.training.sources import fit_to_shape
from hyperreg.training.train import hypermorph_loss, training_objective

TINY = {"enc_channels": (4, 4, 4, 4), "dec_channels": (4, 4, 4, 4, 4, 4, 4),
        "hyper_hidden": (8,)}


def _blob(shape: tuple[int, ...], centre: tuple[float, ...], radius: float) -> torch.Tensor:
    grids = torch.meshgrid(*(torch.arange(n, dtype=torch.float32) for n in shape), indexing="ij")
    dist = sum((g - c) ** 2 for g, c in zip(grids, centre))
    return (dist <= radius**2).float()[None, None]


def test_formula_by_hand() -> None:
    torch.manual_seed(0)
    moved, fixed = torch.rand(2, 1, 12, 14), torch.rand(2, 1, 12, 14)
    velocity = torch.randn(2, 2, 6, 7) * 0.3
    lam = torch.tensor([0.2, 0.7])
    terms = Objective(ncc_window=5, int_downsize=2)(moved, fixed, velocity, lam)
    sim = ncc_loss(moved, fixed, window=5, reduction="none")
    smooth = 2 * gradient_loss(velocity, reduction="none")  # half resolution: loss_mult 2
    expected = ((1 - lam) * sim + lam * smooth).mean()
    assert torch.allclose(terms.loss, expected)
    assert torch.allclose(terms.smoothness, smooth)
    # a full-resolution field is not multiplied
    full = torch.randn(2, 2, 12, 14)
    terms = Objective(int_downsize=2)(moved, fixed, full, lam)
    assert torch.allclose(terms.smoothness, gradient_loss(full, reduction="none"))


def test_label_term_soft_dice_known_answer() -> None:
    fixed_map = torch.zeros(1, 1, 10, 10, dtype=torch.int16)
    fixed_map[..., 0:5, :] = 1  # two labels, each half the image
    fixed_map[..., 5:10, :] = 2
    zero = torch.zeros(1, 2, 10, 10)
    objective = Objective(label_loss="dice", image_weight=0.0)
    same = objective(torch.zeros(1, 1, 10, 10), torch.zeros(1, 1, 10, 10), zero, 0.0,
                     disp=zero, moving_labels=fixed_map, fixed_labels=fixed_map)
    assert same.labels.item() == pytest.approx(0.0, abs=1e-6)
    swapped = 3 - fixed_map  # labels 1 and 2 exchanged: no overlap
    other = objective(torch.zeros(1, 1, 10, 10), torch.zeros(1, 1, 10, 10), zero, 0.0,
                      disp=zero, moving_labels=swapped, fixed_labels=fixed_map)
    assert other.labels.item() == pytest.approx(1.0, abs=1e-6)
    # a sample with no labels gets no label term; image_pairs switches the image term off
    none = torch.zeros_like(fixed_map)
    empty = objective(torch.zeros(1, 1, 10, 10), torch.zeros(1, 1, 10, 10), zero, 0.0,
                      disp=zero, moving_labels=none, fixed_labels=none)
    assert empty.labels.item() == 0.0


def test_label_term_drives_the_field() -> None:
    """The gradient of the label term moves a shifted blob towards its target."""
    fixed = _blob((24, 24), (12, 12), 5).to(torch.int16)
    moving = _blob((24, 24), (12, 15), 5).to(torch.int16)
    disp = torch.zeros(1, 2, 24, 24, requires_grad=True)
    objective = Objective(label_loss="dice", image_weight=0.0)
    terms = objective(torch.zeros(1, 1, 24, 24), torch.zeros(1, 1, 24, 24), disp, 0.0,
                      disp=disp, moving_labels=moving, fixed_labels=fixed)
    terms.loss.backward()
    # moved(x) = moving(x + u): u along axis 1 must become positive (+3), so its gradient < 0
    assert float(disp.grad[0, 1].sum()) < 0
    coarse = dataclasses.replace(objective, label_downsize=2)
    assert coarse(torch.zeros(1, 1, 24, 24), torch.zeros(1, 1, 24, 24), disp.detach(), 0.0,
                  disp=disp.detach(), moving_labels=moving, fixed_labels=fixed).labels.item() > 0.1


def test_training_uses_the_objective_and_checkpoints_carry_it(tmp_path) -> None:
    config = TrainConfig(sim="mse", mse_sigma=0.1, label_loss="mse", label_weight=2.0,
                         model=ModelConfig(ndim=2, **TINY))
    objective = training_objective(config)
    assert (objective.similarity, objective.mse_sigma, objective.label_loss) == ("mse", 0.1, "mse")
    model = HyperMorph(config.model)
    model.objective = objective
    moving, fixed = torch.rand(2, 1, 16, 16), torch.rand(2, 1, 16, 16)
    lam = torch.tensor([0.3, 0.6])
    out = model(moving, fixed, lam)
    loss, _, _ = hypermorph_loss(out, fixed, lam, config)
    assert torch.allclose(loss, objective(out.moved, fixed, out.velocity, lam).loss)
    path = save_checkpoint(model, tmp_path / "m.pt")
    loaded, _ = load_checkpoint(path)
    assert loaded.objective == objective


def test_old_checkpoint_objective_comes_from_its_training_config(tmp_path) -> None:
    model = HyperMorph(ModelConfig(ndim=2, **TINY))
    train_config = {"sim": "mse", "mse_sigma": 0.2}
    path = save_checkpoint(model, tmp_path / "old.pt", train_config=train_config)
    payload = torch.load(path, weights_only=True)
    del payload["objective"]  # as files written before the objective was stored
    torch.save(payload, path)
    loaded, _ = load_checkpoint(path)
    assert (loaded.objective.similarity, loaded.objective.mse_sigma) == ("mse", 0.2)


def test_label_indices_share_ids_and_bound_the_count() -> None:
    a = np.array([[0, 3, 3], [7, 7, 2035]])
    b = np.array([[3, 0, 2035], [7, 0, 0]])
    ids = np.union1d(np.unique(a[a > 0]), np.unique(b[b > 0]))
    ia, ib = label_indices([a, b], ids, 24, torch.Generator().manual_seed(0))
    assert ia.tolist() == [[0, 1, 1], [2, 2, 3]]
    assert ib.tolist() == [[1, 0, 3], [2, 0, 0]]
    few = label_indices([a, b], ids, 2, torch.Generator().manual_seed(0))
    assert max(int(m.max()) for m in few) == 2


def test_one_hot_layout() -> None:
    index = torch.tensor([[[0, 2], [1, 2]]], dtype=torch.int16)[None]
    hot = one_hot(index, 3)
    assert hot.shape == (1, 3, 2, 2)
    assert hot[0, :, 0, 1].tolist() == [0.0, 0.0, 1.0]


def test_foreground_centre_keeps_the_top() -> None:
    volume = np.zeros((20, 20, 40), np.float32)
    volume[5:15, 5:15, 2:36] = 1.0  # a tall head with a neck
    centre = foreground_centre(volume, None, 0, (20, 20, 16))
    fitted = fit_to_shape(volume, (20, 20, 16), 0, centre)
    top = int(np.flatnonzero(fitted.any(axis=(0, 1)))[-1])
    assert top == 15 - 8  # the top of the foreground 8 voxels below the top of the grid
    assert fitted.any(axis=(0, 1))[0]  # the neck is cut, not the vertex


def test_batch_of_plain_sources() -> None:
    class Plain:
        def sample(self, batch_size, generator):
            return torch.zeros(batch_size, 1, 4, 4), torch.ones(batch_size, 1, 4, 4)

    batch = batch_of(Plain(), 3, torch.Generator())
    assert batch.moving_labels.shape == (3, 1, 4, 4)
    assert int(batch.moving_labels.abs().sum()) == 0
    assert batch.image_pairs.all()


@pytest.mark.parametrize(
    ("shape", "factor"), [((2, 1, 9, 7), 2), ((1, 1, 10, 12, 9), 2), ((1, 1, 8, 8, 8), 4)]
)
def test_pooled_one_hot_equals_pooling_the_one_hot(shape, factor) -> None:
    """The label term's coarse maps: exactly avg_pool(one_hot) (odd sizes: whole blocks only)."""
    index = torch.randint(0, 6, shape, generator=torch.Generator().manual_seed(0))
    pool = F.avg_pool2d if len(shape) == 4 else F.avg_pool3d
    expected = pool(one_hot(index, 7), factor)
    pooled = pooled_one_hot(index.to(torch.int16), 7, factor)
    assert pooled.shape == expected.shape and torch.equal(pooled, expected)
