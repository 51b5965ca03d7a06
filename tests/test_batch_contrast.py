"""``batch --contrast`` and the pair CSV's ``contrast`` column: read and checked before any work,
passed to each pair (the row's cell over the option), part of a pair's settings, and recorded
(``contrast`` asked, ``contrast_used`` run) in ``record.json`` and ``summary.csv``.

A T2-like and a T1-like 64 x 64 phantom (``test_contrast.phantom``) and the tiny untrained model
of lambda_helpers, no affine stage, no refinement (seconds on a CPU).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from lambda_helpers import save_tiny_model, write_nifti
from test_batch_masks import _batch, _write_rows
from test_contrast import T1, T2, phantom

from hyperreg.apps.inputs import read_pairs
from hyperreg.cli import main

T2_ROW, T1_ROW = "t2__to__t1", "t1b__to__t1"


@pytest.fixture()
def job(tmp_path: Path) -> dict[str, Path]:
    """Two rows: a T2-like moving image to a T1-like fixed one, and a T1 to T1 pair."""
    data = tmp_path / "data"
    data.mkdir()
    write_nifti(data / "t2.nii.gz", phantom(T2, 1.5, seed=1))
    write_nifti(data / "t1b.nii.gz", phantom(T1, 1.5, seed=2))
    write_nifti(data / "t1.nii.gz", phantom(T1))
    path = data / "pairs.csv"
    _write_rows(path, [{"moving": f"{m}.nii.gz", "fixed": "t1.nii.gz"} for m in ("t2", "t1b")])
    return {"csv": path, "model": save_tiny_model(tmp_path / "m.pt"), "out": tmp_path / "out"}


def _summary(job: dict[str, Path]) -> dict[str, dict[str, str]]:
    with (job["out"] / "summary.csv").open(newline="") as handle:
        return {row["name"]: row for row in csv.DictReader(handle)}


def _set_cells(job: dict[str, Path], *cells: str) -> None:
    rows = list(csv.DictReader(job["csv"].open(newline="")))
    for row, cell in zip(rows, cells):
        row["contrast"] = cell
    _write_rows(job["csv"], rows)


def test_batch_detects_other_contrasts_per_pair_and_records_them(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_batch(job)) == 0
    summary = _summary(job)
    assert summary[T2_ROW]["contrast_used"] == "different"  # auto found the T2
    assert summary[T1_ROW]["contrast_used"] == "same"
    assert summary[T2_ROW]["contrast"] == ""  # auto: not a setting to record
    record = json.loads((job["out"] / "pairs" / T2_ROW / "record.json").read_text())
    assert record["contrast_used"] == "different" and record["settings"]["similarity"] == "ngf"
    capsys.readouterr()
    # --contrast same: every pair as read, and a rerun with it is refused without --overwrite
    assert main(_batch(job, "--contrast", "same")) == 2
    err = capsys.readouterr().err
    assert "2 of 2 pairs" in err and "contrast auto -> same" in err
    assert main(_batch(job, "--contrast", "same", "--overwrite")) == 0
    summary = _summary(job)
    assert {row["contrast_used"] for row in summary.values()} == {"same"}
    assert {row["contrast"] for row in summary.values()} == {"same"}


def test_a_rows_contrast_cell_wins_over_the_option(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _set_cells(job, "same", "Different")
    first, second = read_pairs(job["csv"])
    assert (first.contrast, second.contrast) == ("same", "different")
    assert main(_batch(job, "--contrast", "auto")) == 0
    summary = _summary(job)
    assert summary[T2_ROW]["contrast_used"] == "same"
    assert summary[T1_ROW]["contrast_used"] == "different"
    assert (summary[T2_ROW]["contrast"], summary[T1_ROW]["contrast"]) == ("same", "different")
    capsys.readouterr()
    _set_cells(job, "", "")  # empty cells: the option's (auto), so the rows' records differ
    assert main(_batch(job)) == 2
    assert "contrast same -> auto" in capsys.readouterr().err


def test_bad_contrast_cell_is_one_line_naming_row_and_column_before_any_work(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _set_cells(job, "", "t2")
    assert main(_batch(job)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("hyperreg batch: error: ")
    assert "row 1 (line 3), column 'contrast'" in err and "'t2'" in err
    assert "auto, same, different" in err
    assert not job["out"].exists()  # nothing written
    with pytest.raises(ValueError, match="row 1 .line 3., column 'contrast'"):
        read_pairs(job["csv"])
    assert main(_batch(job, "--contrast", "t1")) == 2  # the option: argparse's choices
    assert "--contrast" in capsys.readouterr().err
