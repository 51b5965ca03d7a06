"""hyperreg evaluate: NDV on hand-built fields, Dice/HD95 on tiny label maps, the CSV run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lambda_helpers import write_nifti
from hyperreg.apps.evaluate import evaluate_csv, evaluate_pair
from hyperreg.cli import main
from hyperreg.geometry.fields import save_displacement
from hyperreg.geometry.io import load_volume
from hyperreg.geometry.structures import structure_names
from hyperreg.method.diffeomorphism import non_diffeomorphic_map, non_diffeomorphic_volume

AFFINE_2MM = np.diag([2.0, 2.0, 2.0, 1.0])


# --- non-diffeomorphic volume ----------------------------------------------------------------


@pytest.mark.parametrize("ndim", [2, 3])
def test_ndv_of_identity_and_smooth_fields_is_zero(ndim: int) -> None:
    assert non_diffeomorphic_volume(torch.zeros(ndim, *([5] * ndim))) == 0.0
    shift = torch.full((1, ndim, *([5] * ndim)), 2.5)
    assert non_diffeomorphic_volume(shift) == 0.0


def test_nda_of_one_pixel_pushed_past_its_neighbour() -> None:
    # u0 = 1.5 at the centre of a 3x3 grid: phi0 = 0, 2.5, 2 along axis 0 in the middle column.
    # Centre pixel: forward difference 2 - 2.5 = -0.5 in the triangles (+,+) and (+,-), each
    # contributing 1/2 * 0.5 / 2 = 0.125; pixel (2, 1): backward difference -0.5, the same.
    disp = torch.zeros(2, 3, 3, dtype=torch.float64)
    disp[0, 1, 1] = 1.5
    expected = torch.zeros(3, 3, dtype=torch.float64)
    expected[1, 1] = expected[2, 1] = 0.25
    torch.testing.assert_close(non_diffeomorphic_map(disp), expected)
    assert non_diffeomorphic_volume(disp) == pytest.approx(0.5 / 9)
    # central differences (the folding fraction) see no fold at the centre: (2 - 0) / 2 > 0
    from hyperreg.method.spatial import jacobian_determinant

    assert float(jacobian_determinant(disp[None].float())[0, 0, 1, 1]) > 0


def test_ndv_of_one_voxel_pushed_past_its_neighbour() -> None:
    # 3D analogue: 4 corner tetrahedra with J = -0.5 in each of two voxels, 1/2 * 0.5 / 6 each;
    # the two central tetrahedra keep J > 0 (3.5 and 0.5 at the centre).
    disp = torch.zeros(3, 3, 3, 3, dtype=torch.float64)
    disp[0, 1, 1, 1] = 1.5
    ndv = non_diffeomorphic_map(disp)
    assert float(ndv[1, 1, 1]) == pytest.approx(1 / 6)
    assert float(ndv[2, 1, 1]) == pytest.approx(1 / 6)
    assert float(ndv.sum()) == pytest.approx(1 / 3)


@pytest.mark.parametrize("ndim", [2, 3])
def test_ndv_of_a_mirror_is_the_whole_interior(ndim: int) -> None:
    x = torch.arange(6, dtype=torch.float64)
    disp = torch.zeros(ndim, *([6] * ndim), dtype=torch.float64)
    disp[0] = -2 * x.view(6, *([1] * (ndim - 1)))  # phi0 = -x0
    inner = (slice(1, -1),) * ndim
    torch.testing.assert_close(non_diffeomorphic_map(disp)[inner], torch.ones([4] * ndim).double())


def test_ndv_rejects_a_batch_of_fields() -> None:
    with pytest.raises(ValueError, match="'disp' must hold one field"):
        non_diffeomorphic_map(torch.zeros(2, 2, 4, 4))


# --- structure names -------------------------------------------------------------------------


def test_structure_names() -> None:
    assert structure_names([4, 43, 1035, 2035]) == {
        4: "Left-Lateral-Ventricle",
        43: "Right-Lateral-Ventricle",
        1035: "ctx-lh-insula",
        2035: "ctx-rh-insula",
    }
    assert structure_names([1, 2, 3]) == {1: "1", 2: "2", 3: "3"}  # neurite-oasis seg35 ids
    assert structure_names([2, 3, 4]) == {2: "2", 3: "3", 4: "4"}  # no id >= 41: not sure
    assert structure_names([2, 3], "freesurfer")[2] == "Left-Cerebral-White-Matter"
    with pytest.raises(ValueError, match="'naming' must be one of"):
        structure_names([1], "fs")


# --- evaluate --------------------------------------------------------------------------------


def _maps(tmp_path: Path) -> dict[str, Path]:
    fixed = np.zeros((8, 8), np.uint8)
    fixed[2:6, 2:6] = 4  # 16 voxels
    fixed[0:2, 6:8] = 43  # 4 voxels
    moved = np.zeros((8, 8), np.uint8)
    moved[3:7, 2:6] = 4  # 16 voxels, 12 shared: Dice 24/32 = 0.75
    moved[0:2, 6:8] = 43  # identical: Dice 1
    return {
        "fixed": write_nifti(tmp_path / "fixed_seg.nii.gz", fixed[..., None], AFFINE_2MM),
        "moved": write_nifti(tmp_path / "moved_seg.nii.gz", moved[..., None], AFFINE_2MM),
    }


def test_evaluate_pair_hand_computed_dice_and_monai_hd95(tmp_path: Path) -> None:
    from monai.metrics import compute_hausdorff_distance

    maps = _maps(tmp_path)
    scores = evaluate_pair(maps["moved"], maps["fixed"])
    assert scores.dice == {4: pytest.approx(0.75), 43: pytest.approx(1.0)}
    moved = load_volume(maps["moved"], label=True).data
    fixed = load_volume(maps["fixed"], label=True).data
    for label in (4, 43):
        pred = torch.from_numpy(moved == label)[None, None].float()
        target = torch.from_numpy(fixed == label)[None, None].float()
        expected = compute_hausdorff_distance(pred, target, percentile=95, spacing=(2.0, 2.0))
        assert scores.hd95[label] == pytest.approx(float(expected.reshape(-1)[0]))
    assert scores.hd95[43] == 0.0 and scores.hd95[4] == pytest.approx(2.0)  # one row, 2 mm
    assert scores.ndv_percent is None


def test_evaluate_csv_reports_a_missing_row_and_evaluates_the_rest(tmp_path: Path) -> None:
    maps = _maps(tmp_path)
    like = load_volume(maps["fixed"])
    disp = np.zeros((2, 8, 8), np.float32)
    disp[0, 4, 4] = 1.5  # one pixel pushed past its neighbour (see the NDA test)
    save_displacement(tmp_path / "warp.nii.gz", disp, like)
    csv = tmp_path / "pairs.csv"
    csv.write_text(
        "name,moved_seg,fixed_seg,warp\n"
        "a,moved_seg.nii.gz,fixed_seg.nii.gz,warp.nii.gz\n"
        "b,missing.nii.gz,fixed_seg.nii.gz,\n"
        "c,fixed_seg.nii.gz,fixed_seg.nii.gz,\n"
    )
    report = evaluate_csv(csv, tmp_path / "out")
    assert [p.name for p in report.pairs] == ["a", "c"]
    assert [(i, n) for i, n, _ in report.failures] == [(1, "b")]
    assert "missing.nii.gz" in report.failures[0][2]
    assert "()" not in report.failures[0][2]  # the library's words, not its function names
    first = report.pairs[0]
    assert first.ndv_percent == pytest.approx(100 * 0.5 / 64)
    # central differences step over the pushed pixel: (6 - 5.5) / 2 > 0, so no "folding"
    assert first.folding_percent == 0.0
    assert report.pairs[1].mean_dice == 1.0 and report.pairs[1].ndv_percent is None
    assert report.names == {4: "Left-Lateral-Ventricle", 43: "Right-Lateral-Ventricle"}
    structures = (tmp_path / "out" / "structures.csv").read_text().splitlines()
    assert structures[0].startswith("label,structure,pairs,dice_mean")
    assert structures[1].startswith("4,Left-Lateral-Ventricle,2,0.875")
    assert (tmp_path / "out" / "evaluation_boxplot.png").stat().st_size > 1000
    assert "missing.nii.gz" in (tmp_path / "out" / "failures.csv").read_text()
    # a rerun where nothing fails writes no failures.csv and leaves none from the first run
    csv.write_text("\n".join(csv.read_text().splitlines()[:2]) + "\n")
    assert not evaluate_csv(csv, tmp_path / "out").failures
    assert not (tmp_path / "out" / "failures.csv").exists()


def test_cli_evaluate_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _maps(tmp_path)
    good = tmp_path / "good.csv"
    good.write_text("moved_seg,fixed_seg\nmoved_seg.nii.gz,fixed_seg.nii.gz\n")
    assert main(["evaluate", "--pairs", str(good), "--out", str(tmp_path / "o1")]) == 0
    assert "1 pair(s): mean Dice 0.8750" in capsys.readouterr().out
    partly = tmp_path / "partly.csv"
    partly.write_text("moved_seg,fixed_seg\nmoved_seg.nii.gz,fixed_seg.nii.gz\nnone.nii.gz,x\n")
    assert main(["evaluate", "--pairs", str(partly), "--out", str(tmp_path / "o2")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "row 1" in err[0] and "none.nii.gz" in err[0]
    bad = tmp_path / "bad.csv"
    bad.write_text("moving,fixed\na,b\n")
    assert main(["evaluate", "--pairs", str(bad), "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "moved_seg" in err
    assert not (tmp_path / "o3").exists()
