"""evaluate --label-names FILE: a FreeSurfer colour table or an id,name CSV names the
structures in structures.csv and the box plot; a bad file is one line naming it and its line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lambda_helpers import write_nifti

from hyperreg.apps.evaluate import evaluate_csv
from hyperreg.cli import main
from hyperreg.geometry.structures import read_label_names

LUT = """#$Id: FreeSurferColorLUT.txt
#No. Label Name:                            R   G   B   A

0   Unknown                                 0   0   0   0
4   Left-Lateral-Ventricle                  120 18  134 0
43  Right-Lateral-Ventricle                 120 18  134 0
"""


@pytest.fixture()
def job(tmp_path: Path) -> dict[str, Path]:
    """A pair of 2D label maps with labels 1 and 2 (renumbered: not FreeSurfer's ids)."""
    fixed = np.zeros((8, 8), np.uint8)
    fixed[2:6, 2:6] = 1
    fixed[0:2, 6:8] = 2
    moved = np.zeros((8, 8), np.uint8)
    moved[3:7, 2:6] = 1  # Dice 0.75
    moved[0:2, 6:8] = 2  # Dice 1
    write_nifti(tmp_path / "fixed_seg.nii.gz", fixed[..., None])
    write_nifti(tmp_path / "moved_seg.nii.gz", moved[..., None])
    csv = tmp_path / "pairs.csv"
    csv.write_text("moved_seg,fixed_seg\nmoved_seg.nii.gz,fixed_seg.nii.gz\n")
    return {"csv": csv, "out": tmp_path / "out", "root": tmp_path}


def test_read_a_freesurfer_lut_and_a_csv(tmp_path: Path) -> None:
    lut = tmp_path / "FreeSurferColorLUT.txt"
    lut.write_text(LUT)
    assert read_label_names(lut) == {
        0: "Unknown",
        4: "Left-Lateral-Ventricle",
        43: "Right-Lateral-Ventricle",
    }
    table = tmp_path / "names.csv"
    table.write_text('id,name\n1,white matter\n2,"cortex, left"\n')
    assert read_label_names(table) == {1: "white matter", 2: "cortex, left"}
    bare = tmp_path / "bare.csv"
    bare.write_text("1,wm\n2,gm\n")  # no header
    assert read_label_names(bare) == {1: "wm", 2: "gm"}


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("id,name\n1,wm\nx,gm\n", 3, "integer id"),
        ("1 wm 0 0 0 0\n2\n", 2, "integer id"),
        ("1,wm\n1,gm\n", 2, "named twice"),
        ("# only a comment\n", None, "names no label"),
    ],
)
def test_a_bad_names_file_is_one_error_naming_the_line(
    tmp_path: Path, text: str, line: int | None, what: str
) -> None:
    path = tmp_path / "names.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=what) as err:
        read_label_names(path)
    assert str(path) in str(err.value)
    if line is not None:
        assert f"line {line}:" in str(err.value)


@pytest.mark.parametrize("form", ["lut", "csv"])
def test_evaluate_names_the_structures_from_a_file(
    job: dict[str, Path], form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = job["root"] / f"names.{form}"
    if form == "lut":
        names.write_text("1  Left-WM  245 245 245 0\n2  Left-GM  205 62 78 0\n")
    else:
        names.write_text("label,structure\n1,left white matter\n2,left grey matter\n")
    args = ["evaluate", "--pairs", str(job["csv"]), "--out", str(job["out"])]
    assert main([*args, "--label-names", str(names)]) == 0
    rows = (job["out"] / "structures.csv").read_text().splitlines()
    expected = (
        ("Left-WM", "Left-GM") if form == "lut" else ("left white matter", "left grey matter")
    )
    assert rows[1].startswith(f"1,{expected[0]},1,0.75")
    assert rows[2].startswith(f"2,{expected[1]},1,1")
    assert (job["out"] / "evaluation_boxplot.png").is_file()
    # without the file: numbers (the ids are not FreeSurfer's)
    assert main([*args, "--label-names", "auto"]) == 0
    assert (job["out"] / "structures.csv").read_text().splitlines()[1].startswith("1,1,1,")


def test_evaluate_names_unknown_ids_by_number_and_says_so(
    job: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    names = job["root"] / "names.csv"
    names.write_text("1,white matter\n")
    report = evaluate_csv(job["csv"], job["out"], label_names=names)
    assert report.names == {1: "white matter", 2: "2"}
    assert "has no name for 1 of 2 labels (2)" in caplog.text


def test_evaluate_with_a_bad_names_file_is_one_line_and_writes_nothing(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    names = job["root"] / "names.csv"
    names.write_text("id,name\n1,wm\ntwo,gm\n")
    args = ["evaluate", "--pairs", str(job["csv"]), "--out", str(job["out"])]
    assert main([*args, "--label-names", str(names)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"hyperreg evaluate: error: argument --label-names: '{names}' line 3:")
    assert not job["out"].exists()
    missing = job["root"] / "none.txt"
    assert main([*args, "--label-names", str(missing)]) == 2
    assert f"argument --label-names: no such file: '{missing}'" in capsys.readouterr().err


def test_freesurfer_names_on_other_ids_are_given_with_one_warning(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The job's ids 1 and 2 are a renumbered map's: FreeSurfer's names (Left-Cerebral-Exterior,
    Left-Cerebral-White-Matter) do not fit them, and evaluate says so in one line."""
    args = ["evaluate", "--pairs", str(job["csv"]), "--out", str(job["out"])]
    assert main([*args, "--label-names", "freesurfer"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "freesurfer" in line]
    assert len(warned) == 1 and "below 41 (1-2)" in warned[0], warned


def test_freesurfer_misfit_tells_foreign_and_renumbered_ids_from_freesurfer_ones() -> None:
    from hyperreg.geometry.structures import freesurfer_misfit

    assert freesurfer_misfit([2, 4, 17, 41, 43, 53, 1035, 2035]) is None  # aseg + DKT
    assert freesurfer_misfit([4, 43, 99]) is None  # mostly FreeSurfer's (99 is not)
    muse = [4, 11, 23, 30, 31, 32, 36, 37, 38, 39, 40, 41, 47, 48, 49, 50, 51, 52, 55, 56]
    muse += [100, 101, 102, 104, 105, 106, 107, 108, 109, 114, 115, 116, 117, 118, 119, 120]
    assert "not FreeSurfer ids" in (freesurfer_misfit(muse) or "")
    assert "below 41" in (freesurfer_misfit(range(1, 25)) or "")  # seg24
    assert freesurfer_misfit([]) is None
