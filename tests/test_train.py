"""Training: per-sample λ loss, a convergence smoke test, and the real-data acceptance run."""

from __future__ import annotations

import csv
import dataclasses
import json
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from shared_paths import OASIS as SHARED
from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.method.losses import gradient_loss, mse_loss, ncc_loss
from hyperreg.method.metrics import folding_fraction
from hyperreg.method.model import HyperMorph, RegistrationOutput, load_checkpoint, save_checkpoint
from hyperreg.training.train import hypermorph_loss, train

SMALL = ModelConfig(ndim=2, enc_channels=(8, 8, 8, 8), dec_channels=(8,) * 7, hyper_hidden=(16, 16))


class BlobPairs:
    """Gaussian blobs at random positions: a pair is two shifted copies of one blob."""

    def __init__(self, size: int = 32) -> None:
        self.size = size

    def _blob(self, centres: torch.Tensor) -> torch.Tensor:
        axis = torch.arange(self.size, dtype=torch.float32)
        ii, jj = torch.meshgrid(axis, axis, indexing="ij")
        d2 = (ii - centres[:, 0, None, None]) ** 2 + (jj - centres[:, 1, None, None]) ** 2
        return torch.exp(-d2 / (2 * 5.0**2))[:, None]

    def sample(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        centre = 12 + 8 * torch.rand(batch_size, 2, generator=generator)
        shift = 3 * (torch.rand(batch_size, 2, generator=generator) - 0.5) * 2
        return self._blob(centre + shift), self._blob(centre)


def test_each_sample_uses_its_own_lambda() -> None:
    config = TrainConfig(sim="ncc")
    torch.manual_seed(0)
    moved = torch.rand(2, 1, 16, 16)
    fixed = torch.rand(2, 1, 16, 16)
    velocity = torch.randn(2, 2, 8, 8)
    out = RegistrationOutput(moved, torch.zeros(2, 2, 16, 16), velocity)
    lam = torch.tensor([0.0, 1.0])
    loss, sim, _ = hypermorph_loss(out, fixed, lam, config)
    expected_sim = ncc_loss(moved, fixed, reduction="none")
    # the 8x8 velocity is at half the 16x16 resolution: VoxelMorph's loss_mult = int_downsize
    expected_smooth = config.model.int_downsize * gradient_loss(velocity, reduction="none")
    torch.testing.assert_close(sim, expected_sim)
    # sample 0 (λ=0) contributes only similarity, sample 1 (λ=1) only smoothness
    torch.testing.assert_close(loss, (expected_sim[0] + expected_smooth[1]) / 2)


def test_convergence_smoke(tmp_path: Path) -> None:
    """80 steps on tiny blob pairs: the loss falls, low λ aligns better than none, no folding."""
    pairs = BlobPairs()
    config = TrainConfig(
        out=str(tmp_path),
        steps=80,
        batch_size=4,
        lr=1e-3,  # the default: at 1e-2 a plain fixed-weight U-Net does not converge here either
        sim="mse",
        checkpoint_every=1000,
        seed=0,
        device="cpu",
        model=SMALL,
    )
    path = train(config, pairs=pairs, progress=False)
    with (tmp_path / "train_log.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 80
    first = np.mean([float(r["loss"]) for r in rows[:20]])
    last = np.mean([float(r["loss"]) for r in rows[-20:]])
    assert last < first, (first, last)
    model, payload = load_checkpoint(path)
    assert payload["step"] == 80 and payload["train_config"]["steps"] == 80
    moving, fixed = pairs.sample(8, torch.Generator().manual_seed(123))
    before = float(mse_loss(moving, fixed))
    with torch.no_grad():
        low = model(moving, fixed, 0.0)
        high = model(moving, fixed, 1.0)
    assert float(mse_loss(low.moved, fixed)) < 0.8 * before
    # λ = 1 weighs only smoothness: its field is smaller than the λ = 0 one
    assert float(high.disp.abs().mean()) < float(low.disp.abs().mean())
    assert folding_fraction(low.disp) < 0.01


def test_train_rejects_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'sim' must be one of"):
        train(TrainConfig(out=str(tmp_path), sim="mi", model=SMALL), pairs=BlobPairs())
    with pytest.raises(ValueError, match="'steps' must be >= 1"):
        train(TrainConfig(out=str(tmp_path), steps=0, model=SMALL), pairs=BlobPairs())


def test_training_is_reproducible_from_seed(tmp_path: Path) -> None:
    results = []
    for run in ("a", "b"):
        config = TrainConfig(
            out=str(tmp_path / run), steps=3, batch_size=2, seed=7, device="cpu", model=SMALL
        )
        model, _ = load_checkpoint(train(config, pairs=BlobPairs(), progress=False))
        results.append(model.state_dict())
    for key in results[0]:
        torch.testing.assert_close(results[0][key], results[1][key], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared OASIS data not found at {SHARED}")
def test_oasis_2d_acceptance(tmp_path: Path) -> None:
    """Issue 2's acceptance run: default 2D training, 1500 steps, then the shared slice pair."""
    torch.set_num_threads(os.cpu_count() or 1)  # a real run, not a tiny-tensor test
    from hyperreg.registration.lambdas import register_pair
    from hyperreg.geometry.io import load_volume
    from hyperreg.method.metrics import mean_dice

    config = TrainConfig(
        data=str(SHARED), out=str(tmp_path), steps=1500, device="cpu", model=ModelConfig(ndim=2)
    )
    model, _ = load_checkpoint(train(config, progress=False))
    moving = load_volume(SHARED / "OASIS_OAS1_0002_MR1/slice_norm.nii.gz")
    fixed = load_volume(SHARED / "OASIS_OAS1_0001_MR1/slice_norm.nii.gz")
    moving_seg = load_volume(SHARED / "OASIS_OAS1_0002_MR1/slice_seg24.nii.gz", label=True)
    fixed_seg = load_volume(SHARED / "OASIS_OAS1_0001_MR1/slice_seg24.nii.gz", label=True)
    labels = sorted(set(np.unique(moving_seg.data)) & set(np.unique(fixed_seg.data)) - {0})
    before = mean_dice(moving_seg.data, fixed_seg.data, labels)
    folding = []
    for lam in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9, 1.0):
        result = register_pair(
            model, moving, fixed, lam, moving_seg=moving_seg, fixed_seg=fixed_seg
        )
        assert result.moved.shape == fixed.spatial_shape
        if lam <= 0.5:
            assert mean_dice(result.moved_seg, fixed_seg.data, labels) >= before + 0.05, lam
        folding.append(result.folding_fraction)
    assert all(b <= a + 1e-4 for a, b in itertools.pairwise(folding)), folding


def _blob_val_pairs(count: int = 3) -> list:
    from hyperreg.training.data import ValidationPair

    moving, fixed = BlobPairs().sample(count, torch.Generator().manual_seed(99))
    pairs = []
    for index in range(count):
        m, f = moving[index, 0].numpy(), fixed[index, 0].numpy()
        seg = [(a > 0.5).astype(np.int32) for a in (m, f)]
        pairs.append(ValidationPair(f"blob{index}", m, f, *seg))
    return pairs


def test_validation_log_and_best_checkpoint(tmp_path: Path) -> None:
    config = TrainConfig(
        out=str(tmp_path),
        steps=12,
        batch_size=4,
        lr=1e-2,
        sim="mse",
        checkpoint_every=4,
        val_every=4,
        seed=0,
        device="cpu",
        model=SMALL,
    )
    train(config, pairs=BlobPairs(), progress=False, val_pairs=_blob_val_pairs())
    with (tmp_path / "val_log.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == [4, 8, 12]
    assert {"dice_0.1", "folding_pct_0.5", "similarity_0.9", "mean_dice"} <= set(rows[0])
    losses = [float(rows[0][f"loss_{lam}"]) for lam in ("0.1", "0.5", "0.9")]
    assert float(rows[0]["val_loss"]) == pytest.approx(np.mean(losses), rel=1e-4)
    best_row = max(rows, key=lambda r: float(r["score"]))
    _, payload = load_checkpoint(tmp_path / "best.pt")
    assert payload["step"] == int(best_row["step"])
    assert payload["validation"]["mean_dice"] == pytest.approx(float(best_row["mean_dice"]))


def test_neurite_oasis_subject_split_validates_by_default(tmp_path: Path) -> None:
    from test_data import _oasis_folder

    data = _oasis_folder(tmp_path / "data", 5)
    config = TrainConfig(
        data=str(data),
        out=str(tmp_path / "run"),
        steps=2,
        batch_size=2,
        checkpoint_every=2,
        device="cpu",
        model=SMALL,
    )
    train(config, progress=False)
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    assert split["mode"] == "subjects"
    assert (len(split["train"]), len(split["val"]), len(split["test"])) == (3, 1, 1)
    assert not set(split["val"]) & set(split["train"])
    assert all(name.startswith(split["val"][0]) for name in split["val_pairs"])
    assert len((tmp_path / "run" / "val_log.csv").read_text().splitlines()) == 2
    assert (tmp_path / "run" / "best.pt").is_file()


def test_atlas_folder_3d_with_crop(tmp_path: Path) -> None:
    """IXI-style: a flat folder of NIfTI volumes (no label maps) registered to an atlas."""
    import nibabel as nib

    rng = np.random.default_rng(0)
    data = tmp_path / "ixi"
    data.mkdir()
    for name in ("IXI002", "IXI012", "IXI013", "IXI014"):
        vol = rng.uniform(0, 1, (12, 10, 8)).astype(np.float32)
        nib.save(nib.Nifti1Image(vol, np.eye(4)), data / f"{name}-T1.nii.gz")
    atlas = tmp_path / "atlas.nii.gz"
    nib.save(nib.Nifti1Image(rng.uniform(0, 1, (12, 10, 8)).astype(np.float32), np.eye(4)), atlas)
    model = ModelConfig(**{**SMALL.__dict__, "ndim": 3})
    config = TrainConfig(
        data=str(data),
        out=str(tmp_path / "run"),
        atlas=str(atlas),
        steps=2,
        batch_size=1,
        checkpoint_every=2,
        crop=(8, 8, 8),
        device="cpu",
        model=model,
    )
    train(config, progress=False)
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    assert split["mode"] == "subjects" and len(split["train"]) == 2
    assert all(name.endswith("->atlas") for name in split["val_pairs"])
    with (tmp_path / "run" / "val_log.csv").open() as handle:
        row = next(csv.DictReader(handle))
    # no label maps: Dice is undefined and the best checkpoint goes by the similarity loss
    assert row["mean_dice"] == "nan"
    sims = [float(row[f"similarity_{lam}"]) for lam in ("0.1", "0.5", "0.9")]
    assert float(row["score"]) == pytest.approx(-np.mean(sims), rel=1e-4)


@pytest.mark.parametrize(("ndim", "lr"), [(2, 1e-3), (3, 1e-4)])
def test_default_lr_is_resolved_per_dimension_and_recorded(tmp_path: Path, ndim: int, lr: float):
    """TrainConfig(lr=0), the default, trains at DEFAULT_LR[ndim]; config.json records it."""
    small = ModelConfig(ndim=ndim, enc_channels=(4, 4, 4, 4), dec_channels=(4,) * 7,
                        hyper_hidden=(8,))
    shape = (16,) * ndim

    class Pairs:
        def sample(self, batch_size, generator):
            return torch.rand(batch_size, 1, *shape, generator=generator), torch.rand(
                batch_size, 1, *shape, generator=generator
            )

    assert TrainConfig().lr == 0.0
    assert TrainConfig(model=small).resolved().lr == lr
    config = TrainConfig(out=str(tmp_path), steps=1, batch_size=1, model=small, device="cpu")
    train(config, pairs=Pairs(), progress=False)
    assert json.loads((tmp_path / "config.json").read_text())["lr"] == lr


def test_fine_tuning_keeps_the_models_voxel_size(tmp_path: Path) -> None:
    """train --init of a model working at 1 mm fine-tunes at 1 mm (it was reset to 0 before)."""
    base = HyperMorph(dataclasses.replace(SMALL, spacing=1.0))
    init = save_checkpoint(base, tmp_path / "base.pt")
    config = TrainConfig(out=str(tmp_path / "tuned"), steps=1, batch_size=1, init=str(init),
                         checkpoint_every=1, model=SMALL)
    final = train(config, BlobPairs(), progress=False)
    model, payload = load_checkpoint(final)
    assert model.config.spacing == 1.0
    assert payload["train_config"]["spacing"] == 1.0
    assert payload["train_config"]["init"] == str(init)
