"""Fine-tuning keeps the model: ``hyperreg train --init MODEL`` carries over the training grid,
voxel size, orientation, objective with its label term, passes, flip averaging, default λ and
refinement and the step count of the init model unless the command line overrides them; it
prints the new model's defaults and writes a model card.

A tiny 3D init model (a checkpoint written here with those settings recorded) is fine-tuned
for 2 steps on three tiny 3D people; the bundled hypermorph-3d on two shared IXI people is the
slow test (skipped without the shared data).
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from lambda_helpers import blob, labels_of, write_nifti
from shared_paths import needs_data
from shared_paths import DATA

from hyperreg.apps.models import resolve_model
from hyperreg.cli import main
from hyperreg.config import ModelConfig
from hyperreg.method.model import HyperMorph, load_checkpoint, save_checkpoint
from hyperreg.method.objective import Objective

GRID = (16, 16, 16)


def _people(folder: Path, count: int = 3) -> Path:
    """``count`` people, one folder each: a 3D blob image and its label map (RAS, 1 mm)."""
    for index in range(count):
        person = folder / f"p{index}"
        person.mkdir(parents=True)
        centre = (7.0 + index, 8.0 - 0.5 * index, 8.0)
        image = blob((14, 15, 13), centre, sigma=3.0)
        write_nifti(person / "image.nii.gz", image)
        write_nifti(person / "seg.nii.gz", labels_of(image))
    return folder


def _init_model(path: Path) -> Path:
    """A tiny 3D model that records what a bundled one does: RAS, two passes, flip
    averaging, a Dice label term on a 2x coarser grid, its run's grid, a default λ and
    refinement, and 40 steps in all (its file's own step: 15)."""
    torch.manual_seed(0)
    config = ModelConfig(
        ndim=3,
        enc_channels=(4, 4, 4, 4),
        dec_channels=(4,) * 7,
        hyper_hidden=(8, 8),
        orientation="RAS",
        passes=2,
        flip_average=True,
    )
    model = HyperMorph(config)
    model.objective = Objective(label_loss="dice", label_weight=0.5, label_downsize=2)
    train_config = {"shape": list(GRID), "max_labels": 5, "conform": True}
    return save_checkpoint(
        model,
        path,
        step=15,
        total_steps=40,
        train_config=train_config,
        default_lambda=0.3,
        default_lambda_note="its card's λ*",
        default_refine=3,
        default_refine_note="its card's choice",
    )


def _train(init: Path, data: Path, out: Path, *extra: str) -> list[str]:
    args = ["train", "--init", str(init), "--data", str(data), "--out", str(out)]
    args += ["--steps", "2", "--batch-size", "1", "--holdout", "p2", "--test-fraction", "0"]
    return [*args, "--device", "cpu", "--no-progress", "--seed", "1", *extra]


def test_fine_tuning_keeps_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    init = _init_model(tmp_path / "init.pt")
    data = _people(tmp_path / "data")
    out = tmp_path / "run"
    assert main(_train(init, data, out)) == 0  # no --shape, no --label-loss
    printed = capsys.readouterr().out
    model, payload = load_checkpoint(out / "model.pt")
    # grid, orientation, objective with its label term, passes and flips came along
    stored = json.loads((out / "config.json").read_text())
    assert stored["shape"] == list(GRID) and stored["conform"] is True
    assert (stored["label_loss"], stored["label_weight"], stored["label_downsize"]) == (
        "dice",
        0.5,
        2,
    )
    assert stored["max_labels"] == 5
    assert payload["objective"]["label_loss"] == "dice"
    assert (model.config.orientation, model.config.passes, model.config.flip_average) == (
        "RAS",
        2,
        True,
    )
    # the step count continues from the init model's steps in all, not its file's step
    assert payload["step"] == 2 and payload["total_steps"] == 42
    # it registers with the init model's defaults, said with their source
    resolved = resolve_model(out, "cpu")
    assert resolved.default_lambda.lam == 0.3
    assert resolved.default_lambda.source.endswith("(kept at fine-tuning): its card's λ*")
    assert resolved.model.default_refine.steps == 3
    # train ends as 'hyperreg models' lists a model, and writes a card
    assert "    defaults: λ 0.3, refinement 3 steps, passes 2, flip averaging" in printed
    assert "2 steps fine-tuning" in printed and "42 in all" in printed
    if (
        resolved.default_lambda.lam
        != max(  # validation's own choice is said beside it
            (payload["validation"][f"dice_{lam:g}"], lam) for lam in (0.1, 0.5, 0.9)
        )[1]
    ):
        assert "validation prefers λ" in printed
    card = (out / "model.md").read_text()
    assert "42 in all" in card and "| people trained on (2) | p0, p1 |" in card
    assert "validated on (1) | p2" in card
    assert "| 0.5 |" in card  # a validation row per --val-lambdas value


def test_fine_tuning_overrides_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    init = _init_model(tmp_path / "init.pt")
    data = _people(tmp_path / "data")
    out = tmp_path / "run"
    extra = ["--label-loss", "none", "--passes", "1", "--no-flip-average", "--shape", "16", "16"]
    extra += ["16", "--default-lambda", "0.45", "--default-refine", "0"]
    assert main(_train(init, data, out, *extra)) == 0
    model, payload = load_checkpoint(out / "model.pt")
    assert payload["objective"]["label_loss"] == "none"
    assert (model.config.passes, model.config.flip_average) == (1, False)
    resolved = resolve_model(out, "cpu")
    assert resolved.default_lambda.lam == 0.45
    assert resolved.model.default_refine.steps == 0
    printed = capsys.readouterr().out
    assert "    defaults: λ 0.45, refinement 0 steps, passes 1" in printed


def test_default_lambda_chosen_on_validation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    init = _init_model(tmp_path / "init.pt")
    data = _people(tmp_path / "data")
    out = tmp_path / "run"
    assert main(_train(init, data, out, "--default-lambda", "validation")) == 0
    resolved = resolve_model(out, "cpu")
    assert resolved.default_lambda.lam in (0.1, 0.5, 0.9)  # one of --val-lambdas
    assert resolved.default_lambda.source.startswith("the best validation Dice of")
    _, payload = load_checkpoint(out / "model.pt")
    best = max((payload["validation"][f"dice_{lam:g}"], lam) for lam in (0.1, 0.5, 0.9))
    assert resolved.default_lambda.lam == best[1]
    printed = capsys.readouterr().out
    assert f"    defaults: λ {best[1]:g}, refinement 3 steps" in printed


def test_a_resumed_fine_tuning_counts_on(tmp_path: Path) -> None:
    init = _init_model(tmp_path / "init.pt")
    data = _people(tmp_path / "data")
    out = tmp_path / "run"
    assert main(_train(init, data, out, "--checkpoint-every", "1")) == 0
    more = ["train", "--resume", str(out), "--data", str(data), "--steps", "3"]
    assert main([*more, "--device", "cpu", "--no-progress"]) == 0
    _, payload = load_checkpoint(out / "model.pt")
    assert payload["step"] == 3 and payload["total_steps"] == 43
    assert resolve_model(out, "cpu").default_lambda.lam == 0.3  # the run's own, kept


def test_keep_needs_an_init_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _people(tmp_path / "data")
    args = ["train", "--ndim", "3", "--data", str(data), "--out", str(tmp_path / "run")]
    assert main([*args, "--default-lambda", "keep", "--steps", "1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--default-lambda" in err and "--init" in err
    assert not (tmp_path / "run" / "model.pt").exists()


IXI_PEOPLE = ("IXI162-HH-1548", "IXI012-HH-1211")


@pytest.mark.slow
@needs_data("ixi-2mm", "IXI162-HH-1548_T1.nii.gz")
def test_bundled_3d_fine_tuned_registers_with_its_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hypermorph-3d fine-tuned 2 steps on two IXI people without --shape: it keeps λ 0.2,
    refinement 30 steps, two passes and flip averaging, and has 7860 steps in all."""
    data = tmp_path / "data"
    images = []
    for person in IXI_PEOPLE:  # one folder per person, links to the shared files (no copies)
        (data / person).mkdir(parents=True)
        for kind in ("T1", "DLMUSE"):
            source = DATA / "ixi-2mm" / f"{person}_{kind}.nii.gz"
            if not source.is_file():
                pytest.skip(f"shared file not found: {source}")
            link = data / person / f"{'image' if kind == 'T1' else 'seg'}.nii.gz"
            link.symlink_to(source)
        images.append(data / person / "image.nii.gz")
    out = tmp_path / "run"
    args = ["train", "--init", "hypermorph-3d", "--data", str(data), "--out", str(out)]
    args += ["--steps", "2", "--batch-size", "1", "--device", "cpu", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "    defaults: λ 0.2, refinement 30 steps, passes 2, flip averaging" in printed
    _, payload = load_checkpoint(out / "model.pt")
    assert payload["total_steps"] == 7860 and payload["objective"]["label_loss"] == "dice"
    moved = tmp_path / "moved.nii.gz"
    reg = ["register", "--model", str(out), "--moving", str(images[0]), "--fixed", str(images[1])]
    assert main([*reg, "--moved", str(moved), "--device", "cpu", "--init", "none", "-v"]) == 0
    printed = capsys.readouterr().out
    assert "λ = 0.2: the model's default λ" in printed
    assert "2 network passes" in printed and "mirrored left-right" in printed
    assert "refined" in printed and "30 steps" in printed
    assert np.isfinite(np.asarray(nib.load(moved).dataobj)).all()
