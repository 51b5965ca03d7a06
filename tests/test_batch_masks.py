"""Cost masks outside ``register``: the pair CSV's ``fixed_mask``/``moving_mask`` columns of
``batch`` (read, checked before any work, passed to the pair, recorded) and ``view``'s
``--fixed-mask``/``--moving-mask``.

Tiny 2D pairs and the tiny untrained model of lambda_helpers (seconds on a CPU).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from lambda_helpers import SHAPE, save_tiny_model, tiny_model, write_nifti, write_pair

import hyperreg.apps.register as register_module
import hyperreg.apps.view as view_module
from hyperreg.apps.inputs import check_pair_masks, read_pairs
from hyperreg.cli import main


def _mask(path: Path, value: int = 1) -> Path:
    """A mask of the test pairs' grid: ``value`` in a central block, 0 elsewhere."""
    data = np.zeros((*SHAPE, 1), dtype=np.uint8)
    data[4:20, 4:16] = value
    return write_nifti(path, data)


@pytest.fixture()
def job(tmp_path: Path) -> dict[str, Path]:
    """Two pairs, the first with both masks (relative paths), the second without."""
    data = tmp_path / "data"
    rows = []
    for index in range(2):
        row = {k: p.name for k, p in write_pair(data, f"p{index}").items()}
        row["fixed_mask"] = _mask(data / "keep.nii.gz").name if index == 0 else ""
        row["moving_mask"] = row["fixed_mask"]
        rows.append(row)
    path = data / "pairs.csv"
    _write_rows(path, rows)
    return {
        "csv": path,
        "data": data,
        "model": save_tiny_model(tmp_path / "model.pt"),
        "out": tmp_path / "out",
    }


def _write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _batch(job: dict[str, Path], *extra: str) -> list[str]:
    args = ["batch", "--model", str(job["model"]), "--pairs", str(job["csv"]), "--refine", "0"]
    return [*args, "--out", str(job["out"]), "--no-progress", "--init", "none", *extra]


def test_read_pairs_reads_the_mask_columns(job: dict[str, Path]) -> None:
    first, second = read_pairs(job["csv"])
    assert first.fixed_mask == job["data"] / "keep.nii.gz" == first.moving_mask
    assert second.fixed_mask is None and second.moving_mask is None


def test_batch_passes_each_rows_masks_and_records_them(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[object, object]] = []
    real = register_module.load_pair

    def spy(*args: object, **kwargs: object) -> object:
        seen.append((kwargs.get("fixed_mask"), kwargs.get("moving_mask")))
        return real(*args, **kwargs)

    monkeypatch.setattr(register_module, "load_pair", spy)
    assert main(_batch(job)) == 0
    keep = job["data"] / "keep.nii.gz"
    assert sorted(seen, key=str) == sorted([(keep, keep), (None, None)], key=str)
    records = {p.parent.name: json.loads(p.read_text()) for p in job["out"].rglob("record.json")}
    with_masks = records["p0_moving__to__p0_fixed"]
    assert with_masks["fixed_mask"] == str(keep) == with_masks["moving_mask"]
    assert "fixed_mask" not in records["p1_moving__to__p1_fixed"]
    with (job["out"] / "summary.csv").open(newline="") as handle:
        summary = {row["name"]: row for row in csv.DictReader(handle)}
    assert summary["p0_moving__to__p0_fixed"]["moving_mask"] == str(keep)
    assert summary["p1_moving__to__p1_fixed"]["moving_mask"] == ""
    capsys.readouterr()
    # the masks are part of a pair's settings: a rerun without them is refused, then redone
    rows = list(csv.DictReader(job["csv"].open(newline="")))
    rows[0]["moving_mask"] = ""
    _write_rows(job["csv"], rows)
    assert main(_batch(job)) == 2
    err = capsys.readouterr().err
    assert "1 of 2 pairs" in err and "moving_mask" in err
    assert main(_batch(job, "--overwrite")) == 0
    assert "1 registered, 1 already done" in capsys.readouterr().out


@pytest.mark.parametrize(("value", "expected"), [(2, "other than 0 and 1 (2)"), (0, "empty")])
def test_batch_bad_mask_cell_is_one_line_naming_row_and_column_before_any_work(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str], value: int, expected: str
) -> None:
    bad = _mask(job["data"] / "bad.nii.gz", value)
    rows = list(csv.DictReader(job["csv"].open(newline="")))
    rows[1]["moving_mask"] = bad.name
    _write_rows(job["csv"], rows)
    assert main(_batch(job)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("hyperreg batch: error: ")
    assert "row 1 (line 3), column 'moving_mask'" in err and "bad.nii.gz" in err
    assert expected in err
    assert not job["out"].exists()  # nothing written
    with pytest.raises(ValueError, match="row 1 .line 3., column 'moving_mask'"):
        check_pair_masks("run_batch", job["csv"], read_pairs(job["csv"]))


def test_open_view_passes_its_masks_to_the_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_pair(tmp_path, "v")
    keep = _mask(tmp_path / "keep.nii.gz")
    seen: dict[str, object] = {}
    real = view_module.load_pair

    def spy(*args: object, **kwargs: object) -> object:
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(view_module, "load_pair", spy)
    session = view_module.open_view(
        tiny_model(),
        files["moving"],
        files["fixed"],
        init="none",
        grid=[0.5],
        fixed_mask=keep,
        moving_mask=keep,
    )
    assert seen["fixed_mask"] == keep and seen["moving_mask"] == keep
    assert session.pair.moving_mask is not None and session.pair.fixed_mask is not None
    assert int(session.pair.fixed_mask.data.sum()) == 16 * 12


def test_view_bad_mask_is_one_line_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = write_pair(tmp_path, "v")
    bad = _mask(tmp_path / "bad_mask.nii.gz", 2)
    model = save_tiny_model(tmp_path / "model.pt")
    args = ["view", "--model", str(model), "--moving", str(files["moving"])]
    args += ["--fixed", str(files["fixed"]), "--no-browser", "--out", str(tmp_path / "saved")]
    assert main([*args, "--moving-mask", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hyperreg view: error: argument --moving-mask: ")
    assert "bad_mask.nii.gz" in err and "\n" not in err
