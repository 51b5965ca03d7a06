"""--initial-affine on the commands: a known affine from a SimpleITK file used as is, refined by
the affine stage, and a bad file refused in one line before any output is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_affine_speed import _sitk_file
from shared_paths import DATA, OASIS, needs_data
from test_native import _pair

from hyperreg.cli import main
from hyperreg.geometry.affine import load_affine
from hyperreg.registration.pipeline import InputError, load_pair


def test_load_pair_uses_or_refines_an_initial_affine_file(tmp_path: Path) -> None:
    moving, fixed, truth = _pair(tmp_path, 3)
    path = _sitk_file(tmp_path / "init.mat", truth, (3.0, -7.0, 11.0))
    as_is = load_pair(moving.path, fixed.path, init="none", initial_affine=path)
    np.testing.assert_allclose(as_is.transform.matrix, truth, atol=1e-9)
    assert as_is.affine is not None and as_is.affine.kind == "initial"
    refined = load_pair(moving.path, fixed.path, init="affine", initial_affine=path)
    np.testing.assert_allclose(refined.transform.matrix[:3, :3], truth[:3, :3], atol=0.05)


def test_affine_command_refines_and_writes_it(tmp_path: Path) -> None:
    moving, fixed, truth = _pair(tmp_path, 3)
    start = truth.copy()
    start[:3, 3] += [3.0, -2.0, 2.0]
    path = _sitk_file(tmp_path / "start.tfm", start, (0.0, 0.0, 0.0))
    out = tmp_path / "refined.mat"
    code = main(["affine", "--moving", str(moving.path), "--fixed", str(fixed.path),
                 "--initial-affine", str(path), "--affine-out", str(out)])
    assert code == 0
    centre = fixed.affine @ np.array([*(np.array(fixed.spatial_shape) / 2), 1])
    np.testing.assert_allclose(load_affine(out).matrix @ centre, truth @ centre, atol=1.5)


def test_a_bad_initial_affine_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    moving, fixed, _ = _pair(tmp_path, 3)
    bad = tmp_path / "bad.tfm"
    bad.write_text("not a transform\n")
    with pytest.raises(InputError) as caught:
        load_pair(moving.path, fixed.path, initial_affine=bad)
    assert caught.value.argument == "initial_affine"
    moved = tmp_path / "moved.nii.gz"
    code = main(["register", "--moving", str(moving.path), "--fixed", str(fixed.path),
                 "--lambda", "0.3", "--initial-affine", str(bad), "--moved", str(moved)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "bad.tfm" in err, err
    assert not moved.exists()


@needs_data("neurite-oasis")
def test_affine_command_says_which_labels_are_in_one_map_only(tmp_path: Path, capsys) -> None:
    """A label erased from the moving map counts 0 in the mean; the line under it says so and
    gives the mean over the labels both maps hold, as ``register`` does."""
    import nibabel as nib

    subject = OASIS / "OASIS_OAS1_0002_MR1"
    seg = nib.load(subject / "slice_seg4.nii.gz")
    data = np.asarray(seg.dataobj).astype(np.int32)
    data[data == 2] = 0  # one of the four labels gone from the moving map
    moving_seg = tmp_path / "moving_seg.nii.gz"
    nib.save(nib.Nifti1Image(data, seg.affine), moving_seg)
    fixed = OASIS / "OASIS_OAS1_0001_MR1"
    code = main(["affine", "--moving", str(subject / "slice_norm.nii.gz"),
                 "--fixed", str(fixed / "slice_norm.nii.gz"), "--moving-seg", str(moving_seg),
                 "--fixed-seg", str(fixed / "slice_seg4.nii.gz"),
                 "--moved-seg", str(tmp_path / "moved_seg.nii.gz")])
    printed = capsys.readouterr().out
    assert code == 0
    assert "1 of those labels are in one map only and count 0" in printed, printed


@needs_data("multicontrast-2d")
def test_affine_command_runs_the_affine_stage_of_register(tmp_path: Path) -> None:
    """``affine`` writes the transform ``register`` starts from, reruns included: a T2 slice to
    another person's T1 slice takes the other-contrast rerun, so one plain affine run differs."""
    from hyperreg.apps.transforms import affine_files

    folder = DATA / "multicontrast-2d"
    moving = folder / "S1" / "T2_structInSpaceOfTemplateCoronalSlice.nii.gz"
    fixed = folder / "S2" / "structInSpaceOfTemplateCoronalSlice.nii.gz"
    stage = load_pair(moving, fixed, contrast="auto")
    assert any(note.startswith("other contrasts") for note in stage.notes)
    result = affine_files(moving, fixed, affine_out=tmp_path / "a.mat")
    np.testing.assert_array_equal(result.transform.matrix, stage.transform.matrix)
    plain = load_pair(moving, fixed, contrast="same").transform.matrix
    assert np.abs(plain - result.transform.matrix).max() > 0.5  # the rerun mattered here
