"""npz inputs have no header: their geometry is chosen (--npz-geometry / npz_geometry), never
assumed; without a choice an npz input is a one-line error naming the option."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from lambda_helpers import blob
from hyperreg.cli import main
from hyperreg.registration.pipeline import InputError, load_pair

AFFINE = np.diag([2.0, 2.0, 1.0, 1.0])
AFFINE[:3, 3] = (10.0, -5.0, 3.0)


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    shape = (32, 32)
    moving, fixed = blob(shape, (15, 17), 5.0), blob(shape, (16, 15), 5.5)
    np.savez(tmp_path / "m.npz", vol=moving.astype(np.float32))
    np.savez(tmp_path / "f.npz", vol=fixed.astype(np.float32))
    nib.save(nib.Nifti1Image(fixed.astype(np.float32), AFFINE), tmp_path / "f.nii.gz")
    return {"m": tmp_path / "m.npz", "f": tmp_path / "f.npz", "fh": tmp_path / "f.nii.gz"}


def test_load_pair_refuses_or_takes_the_chosen_geometry(files: dict[str, Path]) -> None:
    with pytest.raises(InputError, match=r"m\.npz' has no header.*'npz_geometry'") as info:
        load_pair(files["m"], files["fh"], init="none")
    assert info.value.argument == "npz_geometry"
    pair = load_pair(files["m"], files["fh"], init="none", npz_geometry="fixed")
    np.testing.assert_array_equal(pair.moving.affine, AFFINE)
    pair = load_pair(files["m"], files["f"], init="none", npz_geometry="identity")
    np.testing.assert_array_equal(pair.fixed.affine, np.eye(4))
    with pytest.raises(InputError, match=r"f\.npz' is the fixed image and has no header"):
        load_pair(files["m"], files["f"], init="none", npz_geometry="fixed")


def test_cli_register_and_warp(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["register", "--moving", str(files["m"]), "--fixed", str(files["fh"])]
    args += ["--moved", str(out / "moved.nii.gz"), "--warp", str(out / "warp.nii.gz")]
    args += ["--lambda", "0.2", "--init", "none", "--device", "cpu"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--npz-geometry" in err and "m.npz" in err
    assert not out.exists()
    assert main([*args, "--npz-geometry", "fixed"]) == 0
    np.testing.assert_allclose(nib.load(out / "moved.nii.gz").affine, AFFINE)

    warp = ["warp", "--moving", str(files["m"]), "--warp", str(out / "warp.nii.gz")]
    warp += ["--moved", str(out / "again.nii.gz")]
    assert main(warp) == 2
    assert "--npz-geometry" in capsys.readouterr().err
    assert main([*warp, "--npz-geometry", "fixed"]) == 0
    np.testing.assert_allclose(
        nib.load(out / "again.nii.gz").get_fdata(), nib.load(out / "moved.nii.gz").get_fdata(),
        atol=1e-5,
    )


def test_cli_affine_takes_the_option(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    args = ["affine", "--moving", str(files["m"]), "--fixed", str(files["fh"]), "--init", "none"]
    args += ["--moved", str(tmp_path / "a.nii.gz")]
    assert main(args) == 2
    assert "--npz-geometry" in capsys.readouterr().err
    assert main([*args, "--npz-geometry", "fixed"]) == 0
