"""A model trained at a voxel size (ModelConfig.spacing) registers pairs with other voxels: the
network runs at its own voxel size and the field comes back to the fixed grid."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lambda_helpers import AFFINE, blob, labels_of, tiny_model
from hyperreg.config import ModelConfig, TrainConfig, to_dict
from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import isotropic_grid, resample_to
from hyperreg.method.model import checkpoint_config, load_checkpoint, save_checkpoint
from hyperreg.registration.lambdas import register_pair
from hyperreg.registration.pairs import NetworkGrid, network_grid
from hyperreg.training.checkpointing import init_from_model

SHAPE_3D = (20, 24, 28)


def _volume(data: np.ndarray, affine: np.ndarray = AFFINE) -> Volume:
    return Volume(data, affine, data.shape)


def test_isotropic_grid_keeps_axes_origin_and_field_of_view() -> None:
    fine = _volume(np.zeros(SHAPE_3D, np.float32))
    grid = isotropic_grid(fine, 2.0)
    assert grid is not None and grid.spatial_shape == (10, 12, 14)
    np.testing.assert_allclose(grid.affine[:3, 3], fine.affine[:3, 3])
    np.testing.assert_allclose(grid.affine[:3, :3], 2.0 * fine.affine[:3, :3])
    assert isotropic_grid(fine, 1.0) is None
    with pytest.raises(ValueError, match="'spacing' must be > 0"):
        isotropic_grid(fine, 0.0)


def test_field_comes_back_to_the_fixed_grid_in_world_units() -> None:
    """A linear field on the 2 mm grid is, at every fixed voxel, the same displacement in mm."""
    fixed = _volume(np.zeros(SHAPE_3D, np.float32))
    coarse = isotropic_grid(fixed, 2.0)
    assert coarse is not None
    grid = NetworkGrid(fixed, coarse)
    c = np.stack(np.meshgrid(*[np.arange(n) for n in coarse.spatial_shape], indexing="ij"))
    slope = np.array([[0.1, 0.0, -0.05], [0.02, 0.0, 0.0], [0.0, -0.1, 0.03]])
    coarse_field = (
        np.einsum("ab,b...->a...", slope, c) + np.array([0.5, -1.0, 0.25])[:, None, None, None]
    )
    fine = grid.to_fixed(torch.from_numpy(coarse_field[None]).float())[0].double().numpy()
    assert fine.shape == (3, *SHAPE_3D)
    p = np.stack(np.meshgrid(*[np.arange(n) for n in SHAPE_3D], indexing="ij"))
    expected = 2.0 * (
        np.einsum("ab,b...->a...", slope, p / 2.0)
        + np.array([0.5, -1.0, 0.25])[:, None, None, None]
    )
    inside = (slice(None), slice(0, 19), slice(0, 23), slice(0, 27))  # within the last coarse voxel
    np.testing.assert_allclose(fine[inside], expected[inside], atol=1e-4)


def test_a_2mm_model_registers_a_1mm_pair_on_the_fixed_grid() -> None:
    model = tiny_model(3)
    model.config = dataclasses.replace(model.config, spacing=2.0)
    moving = _volume(blob(SHAPE_3D, (9, 12, 13)))
    fixed = _volume(blob(SHAPE_3D, (11, 12, 15)))
    result = register_pair(
        model,
        moving,
        fixed,
        0.5,
        moving_seg=_volume(labels_of(moving.data).astype(np.int32)),
        fixed_seg=_volume(labels_of(fixed.data).astype(np.int32)),
    )
    assert result.disp.shape == (3, *SHAPE_3D) and result.moved.shape == SHAPE_3D
    assert result.moved_seg is not None and result.moved_seg.shape == SHAPE_3D
    assert any("model's 2 mm voxels" in note for note in result.resampled)
    # the same as the network's 2 mm field brought back by hand
    grid = network_grid(model, fixed)
    assert grid is not None
    coarse_model = tiny_model(3)
    moving_c, fixed_c = resample_to(moving, grid.grid), resample_to(fixed, grid.grid)
    coarse = register_pair(coarse_model, moving_c, fixed_c, 0.5)
    assert coarse.disp.shape == (3, 10, 12, 14) and np.abs(coarse.disp).max() > 0.1
    by_hand = grid.to_fixed(torch.from_numpy(coarse.disp[None]))[0].numpy()
    np.testing.assert_allclose(result.disp, by_hand, atol=1e-4)


def test_checkpoint_spacing_and_architecture(tmp_path) -> None:
    model = tiny_model(2)
    path = save_checkpoint(model, tmp_path / "m.pt", train_config={"spacing": 2.0})
    payload = torch.load(path, weights_only=True)
    del payload["model_config"]["spacing"]  # as written before ModelConfig had the field
    assert checkpoint_config(payload).spacing == 2.0
    torch.save(payload, path)
    assert load_checkpoint(path)[0].config.spacing == 2.0
    # the voxel size is not architecture: fine-tuning at another one is allowed
    other = tiny_model(2)
    other.config = dataclasses.replace(other.config, spacing=1.0)
    init_from_model(path, other)
    assert ModelConfig(spacing=2.0).architecture() == ModelConfig().architecture()
    assert "spacing" in to_dict(ModelConfig()) and TrainConfig().spacing == 0.0
    with pytest.raises(ValueError, match="'spacing' must be >= 0"):
        ModelConfig(spacing=-1.0)
