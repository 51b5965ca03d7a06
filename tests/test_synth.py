"""Training by synthesis: pairs from label maps (SynthMorph), mixed with real pairs in train()."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from shared_paths import DATA, needs_data

from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.training.data import MixtureSampler
from hyperreg.training.sources import Scan, find_scans
from hyperreg.training.synth import SynthPairSampler, label_maps_from_scans

SHARED = DATA
SMALL = ModelConfig(enc_channels=(4, 8), dec_channels=(8, 8, 4), hyper_hidden=(8,), int_steps=3)


def _label_map(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Nested boxes with FreeSurfer-like ids, including one above 2000."""
    rng = np.random.default_rng(seed)
    seg = np.zeros(shape, np.int32)
    for label, margin in ((2, 2), (41, 4), (2035, 6)):
        jitter = [margin + int(rng.integers(0, 2)) for _ in shape]
        seg[tuple(slice(m, n - m) for m, n in zip(jitter, shape))] = label
    return seg


@pytest.mark.parametrize("shape", [(40, 48), (20, 24, 16)], ids=["2d", "3d"])
def test_pair_shapes_labels_and_ranges(shape: tuple[int, ...]) -> None:
    maps = [_label_map(shape, seed) for seed in range(3)]
    sampler = SynthPairSampler(maps, len(shape))
    pair = sampler.pair(torch.Generator().manual_seed(0))
    for image in (pair.moving, pair.fixed):
        assert image.shape == (1, *shape) and image.dtype == torch.float32
        assert float(image.min()) == 0.0 and float(image.max()) == 1.0
    source_ids = {0, 2, 41, 2035}
    for seg in (pair.moving_seg, pair.fixed_seg):
        assert seg.shape == (1, *shape) and seg.dtype == torch.int32
        assert set(torch.unique(seg).tolist()) <= source_ids
        assert 2035 in seg  # a deformation moves labels, it does not lose the inner one
    moving, fixed = sampler.sample(3, torch.Generator().manual_seed(1))
    assert moving.shape == fixed.shape == (3, 1, *shape)


def test_same_seed_same_pair_and_seeds_differ() -> None:
    sampler = SynthPairSampler([_label_map((32, 36), s) for s in range(2)], 2)
    a = sampler.pair(torch.Generator().manual_seed(5))
    b = sampler.pair(torch.Generator().manual_seed(5))
    c = sampler.pair(torch.Generator().manual_seed(6))
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a.moving, c.moving) and not torch.equal(a.moving_seg, c.moving_seg)
    # moving and fixed are deformed and coloured independently
    assert not torch.equal(a.moving, a.fixed) and not torch.equal(a.moving_seg, a.fixed_seg)
    # a batch is reproducible from the generator state too
    first = sampler.sample(2, torch.Generator().manual_seed(9))
    second = sampler.sample(2, torch.Generator().manual_seed(9))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_crop_and_bad_input() -> None:
    maps = [_label_map((32, 36), 0)]
    pair = SynthPairSampler(maps, 2, crop=(16, 20)).pair(torch.Generator().manual_seed(0))
    assert pair.moving.shape == (1, 16, 20)
    with pytest.raises(ValueError, match="'label_maps' must not be empty"):
        SynthPairSampler([], 2)
    with pytest.raises(ValueError, match="label maps must be 3D of one shape"):
        SynthPairSampler(maps, 3)
    with pytest.raises(ValueError, match="must be integer"):
        SynthPairSampler([maps[0].astype(np.float32)], 2)
    with pytest.raises(ValueError, match="'crop' must give 2 sizes"):
        SynthPairSampler(maps, 2, crop=(40, 20))


def test_label_maps_from_volumes_for_2d(tmp_path: Path) -> None:
    volume = np.zeros((12, 10, 16), np.float32)
    volume[2:10, 2:8, 2:14] = 2035.0  # float32 ids, as mindboggle stores them
    nib.save(nib.Nifti1Image(volume, np.eye(4)), tmp_path / "s.nii.gz")
    scan = Scan(tmp_path / "s.nii.gz", tmp_path / "s.nii.gz")
    maps = label_maps_from_scans([scan, Scan(tmp_path / "s.nii.gz")], 2, shape=(14, 12))
    assert len(maps) == 3 and all(m.shape == (14, 12) and m.dtype == np.int32 for m in maps)
    assert all(set(np.unique(m).tolist()) == {0, 2035} for m in maps)


def test_mixture_with_real_pairs_keeps_lambda_batch() -> None:
    class Real:
        def sample(self, batch_size: int, generator: torch.Generator):
            zeros = torch.zeros(batch_size, 1, 24, 28)
            return zeros, zeros

    synth = SynthPairSampler([_label_map((24, 28), 0)], 2)
    moving, fixed = MixtureSampler([Real(), synth], [0.5, 0.5]).sample(
        8, torch.Generator().manual_seed(0)
    )
    assert moving.shape == fixed.shape == (8, 1, 24, 28)
    synthetic = moving.flatten(1).amax(1) > 0
    assert 0 < int(synthetic.sum()) < 8


def test_train_synthetic_only_and_mixed(tmp_path: Path) -> None:
    from hyperreg.training.train import train

    data = tmp_path / "data"
    for index in range(3):
        folder = data / f"P{index}"
        folder.mkdir(parents=True)
        seg = _label_map((24, 28), index).astype(np.float32)
        image = seg / 2035.0
        nib.save(nib.Nifti1Image(image, np.eye(4)), folder / "t1.nii.gz")
        nib.save(nib.Nifti1Image(seg, np.eye(4)), folder / "t1_labels.nii.gz")
    for fraction in (1.0, 0.5):
        out = tmp_path / f"run{fraction}"
        config = TrainConfig(
            data=str(data),
            out=str(out),
            synth=fraction,
            steps=2,
            batch_size=2,
            checkpoint_every=2,
            val_lambdas=(0.5,),
            device="cpu",
            model=SMALL,
        )
        train(config, progress=False)
        split = json.loads((out / "split.json").read_text())
        # only the training people's label maps are synthesised from
        assert split["synth"] == {"fraction": fraction, "label_maps": len(split["train"])}
        assert (out / "model.pt").is_file()
    with pytest.raises(ValueError, match="'synth' needs label maps"):
        unlabelled = tmp_path / "flat"
        unlabelled.mkdir()
        for name in ("a", "b", "c"):
            nib.save(
                nib.Nifti1Image(np.random.rand(8, 8).astype(np.float32), np.eye(4)),
                unlabelled / f"{name}.nii.gz",
            )
        train(
            TrainConfig(
                data=str(unlabelled),
                out=str(tmp_path / "x"),
                synth=1.0,
                steps=1,
                device="cpu",
                model=SMALL,
            ),
            progress=False,
        )


@needs_data("mindboggle-trt20-2d")
def test_synthesis_from_shared_dkt_labels() -> None:
    scans = find_scans(SHARED / "mindboggle-trt20-2d", 2)
    maps = label_maps_from_scans(scans[:3], 2)
    ids = set().union(*(np.unique(m).tolist() for m in maps))
    pair = SynthPairSampler(maps, 2).pair(torch.Generator().manual_seed(0))
    assert pair.moving.shape == (1, 216, 291)
    assert set(torch.unique(pair.moving_seg).tolist()) <= ids and max(ids) == 2035
