"""Training sources: layouts, person ids, loading onto a grid, person splits, several sources."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from shared_paths import DATA, needs_data

from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.training.data import MixtureSampler, PairSampler, split_people
from hyperreg.training.sources import (
    Scan,
    find_scans,
    fit_to_shape,
    load_scan,
    scan_shape,
    training_shape,
)

SHARED = DATA
needs_shared = needs_data("mindboggle-trt20-2d")
SMALL = ModelConfig(enc_channels=(4, 8), dec_channels=(8, 8, 4), hyper_hidden=(8,), int_steps=3)


def _save(path: Path, data: np.ndarray, affine: np.ndarray | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, np.eye(4) if affine is None else affine), path)
    return path


def _brain(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """An image in raw units (0-2000) and a float32 label map with ids 0, 10, 2035."""
    rng = np.random.default_rng(seed)
    image = np.zeros(shape, np.float32)
    seg = np.zeros(shape, np.float32)
    inner = tuple(slice(2, n - 2) for n in shape)
    image[inner] = rng.uniform(500, 2000, [n - 4 for n in shape])
    seg[inner] = 10.0
    core = tuple(slice(n // 2 - 2, n // 2 + 2) for n in shape)
    seg[core] = 2035.0
    return image, seg


def _subject_folders(root: Path, people: int, shape=(20, 24), contrasts=("T1", "T2")) -> Path:
    """multicontrast-like: one folder per person with several images and no labels."""
    for index in range(people):
        for contrast in contrasts:
            _save(root / f"S{index + 1}" / f"{contrast}_slice.nii.gz", _brain(shape, index)[0])
    return root


def _labelled_folders(root: Path, people: int, shape=(18, 22)) -> Path:
    """mindboggle-like: one folder per person, image + ``_labels_`` file (float32 ids)."""
    for index in range(people):
        image, seg = _brain(shape, 10 + index)
        name = f"TRT-{index + 1}"
        _save(root / name / f"{name}_slice118.nii.gz", image)
        _save(root / name / f"{name}_DKT31_labels_slice118.nii.gz", seg)
    return root


def test_layouts_and_person_ids(tmp_path: Path) -> None:
    multi = find_scans(_subject_folders(tmp_path / "multi", 3), 2)
    assert [s.person for s in multi] == ["S1", "S1", "S2", "S2", "S3", "S3"]
    assert multi[0].name == "S1/T1_slice" and multi[1].name == "S1/T2_slice"
    assert all(s.seg is None for s in multi)
    folder = tmp_path / "mb" / "TRT-1"
    labelled = _labelled_folders(tmp_path / "mb", 2)
    # a second, unlabelled image of the same person: the label map goes to the best name match
    _save(folder / "TRT-1Slice121.nii.gz", _brain((18, 22), 0)[0])
    scans = find_scans(labelled, 2)
    by_name = {s.name: s for s in scans}
    assert by_name["TRT-1_slice118"].seg.name == "TRT-1_DKT31_labels_slice118.nii.gz"
    assert by_name["TRT-1Slice121"].seg is None and by_name["TRT-1Slice121"].person == "TRT-1"
    flat = tmp_path / "flat"
    for name in ("a", "b"):
        _save(flat / f"{name}.nii.gz", _brain((8, 8), 0)[0])
        _save(flat / f"{name}_seg.nii.gz", _brain((8, 8), 0)[1])
    assert [(s.person, s.seg.name) for s in find_scans(flat, 2)] == [
        ("a", "a_seg.nii.gz"),
        ("b", "b_seg.nii.gz"),
    ]
    listed = tmp_path / "list.csv"
    listed.write_text("image,seg,subject\nflat/a.nii.gz,,P1\nflat/b.nii.gz,flat/b_seg.nii.gz,P1\n")
    assert [s.person for s in find_scans(listed, 2)] == ["P1", "P1"]


def test_load_scan_rounds_float_label_ids_and_keeps_2d(tmp_path: Path) -> None:
    image, seg = _brain((12, 14), 0)
    seg[0, 0], seg[0, 1] = 2034.9999, 2035.0001  # float noise: rounded, never truncated
    scan = Scan(_save(tmp_path / "i.nii.gz", image), _save(tmp_path / "s.nii.gz", seg))
    data, labels = load_scan(scan)
    assert data.shape == labels.shape == (12, 14)  # a 2-dimensional NIfTI loads as 2D
    assert data.dtype == np.float32 and data.min() == 0.0 and data.max() == 1.0
    assert labels.dtype == np.int32 and labels[0, 0] == labels[0, 1] == 2035
    assert set(np.unique(labels)) == {0, 10, 2035}


def test_load_scan_moves_label_map_onto_its_image_grid(tmp_path: Path) -> None:
    """A label map whose header says another grid (as lapirn-3d's image_A seg) is resampled
    through both affines, with a warning, not read voxel for voxel."""
    image = np.zeros((10, 12, 8), np.float32)
    image[2:8, 3:9, 2:6] = 1.0
    seg = np.zeros((10, 12, 8), np.int16)
    seg[:6, :6, 2:6] = 2  # the same box, in a grid shifted by (2, 3, 0) mm
    shifted = np.eye(4)
    shifted[:3, 3] = (2.0, 3.0, 0.0)
    scan = Scan(_save(tmp_path / "i.nii.gz", image), _save(tmp_path / "s.nii.gz", seg, shifted))
    with pytest.warns(UserWarning, match="not on the grid of its image"):
        _, labels = load_scan(scan)
    np.testing.assert_array_equal(labels == 2, image > 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same grid: no warning
        load_scan(Scan(scan.image, _save(tmp_path / "t.nii.gz", seg)))


def test_load_scan_resamples_to_spacing(tmp_path: Path) -> None:
    affine = np.diag([0.5, 0.5, 1.0, 1.0])
    image, seg = _brain((16, 20), 0)
    scan = Scan(
        _save(tmp_path / "i.nii.gz", image, affine), _save(tmp_path / "s.nii.gz", seg, affine)
    )
    data, labels = load_scan(scan, spacing=1.0)
    assert data.shape == labels.shape == (8, 10) == scan_shape(scan, 1.0)
    assert set(np.unique(labels)) <= {0, 10, 2035}
    assert scan_shape(scan) == (16, 20)


def test_fit_to_shape_pads_and_crops_centred() -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4) + 1
    out = fit_to_shape(array, (5, 2))
    assert out.shape == (5, 2) and out.dtype == np.int32
    np.testing.assert_array_equal(out[1:4], array[:, 1:3])
    assert not out[0].any() and not out[4].any()
    stack = fit_to_shape(np.ones((2, 3, 3)), (5, 5), first_axis=1)
    assert stack.shape == (2, 5, 5) and stack.sum() == 18
    with pytest.raises(ValueError, match="'shape' must give 2 sizes"):
        fit_to_shape(array, (5,))


def test_training_shape_is_the_largest_per_axis(tmp_path: Path) -> None:
    a = [Scan(_save(tmp_path / "a.nii.gz", np.ones((10, 30), np.float32)))]
    b = [Scan(_save(tmp_path / "b.nii.gz", np.ones((20, 12, 5), np.float32)))]
    assert training_shape([a, a], 2) == ()
    assert training_shape([a, b], 2, slice_axis=2) == (20, 30)
    with pytest.raises(ValueError, match="needs 3D scans"):
        training_shape([a], 3)


def test_split_people_holdout_and_seed() -> None:
    people = [f"P{i}" for i in range(12)]
    split = split_people(people, 3, holdout=["P1", "P7"], test_fraction=0.1)
    assert split["val"] == ["P1", "P7"] and len(split["test"]) == 1
    assert not set(split["train"]) & set(split["val"] + split["test"])
    assert sorted(split["train"] + split["val"] + split["test"]) == sorted(people)
    assert split == split_people(people[::-1], 3, holdout=["P7", "P1"], test_fraction=0.1)
    assert split_people(people, 3)["val"] != split_people(people, 4)["val"]
    assert split_people(people, 0, holdout=["P1"], test_fraction=0.0)["test"] == []
    with pytest.raises(ValueError, match="'holdout' names people not in the data: \\['X'\\]"):
        split_people(people, 0, holdout=["X"])


def test_pair_sampler_fits_scans_of_other_sizes(tmp_path: Path) -> None:
    scans = [
        Scan(_save(tmp_path / f"{i}.nii.gz", _brain(shape, i)[0]))
        for i, shape in enumerate([(10, 14), (16, 12)])
    ]
    with pytest.raises(ValueError, match="share one grid shape"):
        PairSampler(scans, 2)
    sampler = PairSampler(scans, 2, shape=(16, 14))
    moving, fixed = sampler.sample(3, torch.Generator().manual_seed(0))
    assert moving.shape == fixed.shape == (3, 1, 16, 14)


def test_mixture_sampler_keeps_the_batch_layout() -> None:
    class Constant:
        def __init__(self, value: float) -> None:
            self.value = value

        def sample(self, batch_size: int, generator: torch.Generator):
            full = torch.full((batch_size, 1, 4, 5), self.value)
            return full, full + 1

    mixture = MixtureSampler([Constant(0.0), Constant(10.0)], [3.0, 1.0])
    moving, fixed = mixture.sample(400, torch.Generator().manual_seed(0))
    assert moving.shape == fixed.shape == (400, 1, 4, 5)
    torch.testing.assert_close(fixed, moving + 1)
    share = float((moving[:, 0, 0, 0] == 10.0).float().mean())
    assert 0.18 < share < 0.32  # weight 1 of 4
    again = mixture.sample(400, torch.Generator().manual_seed(0))[0]
    assert torch.equal(again, moving)
    with pytest.raises(ValueError, match="'weights' must be >= 0"):
        MixtureSampler([Constant(0.0)], [0.0])


def test_train_on_several_sources_splits_by_person(tmp_path: Path) -> None:
    multi = _subject_folders(tmp_path / "multi", 4)
    labelled = _labelled_folders(tmp_path / "mb", 4)
    config = TrainConfig(
        data=(str(multi), str(labelled)),
        out=str(tmp_path / "run"),
        holdout=("S2", "TRT-3"),
        test_fraction=0.0,
        steps=2,
        batch_size=2,
        checkpoint_every=2,
        val_lambdas=(0.5,),
        device="cpu",
        model=SMALL,
    )
    from hyperreg.training.train import train

    train(config, progress=False)
    split = json.loads((tmp_path / "run" / "split.json").read_text())
    assert split["val"] == ["S2", "TRT-3"] and split["mode"] == "subjects"
    assert split["shape"] == [20, 24]  # the larger source's grid; the other is padded
    multi_record = split["sources"][0]
    # T1 and T2 of one person stay together
    assert multi_record["val"] == ["S2/T1_slice", "S2/T2_slice"]
    assert not any(name.startswith("S2/") for name in multi_record["train"])
    names = split["val_pairs"]
    assert any("TRT-3" in name for name in names) and any("S2/" in name for name in names)
    assert not any("->" in n and n.split("->")[0].startswith("S1/") for n in names)
    row = (tmp_path / "run" / "val_log.csv").read_text().splitlines()[1].split(",")
    assert row[2] != "nan"  # Dice from the labelled source's held-out person


@needs_shared
def test_shared_people_and_label_ids() -> None:
    mindboggle = find_scans(SHARED / "mindboggle-trt20-2d", 2)
    assert len({s.person for s in mindboggle}) == 10 and len(mindboggle) == 11
    labelled = [s for s in mindboggle if s.seg is not None]
    assert len(labelled) == 10
    image, seg = load_scan(labelled[0])
    assert image.shape == seg.shape == (216, 291) and float(image.max()) == 1.0
    assert seg.max() == 2035 and {1035, 2035} <= set(np.unique(seg).tolist())
    multi = find_scans(SHARED / "multicontrast-2d", 2)
    assert len(multi) == 16 and len({s.person for s in multi}) == 8
    assert scan_shape(multi[0], 1.0) == (150, 240)  # 0.75 mm -> 1 mm


@needs_shared
def test_shared_lapirn_label_map_header_is_honoured() -> None:
    scan = next(s for s in find_scans(SHARED / "lapirn-3d", 3) if s.name.startswith("image_A"))
    with pytest.warns(UserWarning, match="not on the grid of its image"):
        image, seg = load_scan(scan)
    # through both headers the label map's brain box matches the image's exactly
    for axis in range(3):
        other = tuple(a for a in range(3) if a != axis)
        image_rows = np.flatnonzero((image > 0.01).any(axis=other))
        seg_rows = np.flatnonzero((seg > 0).any(axis=other))
        assert (image_rows.min(), image_rows.max()) == (seg_rows.min(), seg_rows.max())
