"""Test-time flip averaging (``ModelConfig.flip_average``): the network's flow averaged with
that of the pair mirrored left-right, in eval mode only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from lambda_helpers import blob, tiny_model, write_nifti

from hyperreg.cli import main

from hyperreg.config import ModelConfig
from hyperreg.method.model import HyperMorph, load_checkpoint, save_checkpoint


def _flipping(model: HyperMorph, orientation: str = "RAS") -> HyperMorph:
    model.config = dataclasses.replace(model.config, orientation=orientation, flip_average=True)
    return model


def _pair(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    centre = tuple(s // 2 for s in shape)
    off = (centre[0] - 3, *centre[1:])  # off-centre along the left-right axis: not symmetric
    moving = torch.from_numpy(blob(shape, off, sigma=4.0).astype(np.float32))[None, None]
    fixed = torch.from_numpy(blob(shape, centre, sigma=5.0).astype(np.float32))[None, None]
    return moving, fixed


def _mirror(field: torch.Tensor, axis: int) -> torch.Tensor:
    """A displacement or velocity mirrored along spatial ``axis`` (its component there negated)."""
    out = field.flip(2 + axis).clone()
    out[:, axis] = -out[:, axis]
    return out


def test_the_flow_is_the_mean_of_the_pair_and_its_mirror() -> None:
    plain = tiny_model(ndim=3)
    flipping = _flipping(tiny_model(ndim=3))
    moving, fixed = _pair((16, 16, 16))
    with torch.no_grad():
        expected = (plain.predict_flow(moving, fixed, 0.3) + _mirror(
            plain.predict_flow(moving.flip(2), fixed.flip(2), 0.3), 0)) / 2  # fmt: skip
        got = flipping.predict_flow(moving, fixed, 0.3)
        alone = plain.predict_flow(moving, fixed, 0.3)
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, alone, atol=1e-4)  # the mirrored pass changed it


def test_flip_averaged_registration_is_left_right_equivariant() -> None:
    # a grid that needs no padding along the axis: mirroring the pair mirrors the field exactly
    model = _flipping(tiny_model(ndim=3))
    moving, fixed = _pair((16, 16, 16))
    with torch.no_grad():
        out = model(moving, fixed, 0.5)
        mirrored = model(moving.flip(2), fixed.flip(2), 0.5)
        plain = dataclasses.replace(model.config, flip_average=False)
        model.config = plain
        unaveraged = model(moving.flip(2), fixed.flip(2), 0.5)
    assert torch.allclose(mirrored.disp, _mirror(out.disp, 0), atol=1e-5)
    assert not torch.allclose(unaveraged.disp, _mirror(out.disp, 0), atol=1e-4)


def test_the_left_right_axis_follows_the_orientation() -> None:
    assert ModelConfig(ndim=3, orientation="RAS").flip_axis() == 0
    assert ModelConfig(ndim=3, orientation="PSR").flip_axis() == 2
    assert ModelConfig(ndim=3, orientation="ALS").flip_axis() == 1
    assert ModelConfig(ndim=3).flip_axis() is None
    plain = tiny_model(ndim=3)
    model = _flipping(tiny_model(ndim=3), "PSR")
    moving, fixed = _pair((16, 16, 16))
    with torch.no_grad():
        expected = (plain.predict_flow(moving, fixed, 0.3) + _mirror(
            plain.predict_flow(moving.flip(4), fixed.flip(4), 0.3), 2)) / 2  # fmt: skip
        assert torch.allclose(model.predict_flow(moving, fixed, 0.3), expected, atol=1e-6)


def test_training_mode_never_averages() -> None:
    plain, model = tiny_model(ndim=3), _flipping(tiny_model(ndim=3))
    moving, fixed = _pair((16, 16, 16))
    plain.train(), model.train()
    assert torch.allclose(model(moving, fixed, 0.3).disp, plain(moving, fixed, 0.3).disp)


def test_flip_average_needs_a_left_right_axis() -> None:
    with pytest.raises(ValueError, match="'flip_average' needs an 'orientation'"):
        ModelConfig(ndim=3, flip_average=True)
    with pytest.raises(ValueError, match="left-right axis"):
        ModelConfig(ndim=3, orientation="ASI", flip_average=True)


def test_flip_average_travels_in_the_checkpoint_and_is_not_architecture(tmp_path) -> None:
    model = _flipping(tiny_model(ndim=3))
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "m.pt"))[0]
    assert loaded.config.flip_average is True
    plain = dataclasses.replace(model.config, flip_average=False, orientation="")
    assert plain.architecture() == model.config.architecture()


def _flipping_file(path: Path, orientation: str = "RAS", flips: bool = True) -> Path:
    model = tiny_model(ndim=3)
    model.config = dataclasses.replace(model.config, orientation=orientation, flip_average=flips)
    return save_checkpoint(model, path)


def _nifti_pair(folder: Path) -> tuple[Path, Path]:
    moving, fixed = _pair((16, 16, 16))
    return (
        write_nifti(folder / "m.nii.gz", moving[0, 0].numpy()),
        write_nifti(folder / "f.nii.gz", fixed[0, 0].numpy()),
    )


def test_register_says_it_averages_and_the_option_turns_it_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moving, fixed = _nifti_pair(tmp_path)
    common = ["register", "--model", str(_flipping_file(tmp_path / "model.pt")),
              "--moving", str(moving), "--fixed", str(fixed), "--init", "none",
              "--device", "cpu", "--lambda", "0.3", "--passes", "1"]  # fmt: skip
    assert main([*common, "-v", "--warp", str(tmp_path / "on.nii.gz")]) == 0
    assert "mirrored left-right (the model's default" in capsys.readouterr().out
    assert main([*common, "--no-flip-average", "--warp", str(tmp_path / "off.nii.gz")]) == 0
    assert "mirrored" not in capsys.readouterr().out
    on = np.asarray(nib.load(tmp_path / "on.nii.gz").dataobj)
    off = np.asarray(nib.load(tmp_path / "off.nii.gz").dataobj)
    assert np.abs(on - off).max() > 1e-3


def test_flip_average_on_a_model_without_orientation_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moving, fixed = _nifti_pair(tmp_path)
    model = save_checkpoint(tiny_model(ndim=3), tmp_path / "plain.pt")
    out = tmp_path / "warp.nii.gz"
    args = ["register", "--model", str(model), "--moving", str(moving), "--fixed", str(fixed),
            "--init", "none", "--device", "cpu", "--flip-average", "--warp", str(out)]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "--flip-average" in err and "orientation" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_batch_records_flip_averaging_and_registers_again_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    moving, fixed = _nifti_pair(tmp_path)
    csv = tmp_path / "pairs.csv"
    csv.write_text(f"moving,fixed\n{moving},{fixed}\n")
    batch = ["batch", "--model", str(_flipping_file(tmp_path / "model.pt")), "--device", "cpu",
             "--init", "none", "--pairs", str(csv), "--out", str(tmp_path / "batch"),
             "--lambda", "0.3", "--no-progress"]  # fmt: skip
    assert main(batch) == 0
    (record,) = (tmp_path / "batch" / "pairs").glob("*/record.json")  # one pair
    assert json.loads(record.read_text())["flip_average"] is True
    caplog.set_level("INFO")
    assert main([*batch, "--no-flip-average", "--overwrite"]) == 0
    assert "flip_average True -> False" in caplog.text
    assert "flip_average" not in json.loads(record.read_text())
