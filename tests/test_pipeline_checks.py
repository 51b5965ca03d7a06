"""Issue 23 item 3 in the pipeline: what a pair holds is checked before the affine stage (a
label map given as an image, voxels far coarser than the model's), each a one-line warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from lambda_helpers import blob
from hyperreg import load_pretrained
from hyperreg.cli import main
from hyperreg.registration.pipeline import load_pair


def _save(path: Path, data: np.ndarray, spacing: tuple[float, float] = (1.0, 1.0)) -> Path:
    nib.save(nib.Nifti1Image(data, np.diag([*spacing, 1.0, 1.0])), path)
    return path


@pytest.fixture()
def images(tmp_path: Path) -> dict[str, Path]:
    shape = (64, 64)
    seg = np.zeros(shape, np.int16)
    seg[10:30, 10:40], seg[30:50, 20:50] = 3, 17
    return {
        "moving": _save(tmp_path / "m.nii.gz", blob(shape, (30, 34), 8.0).astype(np.float32)),
        "fixed": _save(tmp_path / "f.nii.gz", blob(shape, (33, 31), 9.0).astype(np.float32)),
        "seg": _save(tmp_path / "seg.nii.gz", seg),
        "coarse": _save(
            tmp_path / "c.nii.gz", blob(shape, (30, 34), 8.0).astype(np.float32), (1.0, 3.0)
        ),
        "fine": _save(  # 0.5 mm voxels over the same field of view as the others
            tmp_path / "fine.nii.gz",
            blob((128, 128), (60, 68), 16.0).astype(np.float32),
            (0.5, 0.5),
        ),
    }


def test_label_map_as_image_warns(images: dict[str, Path]) -> None:
    with pytest.warns(UserWarning, match=r"seg\.nii\.gz' given as the moving image looks like"):
        load_pair(images["seg"], images["fixed"], init="none")
    with pytest.warns(UserWarning, match=r"given as the fixed image looks like a label map"):
        load_pair(images["moving"], images["seg"], init="none")


def test_voxels_coarser_than_the_model_warn_finer_do_not(images: dict[str, Path]) -> None:
    model = load_pretrained(ndim=2)  # 1 mm
    with pytest.warns(UserWarning, match=r"1 x 3 mm voxels, far from the 1 x 1 mm"):
        load_pair(images["coarse"], images["fixed"], model=model, init="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0.5 mm is resampled to the model's 1 mm: no warning
        load_pair(images["fine"], images["fixed"], model=model, init="none")
        load_pair(images["moving"], images["fixed"], model=model, init="none")


def test_cli_prints_each_warning_on_one_line(images: dict[str, Path], tmp_path, capsys) -> None:
    args = ["register", "--moving", str(images["seg"]), "--fixed", str(images["fixed"])]
    args += ["--moved", str(tmp_path / "o.nii.gz"), "--lambda", "0.1", "--init", "none"]
    assert main([*args, "--device", "cpu"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and "looks like a label map" in err[0]
    assert err[0].startswith("hyperreg register: warning: ")


@pytest.mark.parametrize("side", ["moving_seg", "fixed_seg"])
def test_label_map_of_another_dimensionality_names_its_option(
    images: dict[str, Path], tmp_path, capsys, side
) -> None:
    seg3d = np.zeros((8, 8, 8), np.int16)
    seg3d[2:5, 2:5, 2:5] = 4
    wrong = _save(tmp_path / "seg3d.nii.gz", seg3d)
    maps = {"moving_seg": images["seg"], "fixed_seg": images["seg"], side: wrong}
    out = tmp_path / "out" / "moved.nii.gz"
    args = ["register", "--moving", str(images["moving"]), "--fixed", str(images["fixed"])]
    args += ["--moving-seg", str(maps["moving_seg"]), "--fixed-seg", str(maps["fixed_seg"])]
    assert main([*args, "--moved", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    option = "--" + side.replace("_", "-")
    assert err.startswith(f"hyperreg register: error: argument {option}: ")
    assert "seg3d.nii.gz' is 3D but" in err and "is 2D" in err and len(err.splitlines()) == 1
    assert not out.exists() and not out.parent.exists()
