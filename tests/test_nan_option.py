"""NaN/inf voxels: an error that names --replace-nonfinite, and the option that replaces them."""

from __future__ import annotations

import logging
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from lambda_helpers import write_nifti, write_pair

from hyperreg.cli import main
from hyperreg.geometry.io import load_volume


@pytest.fixture()
def pair(tmp_path: Path) -> dict[str, Path]:
    """A tiny 2D pair whose moving image has 3 NaN voxels and 1 inf."""
    paths = write_pair(tmp_path / "data", "a")
    data = np.asanyarray(nib.load(paths["moving"]).dataobj).astype(np.float32)
    data[0, :3] = np.nan
    data[1, 0] = np.inf
    paths["moving"] = write_nifti(tmp_path / "data" / "a_moving_nan.nii.gz", data)
    paths["out"] = tmp_path / "out"
    return paths


def _register(pair: dict[str, Path], *extra: str) -> list[str]:
    return ["register", "--model", "hypermorph-2d", "--moving", str(pair["moving"]), "--fixed",
            str(pair["fixed"]), "--moved", str(pair["out"] / "moved.nii.gz"), "--init", "none",
            "--refine", "0", "--lambda", "0.5", "--device", "cpu", *extra]  # fmt: skip


def test_the_nan_error_names_the_option(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_register(pair)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"'{pair['moving']}' has 4 non-finite voxels (NaN or inf)" in err
    assert "--replace-nonfinite VALUE" in err
    assert not pair["out"].exists()


def test_replace_nonfinite_registers_and_says_so(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_register(pair, "--replace-nonfinite", "0")) == 0
    err = capsys.readouterr().err
    assert f"replaced 4 non-finite voxels (NaN or inf) with 0 in '{pair['moving']}'" in err
    moved = np.asanyarray(nib.load(pair["out"] / "moved.nii.gz").dataobj)
    assert np.isfinite(moved).all()


@pytest.mark.parametrize("value", ["nan", "inf", "x"])
def test_replace_nonfinite_takes_a_finite_number(
    pair: dict[str, Path], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_register(pair, "--replace-nonfinite", value)) == 2
    assert "argument --replace-nonfinite: must be a" in capsys.readouterr().err


def test_batch_and_affine_take_the_option(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    csv = pair["out"].parent / "pairs.csv"
    csv.write_text(f"moving,fixed\n{pair['moving']},{pair['fixed']}\n")
    batch = ["batch", "--model", "hypermorph-2d", "--pairs", str(csv), "--out",
             str(pair["out"] / "batch"), "--init", "none", "--refine", "0", "--device", "cpu",
             "--no-progress"]  # fmt: skip
    assert main(batch) == 1  # the pair fails, saying how to go on
    err = capsys.readouterr().err
    assert "4 non-finite voxels" in err and "--replace-nonfinite VALUE" in err
    # what the batch stores names the option too, not the library's argument
    stored = (pair["out"] / "batch" / "failures.csv").read_text()
    assert "--replace-nonfinite VALUE" in stored and "replace_nonfinite" not in stored
    assert main([*batch, "--replace-nonfinite", "0"]) == 0
    assert "1 registered, 0 already done, 0 failed" in capsys.readouterr().out
    affine = ["affine", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"]),
              "--init", "none", "--moved", str(pair["out"] / "affine.nii.gz")]  # fmt: skip
    assert main(affine) == 2
    assert "--replace-nonfinite VALUE" in capsys.readouterr().err
    assert main([*affine, "--replace-nonfinite", "-1"]) == 0


def test_load_volume_replaces_with_the_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = np.ones((6, 5, 4), np.float32)
    data[1, 2, 3] = np.nan
    path = write_nifti(tmp_path / "nan.nii.gz", data)
    with pytest.raises(ValueError, match="'replace_nonfinite' VALUE"):
        load_volume(path)
    with caplog.at_level(logging.WARNING, logger="hyperreg.geometry.io"):
        volume = load_volume(path, replace_nonfinite=-2.5)
    assert volume.data[1, 2, 3] == -2.5 and volume.data[0, 0, 0] == 1.0
    assert "with -2.5 in" in caplog.text
    with pytest.raises(ValueError, match="'replace_nonfinite' must be a finite number"):
        load_volume(path, replace_nonfinite=float("nan"))
    labels = write_nifti(tmp_path / "labels.nii.gz", data)
    with pytest.raises(ValueError, match="label map must be finite"):
        load_volume(labels, label=True, replace_nonfinite=0.0)
