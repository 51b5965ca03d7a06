"""A label map holding non-integer ids is an error at every entry point, naming the file."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from hyperreg.cli import main
from hyperreg.geometry.fields import save_displacement
from hyperreg.geometry.io import Volume


def test_warp_nearest_of_a_label_map_holding_2_5_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    affine = np.diag([1.0, 1.0, 1.0, 1.0])
    labels = np.zeros((12, 10, 1), np.float32)
    labels[3:8, 2:6] = 2.5
    labels[8:10, 6:9] = 1.0
    seg = tmp_path / "seg_half.nii.gz"
    nib.save(nib.Nifti1Image(labels, affine), seg)
    like = Volume(np.zeros((12, 10), np.float32), affine, (12, 10, 1))
    field = save_displacement(tmp_path / "warp.nii.gz", np.zeros((2, 12, 10), np.float32), like)
    moved = tmp_path / "moved_seg.nii.gz"
    args = ["warp", "--moving", str(seg), "--warp", str(field), "--moved", str(moved), "--nearest"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "seg_half.nii.gz" in err and "integer label ids" in err and "2.5" in err
    assert not moved.exists()
