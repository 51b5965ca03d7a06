"""The registration pipeline (registration/pipeline.py) and the contracts every command shares:
one Dice convention, one set of defaults, input checks before any expensive stage, output paths
checked before any work."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from lambda_helpers import SHAPE, blob, labels_of, save_tiny_model, tiny_model, write_nifti

from hyperreg.cli import main
from hyperreg.method.metrics import input_labels, registration_dice
from hyperreg.registration.pipeline import DEFAULT_INIT, InputError, load_pair


# --- the Dice convention ----------------------------------------------------------------------


def test_registration_dice_scores_the_inputs_labels_and_an_erased_label_as_zero() -> None:
    moving_seg = np.array([[1, 1, 2, 3]])
    fixed_seg = np.array([[1, 1, 2, 0]])
    moved_seg = np.array([[1, 1, 0, 0]])  # label 2 erased by the warp; 3 too
    scores = registration_dice(moved_seg, fixed_seg, moving_seg)
    assert scores == {1: 1.0, 2: 0.0, 3: 0.0}  # labels of the inputs, background excluded
    assert input_labels(moving_seg, fixed_seg) == [1, 2, 3]
    # without the moving input: the labels of the moved and fixed maps
    assert registration_dice(moved_seg, fixed_seg) == {1: 1.0, 2: 0.0}
    assert registration_dice(moved_seg, fixed_seg, labels=[1, 7]) == {1: 1.0, 7: 0.0}


def _pair_with_a_fixed_only_label(folder: Path) -> dict[str, Path]:
    """A pair whose fixed label map holds label 9, which the moving one lacks."""
    folder.mkdir(parents=True, exist_ok=True)
    moving, fixed = blob(SHAPE, (11, 9)), blob(SHAPE, (13, 10))
    fixed_seg = labels_of(fixed)
    fixed_seg[:3, :3] = 9
    data = {
        "moving": moving,
        "fixed": fixed,
        "moving_seg": labels_of(moving),
        "fixed_seg": fixed_seg,
    }
    return {k: write_nifti(folder / f"{k}.nii.gz", v[..., None]) for k, v in data.items()}


def test_every_command_scores_dice_over_the_labels_of_the_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """register, sweep, tune and evaluate agree, and a label only the fixed map holds counts 0
    (the old convention, labels present in both maps, dropped it and reported a higher mean)."""
    from hyperreg.apps.register import register_files
    from hyperreg.apps.evaluate import evaluate_csv

    files = _pair_with_a_fixed_only_label(tmp_path / "data")
    model = save_tiny_model(tmp_path / "model.pt")
    segs = {"moving_seg": files["moving_seg"], "fixed_seg": files["fixed_seg"]}
    # an untrained model: its fields as given (never-worse rule off), as tune scores them
    result = register_files(
        tiny_model(),
        files["moving"],
        files["fixed"],
        0.5,
        init="none",
        moved_seg=tmp_path / "moved_seg.nii.gz",
        never_worse=False,
        **segs,
    )
    assert result.dice is not None and set(result.dice) == {3, 4, 9} and result.dice[9] == 0.0
    register_dice = result.mean_dice
    assert register_dice == pytest.approx(np.mean([result.dice[k] for k in (3, 4, 9)]))
    # sweep
    common = ["--model", str(model), "--device", "cpu", "--init", "none"]
    keep = ["--keep-worse"]  # tune scores the model's own fields; register and sweep alike
    pair_args = [
        "--moving",
        str(files["moving"]),
        "--fixed",
        str(files["fixed"]),
        "--moving-seg",
        str(files["moving_seg"]),
        "--fixed-seg",
        str(files["fixed_seg"]),
    ]
    assert (
        main(
            [
                "sweep",
                *common,
                *keep,
                *pair_args,
                "--lambdas",
                "0.5",
                "--out",
                str(tmp_path / "sweep"),
            ]
        )
        == 0
    )
    row = (tmp_path / "sweep" / "sweep.csv").read_text().splitlines()
    header, values = row[0].split(","), row[1].split(",")
    assert float(values[header.index("mean_dice")]) == pytest.approx(register_dice, abs=1e-6)
    assert float(values[header.index("dice_9")]) == 0.0
    # tune
    csv = tmp_path / "pairs.csv"
    csv.write_text(
        "moving,fixed,moving_seg,fixed_seg\n"
        + ",".join(str(files[k]) for k in ("moving", "fixed", "moving_seg", "fixed_seg"))
        + "\n"
    )
    assert (
        main(
            [
                "tune",
                *common,
                "--pairs",
                str(csv),
                "--lambdas",
                "0.5,1",
                "--refine-rounds",
                "0",
                "--out",
                str(tmp_path / "tune"),
            ]
        )
        == 0
    )
    grid = json.loads((tmp_path / "tune" / "tune.json").read_text())["grid"]
    at = next(r for r in grid if r["lambda"] == 0.5)
    assert at["mean_dice"] == pytest.approx(register_dice, abs=1e-6)
    # evaluate, with the moving label map named
    rows = tmp_path / "evaluate.csv"
    rows.write_text(
        f"moved_seg,fixed_seg,moving_seg\n{tmp_path / 'moved_seg.nii.gz'},"
        f"{files['fixed_seg']},{files['moving_seg']}\n"
    )
    report = evaluate_csv(rows, tmp_path / "evaluation")
    assert report.pairs[0].mean_dice == pytest.approx(register_dice, abs=1e-6)
    capsys.readouterr()


# --- one set of defaults ------------------------------------------------------------------------


def test_python_and_command_line_share_the_affine_default() -> None:
    from hyperreg.apps.register import register_files
    from hyperreg.apps.sweep import sweep_files
    from hyperreg.apps.tune import tune_lambda
    from hyperreg.cli.run import build_parser

    assert DEFAULT_INIT == "affine"
    for function in (register_files, sweep_files, tune_lambda):
        assert inspect.signature(function).parameters["init"].default == DEFAULT_INIT
    parser = build_parser()
    for command in ("register", "sweep", "tune", "batch"):
        args = parser.parse_args(_minimal(command))
        assert args.init == DEFAULT_INIT, command


def _minimal(command: str) -> list[str]:
    return {
        "register": ["register", "--moving", "m", "--fixed", "f", "--lambda", "0.5"],
        "sweep": ["sweep", "--moving", "m", "--fixed", "f", "--out", "o"],
        "tune": ["tune", "--pairs", "p", "--out", "o"],
        "batch": ["batch", "--pairs", "p", "--out", "o"],
    }[command]


# --- checks before any expensive stage ----------------------------------------------------------


def test_a_2d_model_on_a_3d_pair_fails_before_the_affine_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hyperreg.registration.pipeline as pipeline

    volume = blob((12, 12, 12), (6, 6, 6))
    moving = write_nifti(tmp_path / "m.nii.gz", volume)
    fixed = write_nifti(tmp_path / "f.nii.gz", volume)

    def never(*args, **kwargs):
        raise AssertionError("the affine stage ran")

    monkeypatch.setattr(pipeline, "register_affine", never)
    with pytest.raises(InputError, match="the model is 2D but") as caught:
        load_pair(moving, fixed, model=tiny_model(2), init="affine")
    assert caught.value.argument == "model"


def test_label_maps_of_two_labellings_warn_before_dice(tmp_path: Path) -> None:
    # the same anatomy, ids 3 and 4 in one map and 13 and 14 in the other: Dice would be 0
    image = blob(SHAPE, (11, 9))[..., None]
    seg = labels_of(image)
    moving = write_nifti(tmp_path / "m.nii.gz", image)
    fixed = write_nifti(tmp_path / "f.nii.gz", image)
    ours = write_nifti(tmp_path / "ms.nii.gz", seg)
    other = write_nifti(tmp_path / "fs.nii.gz", np.where(seg > 0, seg + 10, 0).astype(np.uint8))
    with pytest.warns(UserWarning, match=r"share only 0 of the 4 label ids either holds"):
        load_pair(moving, fixed, moving_seg=ours, fixed_seg=other, init="none")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one labelling: no warning
        pair = load_pair(moving, fixed, moving_seg=ours, fixed_seg=ours, init="none")
    assert pair.shared_labels == pair.labels == [3, 4]  # the ids both maps hold
    one_more = write_nifti(tmp_path / "fs5.nii.gz", np.where(seg == 4, 5, seg).astype(np.uint8))
    with pytest.warns(UserWarning, match=r"share only 1 of the 3 label ids"):
        pair = load_pair(moving, fixed, moving_seg=ours, fixed_seg=one_more, init="none")
    assert pair.labels == [3, 4, 5] and pair.shared_labels == [3]


def test_init_none_without_overlap_is_an_error(tmp_path: Path) -> None:
    image = blob(SHAPE, (11, 9))[..., None]
    far = np.eye(4)
    far[0, 3] = 1000.0
    moving = write_nifti(tmp_path / "m.nii.gz", image, far)
    fixed = write_nifti(tmp_path / "f.nii.gz", image, np.eye(4))
    with pytest.raises(InputError, match="do not overlap in world space.*'init' 'affine'") as err:
        load_pair(moving, fixed, init="none")
    assert err.value.argument == "init"
    load_pair(moving, fixed, init="affine")  # the affine stage starts from the centres of mass


@pytest.mark.parametrize("role", ["moving", "fixed"])
def test_a_constant_image_is_an_error_not_a_warning(tmp_path: Path, role: str) -> None:
    image = write_nifti(tmp_path / "image.nii.gz", blob(SHAPE, (11, 9))[..., None])
    constant = write_nifti(tmp_path / "zero.nii.gz", np.zeros((*SHAPE, 1), np.float32))
    files = {"moving": image, "fixed": image, role: constant}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not warned about first (a warning would raise)
        with pytest.raises(
            InputError, match=r"zero\.nii\.gz' is constant \(all voxels = 0\.0\)"
        ) as err:
            load_pair(files["moving"], files["fixed"])
    assert err.value.argument == role and "nothing to register" in str(err.value)


def test_an_unwritable_output_fails_before_registration_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hyperreg.apps.register as register_app  # imported before patching: it binds
    import hyperreg.registration.pipeline as pipeline  # load_pair by name at import

    files = _pair_with_a_fixed_only_label(tmp_path / "data")
    model = save_tiny_model(tmp_path / "model.pt")

    def never(*args, **kwargs):
        raise AssertionError("registration ran")

    monkeypatch.setattr(pipeline, "load_pair", never)
    monkeypatch.setattr(register_app, "load_pair", never)
    args = [
        "register",
        "--model",
        str(model),
        "--device",
        "cpu",
        "--lambda",
        "0.5",
        "--moving",
        str(files["moving"]),
        "--fixed",
        str(files["fixed"]),
    ]
    assert main([*args, "--moved", "/proc/m.nii.gz"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--moved" in err and "/proc" in err


def test_a_missing_output_folder_is_created_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _pair_with_a_fixed_only_label(tmp_path / "data")
    model = save_tiny_model(tmp_path / "model.pt")
    moved = tmp_path / "new" / "folder" / "m.nii.gz"
    args = [
        "register",
        "--model",
        str(model),
        "--device",
        "cpu",
        "--lambda",
        "0.5",
        "--init",
        "none",
        "--moving",
        str(files["moving"]),
        "--fixed",
        str(files["fixed"]),
    ]
    assert main([*args, "--moved", str(moved)]) == 0
    assert moved.is_file()
    out = capsys.readouterr().out
    assert f"created folder {moved.parent}" in out
    assert out.index("created folder") < out.index("wrote")  # said before what went into it


def test_a_stage_that_keeps_the_identity_scores_the_pair_as_it_came(tmp_path: Path) -> None:
    """An affine stage that keeps the identity (the same image twice) has an affine-alone Dice,
    the Dice as the pair came (label maps that differ); without a stage there is none."""
    image = blob(SHAPE, (11, 9))[..., None]
    paths = {
        "moving": write_nifti(tmp_path / "m.nii.gz", image),
        "fixed": write_nifti(tmp_path / "f.nii.gz", image),
        "moving_seg": write_nifti(tmp_path / "ms.nii.gz", labels_of(image)),
        "fixed_seg": write_nifti(
            tmp_path / "fs.nii.gz", labels_of(blob(SHAPE, (13, 10))[..., None])
        ),
    }
    pair = load_pair(**paths, init="affine")
    assert pair.affine is not None and pair.affine.identity_kept and not pair.chained
    assert pair.dice_before is not None and pair.dice_before < 0.99
    assert pair.dice_affine == pair.dice_before
    assert load_pair(**paths, init="none").dice_affine is None


def test_identity_kept_says_why_and_shows_no_mi_change() -> None:
    """The affine stage keeps the identity for small motion too: the line must not claim "no MI
    gain" with "MI before -> before"."""
    from hyperreg.cli.messages import affine_text
    from hyperreg.registration.pipeline import AffineStage

    kept = AffineStage("affine", 1.2, -0.61, -0.61, identity_kept=True)
    text = affine_text("affine", kept)
    assert "identity kept" in text and "under 3 voxels" in text and "->" not in text
    moved = AffineStage("affine", 1.2, -0.61, -0.66, identity_kept=False)
    assert "-0.6100 -> -0.6600" in affine_text("affine", moved)


def test_label_names_auto_knows_the_freesurfer_hypointensity_ids() -> None:
    from hyperreg.geometry.structures import structure_names

    names = structure_names([4, 43, 78, 79, 80, 81, 82])
    assert names[78] == "Left-WM-hypointensities" and names[82] == "Right-non-WM-hypointensities"
    assert names[4] == "Left-Lateral-Ventricle"  # the whole map gets FreeSurfer names
