"""Label maps told from images wherever a folder of scans is read (training ``--data``).

By name (``seg``, ``label``, ``parc``, ``DLMUSE``...) or else by content (integer ids, few of
them, piecewise constant); each label map pairs with its own person's image and is never an
image itself. Tiny synthetic NIfTIs in tmp_path, plus the shared ``ixi-2mm`` folder (skipped
without it).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from shared_paths import DATA, needs_data

from hyperreg.config import TrainConfig
from hyperreg.training.prepare import split_data
from hyperreg.training.sources import find_scans, is_label_map, label_map_scans

SHAPE = (20, 22, 18)


def _save(path: Path, data: np.ndarray, intent: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(data, np.eye(4))
    if intent is not None:
        img.header.set_intent(intent)
    nib.save(img, path)
    return path


def _image(seed: int) -> np.ndarray:
    """A head-like image in raw float units: smooth-ish, not integer-valued."""
    rng = np.random.default_rng(seed)
    image = np.zeros(SHAPE, np.float64)
    image[2:-2, 2:-2, 2:-2] = rng.uniform(100.0, 2000.0, [n - 4 for n in SHAPE])
    return image


MUSE_IDS = (4, 11, 23, 30, 35, 47, 52, 207)  # ids as in a MUSE parcellation (up to 207)


def _parcellation(seed: int) -> np.ndarray:
    """A MUSE-like parcellation: the same few integer ids for everyone, in blocks placed a
    little differently per person (uint8, piecewise constant)."""
    seg = np.zeros(SHAPE, np.uint8)
    shift = seed % 2
    for index, label in enumerate(MUSE_IDS):
        seg[2 + shift + 2 * index : 4 + shift + 2 * index, 3:-3, 3:-3] = label
    return seg


def _ixi_like(folder: Path, people: int = 4, unnamed: int = 1) -> Path:
    """``<ID>_T1`` images with ``<ID>_DLMUSE`` label maps; the last ``unnamed`` people's label
    maps carry a name that says nothing (``<ID>_regions``): only their content tells."""
    for index in range(people):
        person = f"IXI{index:03d}-HH-{1000 + index}"
        _save(folder / f"{person}_T1.nii.gz", _image(index))
        suffix = "regions" if index >= people - unnamed else "DLMUSE"
        _save(folder / f"{person}_{suffix}.nii.gz", _parcellation(index))
    return folder


def test_label_maps_pair_with_their_image_by_name_and_by_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _ixi_like(tmp_path / "ixi", people=4, unnamed=1)
    with caplog.at_level(logging.INFO, logger="hyperreg.training.sources"):
        scans = find_scans(folder, 3)
    assert [s.image.name for s in scans] == [
        f"IXI{i:03d}-HH-{1000 + i}_T1.nii.gz" for i in range(4)
    ]
    for scan in scans:  # each with its own person's label map
        assert scan.seg is not None
        assert scan.seg.name.split("_")[0] == scan.image.name.split("_")[0]
    assert scans[3].seg.name == "IXI003-HH-1003_regions.nii.gz"  # known by content only
    lines = [
        r.getMessage() for r in caplog.records if "paired with their label map" in r.getMessage()
    ]
    assert len(lines) == 1
    assert "4 images, 4 paired" in lines[0] and "'IXI003-HH-1003_regions.nii.gz'" in lines[0]
    assert "DLMUSE" not in lines[0]  # those are known by name: no content read, not listed


def test_a_person_without_a_label_map_stays_an_image(tmp_path: Path) -> None:
    folder = _ixi_like(tmp_path / "ixi", people=3, unnamed=0)
    _save(folder / "IXI015-HH-1258_T1.nii.gz", _image(15))  # no label map, as in ixi-2mm
    scans = find_scans(folder, 3)
    assert len(scans) == 4 and {s.image.name.split("_")[1] for s in scans} == {"T1.nii.gz"}
    assert [s.seg is None for s in scans] == [False, False, False, True]


def test_split_never_lists_a_label_map_as_a_person(tmp_path: Path) -> None:
    folder = _ixi_like(tmp_path / "ixi", people=5, unnamed=2)
    config = TrainConfig(data=(str(folder),), out=str(tmp_path / "run"), test_fraction=0.0)
    split = split_data(config)
    assert len(split.people) == 5
    names = [n for source in split.record["sources"] for k in ("train", "val") for n in source[k]]
    assert sorted(names) == sorted(f"IXI{i:03d}-HH-{1000 + i}_T1" for i in range(5))


def test_is_label_map_by_name_header_and_content(tmp_path: Path) -> None:
    image = _save(tmp_path / "a.nii.gz", _image(0))
    labels = _save(tmp_path / "b.nii.gz", _parcellation(0).astype(np.float32))  # float ids
    intent = _save(tmp_path / "c.nii.gz", _image(1), intent="label")  # the header says so
    named = _save(tmp_path / "d_aseg.nii.gz", _image(2))  # the name says so (not read)
    rounded = _save(tmp_path / "e.nii.gz", np.rint(_image(3)).astype(np.int16))  # integer image
    assert not is_label_map(image) and is_label_map(labels)
    assert is_label_map(intent) and is_label_map(named)
    assert not is_label_map(rounded)  # integer-valued but not piecewise constant
    data = np.zeros((20, 22, 40), np.uint8)
    data[4:16, 4:18, 10:30] = 7  # a mask; judged on its 16 central slices
    assert is_label_map(_save(tmp_path / "f.nii.gz", data))
    assert not is_label_map(_save(tmp_path / "g.nii.gz", np.zeros(SHAPE, np.float32)))  # constant


def test_a_folder_of_label_maps_feeds_synthesis_whatever_their_names(tmp_path: Path) -> None:
    for index in range(3):
        _save(tmp_path / "maps" / f"subject{index}.nii.gz", _parcellation(index))
    scans = label_map_scans(tmp_path / "maps", 3)
    assert len(scans) == 3 and all(s.image == s.seg for s in scans)


def test_a_csv_image_that_is_a_label_map_is_an_error(tmp_path: Path) -> None:
    folder = _ixi_like(tmp_path / "ixi", people=2, unnamed=1)
    listed = tmp_path / "list.csv"
    listed.write_text(
        "image,seg\nixi/IXI000-HH-1000_T1.nii.gz,ixi/IXI000-HH-1000_DLMUSE.nii.gz\n"
        "ixi/IXI001-HH-1001_regions.nii.gz,\n"
    )
    with pytest.raises(ValueError, match=r"line 3: image .*IXI001-HH-1001_regions.* label map"):
        find_scans(listed, 3)
    assert folder.is_dir()


@needs_data("ixi-2mm")
def test_ixi_2mm_images_pair_with_their_dlmuse_maps() -> None:
    started = time.perf_counter()
    scans = find_scans(DATA / "ixi-2mm", 3)
    seconds = time.perf_counter() - started
    assert len(scans) == 30  # thirty people, each once
    assert all(s.image.name.endswith("_T1.nii.gz") for s in scans)
    labelled = [s for s in scans if s.seg is not None]
    assert len(labelled) == 29  # IXI015-HH-1258 has none (the data README, section 9)
    for scan in labelled:
        assert scan.seg.name == scan.image.name.replace("_T1.", "_DLMUSE.")
    people = {s.person for s in scans}
    assert len(people) == 30 and not any("DLMUSE" in p for p in people)
    # the content of the 30 T1 images is read (their names say nothing): a bound, not a figure
    assert seconds < 60, seconds


def _train_2d(folder: Path, out: Path) -> dict:
    from hyperreg.config import ModelConfig
    from hyperreg.training.train import train

    small = ModelConfig(enc_channels=(4, 8), dec_channels=(8, 8, 4), hyper_hidden=(8,), int_steps=3)
    config = TrainConfig(
        data=(str(folder),),
        out=str(out),
        holdout=("IXI000-HH-1000_T1", "IXI001-HH-1001_T1"),
        test_fraction=0.0,
        steps=2,
        batch_size=2,
        checkpoint_every=2,
        val_lambdas=(0.5,),
        device="cpu",
        model=small,
    )
    train(config, progress=False)
    return json.loads((out / "split.json").read_text())


def test_training_pairs_label_maps_and_validates_with_dice(tmp_path: Path) -> None:
    folder = tmp_path / "ixi2d"
    for index in range(5):
        person = f"IXI{index:03d}-HH-{1000 + index}"
        _save(folder / f"{person}_T1.nii.gz", _image(index)[:, :, 9].astype(np.float32))
        suffix = "regions" if index == 4 else "DLMUSE"  # the last one known by content only
        _save(folder / f"{person}_{suffix}.nii.gz", _parcellation(index)[:, :, 9])
    split = _train_2d(folder, tmp_path / "run")
    listed = " ".join(json.dumps(split["sources"]) + json.dumps(split["val_pairs"]))
    assert "DLMUSE" not in listed and "regions" not in listed  # never a person, never an image
    assert sorted(split["train"] + split["val"]) == [
        f"IXI{i:03d}-HH-{1000 + i}_T1" for i in range(5)
    ]
    row = (tmp_path / "run" / "val_log.csv").read_text().splitlines()[1].split(",")
    assert row[2] != "nan" and 0.0 <= float(row[2]) <= 1.0  # Dice from the paired label maps


def test_a_validation_without_dice_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "images"
    for index in range(5):
        _save(folder / f"IXI{index:03d}-HH-{1000 + index}_T1.nii.gz", _image(index)[:, :, 9])
    with caplog.at_level(logging.INFO):
        _train_2d(folder, tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if "validation has no Dice" in r.getMessage()]
    assert said and "none of the 1 validation pairs has a label map on both sides" in said[0]
    assert not any("mean Dice nan" in r.getMessage() for r in caplog.records)


def test_a_validation_whose_label_maps_share_no_id_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "mixed"
    for index in range(5):
        person = f"IXI{index:03d}-HH-{1000 + index}"
        _save(folder / f"{person}_T1.nii.gz", _image(index)[:, :, 9].astype(np.float32))
        seg = _parcellation(index)[:, :, 9]
        inside = seg > 0  # every person their own ids, 8 per person (like aseg against MUSE)
        seg[inside] = np.searchsorted(MUSE_IDS, seg[inside]) + 1 + len(MUSE_IDS) * index
        _save(folder / f"{person}_DLMUSE.nii.gz", seg)
    with caplog.at_level(logging.INFO):
        _train_2d(folder, tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if "validation has no Dice" in r.getMessage()]
    assert said and "share no label id" in said[0]
