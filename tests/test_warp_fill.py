"""``hyperreg warp --fill``: what images take outside the moving file (issue 23, a CT-like image
with background -1024); label maps always take 0."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from hyperreg.cli import main
from hyperreg.geometry.fields import save_displacement
from hyperreg.geometry.io import load_volume


@pytest.fixture()
def ct(tmp_path: Path) -> dict[str, Path]:
    data = np.full((20, 16), -1024.0, np.float32)
    data[4:16, 4:12] = 40.0
    data[:, 0] = -1000.0  # the first column: an edge value that differs from the minimum
    nib.save(nib.Nifti1Image(data, np.eye(4)), tmp_path / "ct.nii.gz")
    nib.save(nib.Nifti1Image((data > 0).astype(np.int16), np.eye(4)), tmp_path / "seg.nii.gz")
    disp = np.zeros((2, 20, 16), np.float32)
    disp[1] = -5.0  # every voxel samples 5 columns to the left: columns 0-4 fall outside
    save_displacement(tmp_path / "warp.nii.gz", disp, load_volume(tmp_path / "ct.nii.gz"))
    return {"ct": tmp_path / "ct.nii.gz", "seg": tmp_path / "seg.nii.gz",
            "warp": tmp_path / "warp.nii.gz", "out": tmp_path / "moved.nii.gz"}


@pytest.mark.parametrize(
    ("fill", "outside"), [(None, 0.0), ("zero", 0.0), ("min", -1024.0), ("edge", -1000.0),
                          ("-3.5", -3.5)]
)
def test_fill_outside_the_image(ct: dict[str, Path], fill, outside) -> None:
    args = ["warp", "--moving", str(ct["ct"]), "--warp", str(ct["warp"])]
    args += ["--moved", str(ct["out"])]
    assert main(args + ([] if fill is None else ["--fill", fill])) == 0
    moved = nib.load(ct["out"]).get_fdata()
    np.testing.assert_allclose(moved[:, :5], outside, atol=1e-3)
    np.testing.assert_allclose(moved[:, 5:], nib.load(ct["ct"]).get_fdata()[:, :11], atol=1e-3)


def test_fill_errors_name_the_option(ct: dict[str, Path], capsys) -> None:
    args = ["warp", "--moving", str(ct["seg"]), "--warp", str(ct["warp"])]
    args += ["--moved", str(ct["out"])]
    assert main([*args, "--nearest", "--fill", "min"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--fill" in err and "label maps" in err
    assert main([*args, "--fill", "background"]) == 2
    assert "argument --fill" in capsys.readouterr().err
    assert main([*args, "--fill", "nan"]) == 2
    assert not ct["out"].exists()
