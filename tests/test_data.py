"""Scan discovery, normalisation, pair and λ sampling."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from shared_paths import OASIS
from hyperreg.geometry.intensity import normalize_intensity
from hyperreg.training.data import (
    LambdaSampler,
    PairSampler,
    find_scans,
    split_subjects,
    validation_pairs,
)

needs_oasis = pytest.mark.skipif(
    not OASIS.is_dir(), reason=f"shared OASIS data not found at {OASIS}"
)


def _save(path: Path, data: np.ndarray) -> Path:
    nib.save(nib.Nifti1Image(data, np.eye(4)), path)
    return path


def test_normalize_minmax_and_uint8_matches_float() -> None:
    data = np.linspace(0.2, 0.8, 60, dtype=np.float32).reshape(6, 10)
    out = normalize_intensity(data)
    assert out.dtype == np.float32 and out.min() == 0.0 and out.max() == 1.0
    as_uint8 = np.round(out * 255).astype(np.uint8)
    np.testing.assert_allclose(normalize_intensity(as_uint8), out, atol=1 / 255)
    np.testing.assert_array_equal(normalize_intensity(np.full((3, 3), 7.0)), np.zeros((3, 3)))
    np.testing.assert_array_equal(normalize_intensity(data, "none"), data)
    with pytest.raises(ValueError, match="'method' must be one of"):
        normalize_intensity(data, "zscore")


def test_find_scans_folder_and_csv(tmp_path: Path) -> None:
    for name in ("b.nii.gz", "a.nii", "a_seg.nii.gz", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    scans = find_scans(tmp_path, 2)
    assert [s.image.name for s in scans] == ["a.nii", "b.nii.gz"]
    assert scans[0].name == "a"
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("image,seg\na.nii,a_seg.nii.gz\nb.nii.gz,\n")
    listed = find_scans(csv_path, 2)
    assert listed[0].seg == tmp_path / "a_seg.nii.gz" and listed[1].seg is None
    with pytest.raises(FileNotFoundError, match="no such file"):
        find_scans(tmp_path / "missing", 2)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no scans found"):
        find_scans(empty, 2)
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("path\na.nii\n")
    with pytest.raises(ValueError, match="'image' column"):
        find_scans(bad_csv, 2)


@needs_oasis
def test_find_scans_neurite_oasis_prefers_volumes() -> None:
    scans = find_scans(OASIS, 2)
    assert [s.name for s in scans] == ["OASIS_OAS1_0001_MR1", "OASIS_OAS1_0002_MR1"]
    assert all(s.image.name == "aligned_norm.nii.gz" for s in scans)
    assert all(s.seg is not None and s.seg.name == "aligned_seg35.nii.gz" for s in scans)


def test_pair_sampler_cuts_slices_from_volumes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    paths = []
    for index in range(2):
        vol = np.zeros((12, 10, 8), np.float32)
        vol[2:10, 2:8, 2:6] = rng.uniform(0.5, 1.0, (8, 6, 4)) + index
        paths.append(_save(tmp_path / f"s{index}.nii.gz", vol))
    sampler = PairSampler(find_scans(tmp_path, 2), ndim=2, slice_axis=2)
    assert sampler.spatial_shape == (12, 10)
    assert set(sampler.slices.tolist()) <= {2, 3, 4, 5}
    moving, fixed = sampler.sample(5, torch.Generator().manual_seed(0))
    assert moving.shape == fixed.shape == (5, 1, 12, 10)
    assert moving.dtype == torch.float32 and 0 <= float(moving.min()) and float(moving.max()) <= 1
    # subject to subject: moving and fixed never come from the same scan
    assert not any(torch.equal(m, f) for m, f in zip(moving, fixed))
    again = sampler.sample(5, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], moving)


def test_pair_sampler_rejects_mixed_shapes(tmp_path: Path) -> None:
    _save(tmp_path / "a.nii.gz", np.ones((8, 8, 8), np.float32))
    _save(tmp_path / "b.nii.gz", np.ones((8, 9, 8), np.float32))
    with pytest.raises(ValueError, match="share one grid shape"):
        PairSampler(find_scans(tmp_path, 3), ndim=3)


def test_lambda_sampler_range_and_endpoints() -> None:
    lam = LambdaSampler(0.2).sample(20000, torch.Generator().manual_seed(1))
    assert lam.shape == (20000,) and float(lam.min()) >= 0 and float(lam.max()) <= 1
    endpoints = ((lam == 0) | (lam == 1)).float().mean()
    assert abs(float(endpoints) - 0.2) < 0.02
    assert abs(float((lam == 0).float().mean() - (lam == 1).float().mean())) < 0.02
    assert float(LambdaSampler(0.0).sample(1000, torch.Generator()).eq(0).float().mean()) < 0.01
    with pytest.raises(ValueError, match="'endpoint_fraction' must lie in"):
        LambdaSampler(1.5)


def _oasis_folder(root: Path, count: int, shape=(12, 10, 8)) -> Path:
    """``count`` tiny subjects in the neurite-oasis layout, with label maps."""
    rng = np.random.default_rng(1)
    for index in range(count):
        folder = root / f"OASIS_OAS1_{index + 1:04d}_MR1"
        folder.mkdir(parents=True)
        vol = np.zeros(shape, np.float32)
        vol[2:10, 2:8, 1:7] = rng.uniform(0.5, 1.0, (8, 6, 6))
        seg = np.zeros(shape, np.uint8)
        seg[2:6, 2:8, 1:7] = 1
        seg[6:10, 2:8, 1:7] = 2
        _save(folder / "aligned_norm.nii.gz", vol)
        _save(folder / "aligned_seg35.nii.gz", seg)
    return root


def test_split_subjects_is_reproducible_and_disjoint() -> None:
    names = [f"s{i:03d}" for i in range(20)]
    split = split_subjects(names, seed=4, val_fraction=0.1, test_fraction=0.2)
    assert (len(split["train"]), len(split["val"]), len(split["test"])) == (14, 2, 4)
    assert sorted(split["train"] + split["val"] + split["test"]) == names
    assert split == split_subjects(list(reversed(names)), seed=4, test_fraction=0.2)
    assert split != split_subjects(names, seed=5, test_fraction=0.2)
    # small sets keep min_train subjects for training; the test set shrinks first
    small = split_subjects(["a", "b", "c"], 0)
    assert (len(small["train"]), len(small["val"]), small["test"]) == (2, 1, [])
    assert split_subjects(["a", "b"], 0)["val"] == []
    assert len(split_subjects(["a", "b"], 0, min_train=1)["val"]) == 1
    with pytest.raises(ValueError, match="'val_fraction' must lie in"):
        split_subjects(names, 0, val_fraction=1.0)


def test_holdout_slices_and_validation_pairs(tmp_path: Path) -> None:
    scans = find_scans(_oasis_folder(tmp_path, 2), 2)
    sampler = PairSampler(scans, ndim=2, holdout_every=2)
    held = sampler.heldout_slices
    assert held is not None and len(held) > 0
    assert not set(held.tolist()) & set(sampler.slices.tolist())
    pairs = validation_pairs([(scans[1], scans[0])], 2, slices=held, max_pairs=16)
    assert [p.name for p in pairs] == [
        f"OASIS_OAS1_0002_MR1->OASIS_OAS1_0001_MR1@{i}" for i in held.tolist()
    ]
    assert pairs[0].moving.shape == (12, 10) and pairs[0].fixed_seg.dtype == np.int32
    assert float(pairs[0].moving.max()) <= 1.0
    assert len(validation_pairs([(scans[1], scans[0])], 2, slice_every=1, max_pairs=3)) == 3
    volumes = validation_pairs([(scans[1], scans[0])], 3)
    assert len(volumes) == 1 and volumes[0].moving.shape == (12, 10, 8)


def test_pair_sampler_random_crop(tmp_path: Path) -> None:
    scans = find_scans(_oasis_folder(tmp_path, 2), 3)
    sampler = PairSampler(scans, ndim=3, crop=(8, 8, 4))
    moving, fixed = sampler.sample(3, torch.Generator().manual_seed(0))
    assert moving.shape == fixed.shape == (3, 1, 8, 8, 4)
    with pytest.raises(ValueError, match="'crop' must give 3 sizes"):
        PairSampler(scans, ndim=3, crop=(20, 8, 4))


def test_pair_sampler_3d_batches_are_the_scans_in_c_order(tmp_path: Path) -> None:
    """Scans load in NIfTI's Fortran order; the sampler keeps C-ordered copies, so a 3D batch is
    a plain copy of the normalised volumes (same values, axis order kept, contiguous)."""
    rng = np.random.default_rng(1)
    volumes = []
    for index in range(2):
        vol = rng.uniform(0, 1, (12, 10, 8)).astype(np.float32)
        vol[0, 0, 0], vol[-1, -1, -1] = 0.0, 1.0  # min-max normalisation leaves it unchanged
        volumes.append(vol)
        _save(tmp_path / f"s{index}.nii.gz", vol)
    sampler = PairSampler(find_scans(tmp_path, 3), ndim=3)
    assert all(v.flags["C_CONTIGUOUS"] for v in sampler.volumes)
    moving, fixed = sampler.sample(4, torch.Generator().manual_seed(0))
    assert moving.shape == (4, 1, 12, 10, 8) and moving.is_contiguous()
    for image in (*moving, *fixed):
        assert any(np.allclose(image[0].numpy(), vol, atol=1e-6) for vol in volumes)
