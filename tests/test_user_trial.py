"""Problems a new user met (session 3 trial of the README), each now a one-line error, exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from shared_paths import CASES, OASIS

from hyperreg.cli import main

FIXED = OASIS / "OASIS_OAS1_0001_MR1" / "slice_norm.nii.gz"
needs_data = pytest.mark.skipif(
    not (CASES / "files").is_dir() or not FIXED.is_file(),
    reason=f"shared cases or data not found at {CASES} / {OASIS} (HYPERREG_CASES / HYPERREG_DATA)",
)


@needs_data
def test_no_resample_is_honoured_with_the_default_affine_stage(tmp_path: Path, capsys) -> None:
    moved = tmp_path / "moved.nii.gz"
    moving = CASES / "files" / "c04_other_grid_150x181.nii.gz"
    args = ["register", "--moving", str(moving), "--fixed", str(FIXED), "--no-resample"]
    assert main([*args, "--lambda", "0.3", "--moved", str(moved)]) == 2
    err = capsys.readouterr().err.strip()
    assert "different grids" in err and len(err.splitlines()) == 1
    assert not moved.exists()


@needs_data
def test_inverse_warp_with_an_affine_stage_is_written_on_the_moving_grid(tmp_path: Path) -> None:
    import nibabel as nib

    moving = CASES / "files" / "c04_other_grid_150x181.nii.gz"
    args = ["register", "--moving", str(moving), "--fixed", str(FIXED), "--lambda", "0.3"]
    inverse = tmp_path / "inverse.nii.gz"
    assert main([*args, "--inverse-warp", str(inverse)]) == 0
    written, source = nib.load(inverse), nib.load(moving)
    assert written.shape[:2] == source.shape[:2] and written.shape[-1] == 2
    np.testing.assert_allclose(written.affine, source.affine, atol=1e-5)


@needs_data
def test_jacobian_of_an_image_says_it_is_not_a_field(tmp_path: Path, capsys) -> None:
    out = tmp_path / "jacobian.nii.gz"
    assert main(["jacobian", "--warp", str(FIXED), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "must hold a voxel displacement field" in err and str(FIXED) in err
    assert not out.exists()
