"""The 3D recipe's file list and its device pack: scripts/train_hypermorph_3d.py,
scripts/pack_3d_device.py (data at 2 mm that train exactly as the originals) and
scripts/device_3d.sh (refuses to train on a machine without its install step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from shared_paths import DATA, REPO, data_path
from hyperreg.config import ModelConfig
from hyperreg.training.sources import Scan, load_scan

sys.path.insert(0, str(REPO / "scripts"))
from pack_3d_device import pack_file
from train_hypermorph_3d import HOLDOUT, source_rows, synth_label_files


def test_the_recipe_lists_every_person_and_label_map_it_trains_and_validates_on() -> None:
    for section in ("ixi-2mm", "synthseg-labelmaps", "oasis1-freesurfer", "misc-3d", "lapirn-3d"):
        data_path(section)  # skips, naming the path, where the shared data are absent
    rows = source_rows(DATA)
    people = {person for items in rows.values() for _, _, person in items}
    assert set(HOLDOUT) <= people  # the held-out people are in the sources (the split drops them)
    assert len(rows["ixi"]) == 30 and len(people) == 37
    files = [Path(f) for items in rows.values() for row in items for f in row[:2] if f]
    assert all(path.is_file() for path in files)
    maps = synth_label_files(DATA)
    assert len(maps) == 41 and all(path.is_file() for path in maps)  # SynthSeg 20 + 20, GIF


def _anisotropic_scan(folder: Path) -> Scan:
    """A 1 × 1 × 1.5 mm LAS-stored head-like blob and its label map, off-centre."""
    grid = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in (40, 36, 24)], indexing="ij")
    dist = (grid[0] - 22) ** 2 + (grid[1] - 17) ** 2 + ((grid[2] - 11) * 1.5) ** 2
    image = (200 * np.exp(-dist / 150)).astype(np.int16)
    seg = (image > 60).astype(np.uint8) * 2 + (image > 150)
    affine = np.diag([-1.0, 1.0, 1.5, 1.0])
    affine[:3, 3] = (30.0, -12.0, 5.0)
    nib.save(nib.Nifti1Image(image, affine), folder / "img.nii.gz")
    nib.save(nib.Nifti1Image(seg, affine), folder / "seg.nii.gz")
    return Scan(folder / "img.nii.gz", folder / "seg.nii.gz")


def test_packed_scan_trains_as_its_original(tmp_path: Path) -> None:
    """The pack's 2 mm file gives the recipe the same arrays as the 1 mm original (image within
    the int16 rounding of its stored dtype, labels equal), at 2 mm and in its dtype."""
    scan = _anisotropic_scan(tmp_path)
    (tmp_path / "pack").mkdir()
    packed = Scan(tmp_path / "pack" / "img.nii.gz", tmp_path / "pack" / "seg.nii.gz")
    grid = pack_file(scan.image, packed.image, label=False)
    pack_file(scan.seg, packed.seg, label=True, grid=grid)
    stored = nib.load(packed.image)
    assert stored.header.get_zooms() == (2.0, 2.0, 2.0) and stored.get_data_dtype() == np.int16
    assert nib.load(packed.seg).get_data_dtype() == np.uint8
    original = load_scan(scan, spacing=2.0, orientation="RAS")
    again = load_scan(packed, spacing=2.0, orientation="RAS")
    assert original[0].shape == again[0].shape
    np.testing.assert_allclose(again[0], original[0], atol=1 / 200)  # one int16 step of 200
    np.testing.assert_array_equal(again[1], original[1])
    assert set(np.unique(again[1])) == {0, 2, 3}


def test_a_copy_when_already_at_2_mm(tmp_path: Path) -> None:
    image = nib.Nifti1Image(np.ones((4, 4, 4), np.float32), np.diag([2.0, 2.0, 2.0, 1.0]))
    nib.save(image, tmp_path / "a.nii.gz")
    assert pack_file(tmp_path / "a.nii.gz", tmp_path / "b" / "a.nii.gz", label=False) is None
    assert (tmp_path / "b" / "a.nii.gz").read_bytes() == (tmp_path / "a.nii.gz").read_bytes()


@pytest.mark.parametrize("argv", [[], ["train", "1"], ["capacity", "1"]])
def test_device_script_refuses_before_any_work(argv: list[str], tmp_path: Path) -> None:
    """No verb: usage; 'train' or 'capacity' where 'install' did not run: says so, exit 2."""
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "device_3d.sh"), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "DEVSITE": str(tmp_path / "none")},
    )
    assert done.returncode == 2
    assert ("usage" if not argv else "run 'install' on this machine first") in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_recipe_widths_and_learning_rates() -> None:
    """--width scales every U-Net feature count; it needs --init none (1e-4 unless --lr)."""
    from train_hypermorph_3d import channels, parse_args, recipe_config

    assert channels(1.5) == ((24, 48, 48, 48), (48, 48, 48, 48, 48, 24, 24))
    assert channels(1) == (ModelConfig(ndim=3).enc_channels, ModelConfig(ndim=3).dec_channels)
    with pytest.raises(SystemExit):
        parse_args(["--width", "2"])  # continuing the bundled model (width 1)
    with pytest.raises(SystemExit):
        parse_args(["--width", "0", "--init", "none"])
    scratch = recipe_config(parse_args(["--width", "2", "--init", "none"]), [], DATA)
    assert scratch.init == "" and scratch.lr == 1e-4
    assert scratch.model.enc_channels == (32, 64, 64, 64)
    assert recipe_config(parse_args(["--init", "none", "--lr", "3e-5"]), [], DATA).lr == 3e-5
    bundled = recipe_config(parse_args([]), [], DATA)
    assert bundled.init.endswith("hypermorph-3d.pt") and bundled.lr == 5e-6


def test_capacity_report_compares_widths_at_the_shortest_runs_seconds(tmp_path: Path) -> None:
    """bench_capacity's table from run folders: per width its size and step time, every
    validation with its seconds, and the best Dice each width reached within the shortest run."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_capacity import report

    logs = {  # width: (seconds at steps 1..4, validation mean Dice at steps 2 and 4)
        1.0: ((1, 2, 3, 4), (0.30, 0.40)),
        1.5: ((2, 4, 6, 8), (0.35, 0.50)),
    }
    for width, (seconds, dices) in logs.items():
        run = tmp_path / f"width_{width:g}"
        run.mkdir()
        rows = [f"{i},0.1,0.1,0.0,0.5,{s}" for i, s in enumerate(seconds, 1)]
        (run / "train_log.csv").write_text(
            "step,loss,similarity,smoothness,lam_mean,seconds\n" + "\n".join(rows) + "\n"
        )
        val = [f"{step},{d},{d},{d},0,0,{d},0,0,{d},0,0" for step, d in zip((2, 4), dices)]
        header = "step,score,mean_dice,dice_0.1,folding_pct_0.1,similarity_0.1,dice_0.3,"
        header += "folding_pct_0.3,similarity_0.3,dice_0.6,folding_pct_0.6,similarity_0.6"
        (run / "val_log.csv").write_text(header + "\n" + "\n".join(val) + "\n")
    text = report([1.0, 1.5], tmp_path)
    assert "| 1 | 2207477 | 4.41 | 4 | 4 | 1.00 |" in text
    assert "| 1.5 | 4937701 | 9.88 | 4 | 8 | 2.00 |" in text
    assert "| 1.5 | 4 | 8 | 0.5000 | 0.5000 / 0.5000 / 0.5000 |" in text
    best = text.split("within 4 training seconds")[1]
    assert "| 1 | 0.4000 |" in best and "| 1.5 | 0.3500 |" in best  # width 1.5 at 4 s: step 2
