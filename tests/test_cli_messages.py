"""What a user meets on the command line: one-line messages naming options, exit codes, outputs.

Each bad input is run in-process through ``hyperreg.cli.main`` on tmp_path files; the checks are
the exit code, that stderr is one line naming the option (and no Python function), and that
nothing was written.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from lambda_helpers import blob, save_tiny_model, write_nifti, write_pair

from hyperreg.apps.inputs import MAX_LABELS, check_label_map
from hyperreg.cli import build_parser, main
from hyperreg.cli.args import subparser
from hyperreg.cli.messages import UserWords


@pytest.fixture()
def pair(tmp_path: Path) -> dict[str, Path]:
    """A tiny 2D pair with label maps, a model, a run folder holding model.pt, an output path."""
    paths = write_pair(tmp_path / "data", "a")
    paths["model"] = save_tiny_model(tmp_path / "model.pt")
    run = tmp_path / "runs" / "oasis2d"
    run.mkdir(parents=True)
    save_tiny_model(run / "model.pt")
    paths["run"] = run
    paths["out"] = tmp_path / "out"
    return paths


def _register(pair: dict[str, Path], *extra: str, **over: Path) -> list[str]:
    p = {**pair, **over}
    return [
        "register",
        "--model",
        str(p["model"]),
        "--moving",
        str(p["moving"]),
        "--fixed",
        str(p["fixed"]),
        "--lambda",
        "0.5",
        "--device",
        "cpu",
        *extra,
    ]


def _sweep(pair: dict[str, Path], *extra: str, **over: Path) -> list[str]:
    p = {**pair, **over}
    args = ["sweep", "--model", str(p["model"]), "--moving", str(p["moving"])]
    args += ["--fixed", str(p["fixed"]), "--out", str(p["out"]), "--lambdas", "0,1"]
    return [*args, "--device", "cpu", *extra]


def _pairs_csv(pair: dict[str, Path], **over: Path) -> Path:
    row = {k: str({**pair, **over}[k]) for k in ("moving", "fixed", "moving_seg", "fixed_seg")}
    path = pair["moving"].parent / "pairs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    return path


def _tune(pair: dict[str, Path], *extra: str, **over: Path) -> list[str]:
    model = str({**pair, **over}["model"])
    args = ["tune", "--model", model, "--pairs", str(_pairs_csv(pair, **over))]
    return [*args, "--out", str(pair["out"]), "--lambdas", "0,1", "--device", "cpu", *extra]


def _batch(pair: dict[str, Path], *extra: str, **over: Path) -> list[str]:
    model = str({**pair, **over}["model"])
    args = ["batch", "--model", model, "--pairs", str(_pairs_csv(pair, **over))]
    return [*args, "--out", str(pair["out"]), "--lambda", "0.5", "--no-progress", "--device", "cpu"]


def _one_line_error(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hyperreg {command}: error: "), err
    assert len(err.splitlines()) == 1, err
    assert "(): " not in err, err  # no Python function names
    return err


def _intensity(pair: dict[str, Path]) -> Path:
    return pair["moving"]  # a Gaussian blob in [0, 1]: an intensity image


# --- 1. messages name the options, not functions or arguments -----------------------------------


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--moved", "{out}/a.nii.gz", "--warp", "{out}/a.nii.gz"), "--warp and --moved are the "),
        (("--moved", "{moving}"), "--moved would overwrite the input"),
        (("--moved", "{out}/a.txt"), "--moved must end in ('.nii.gz', '.nii')"),
        (
            ("--warp", "{out}/w.nii.gz", "--affine-out", "{out}/a.nii.gz"),
            "--affine-out must end in",
        ),
    ],
)
def test_register_output_messages_name_options(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], expected: str
) -> None:
    values = {"out": str(pair["out"]), "moving": str(pair["moving"])}
    args = _register(pair, *(e.format(**values) for e in extra))
    assert main(args) == 2
    err = _one_line_error(capsys, "register")
    assert expected in err
    assert "warp_out" not in err and "'moved'" not in err
    assert not pair["out"].exists()


def test_missing_input_names_its_option(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = pair["out"].parent / "nope.nii.gz"
    assert main(_register(pair, "--moved", str(pair["out"] / "m.nii.gz"), moving=missing)) == 2
    assert f"no such file: --moving '{missing}'" in _one_line_error(capsys, "register")


def test_device_message_names_the_option(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = _register(pair, "--moved", str(pair["out"] / "m.nii.gz"), "--device", "tpu")
    assert main(args) == 2
    err = _one_line_error(capsys, "register")
    assert "--device must be" in err and "'device'" not in err


def test_warnings_and_log_lines_name_no_function(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    constant = write_nifti(tmp_path / "constant.nii.gz", np.zeros((24, 20, 1), np.float32))
    args = _register(pair, "--moved", str(pair["out"] / "m.nii.gz"), fixed=constant)
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"hyperreg register: warning: --fixed '{constant}' is constant" in err
    assert "(): " not in err
    # tune logs its refinement rounds; batch logs a failed pair
    assert main(_tune(pair, "--refine-rounds", "1", "--refine-points", "2")) == 0
    err = capsys.readouterr().err
    assert "hyperreg tune: round 1 refines λ in [0, 1]" in err and "(): " not in err
    missing = tmp_path / "gone.nii.gz"
    pair = {**pair, "out": tmp_path / "batch"}
    assert main(_batch(pair, fixed=missing)) == 1
    err = capsys.readouterr().err
    assert f"hyperreg batch: pair00000 failed: no such file: '{missing}'" in err
    assert "(): " not in err


def test_user_words_maps_arguments_to_options() -> None:
    parser = build_parser()
    args = ["register", "--model", "run", "--moving", "m.nii.gz", "--fixed", "f"]
    words = UserWords(parser, parser.parse_args([*args, "--lambda", "0.5"]))
    assert words("register_files(): 'warp_out' and 'moved' are the same file 'x.nii.gz'") == (
        "--warp and --moved are the same file 'x.nii.gz'"
    )
    assert words("as_lambda_tensor(): 'lam' must lie in\n[0, 1]") == "--lambda must lie in [0, 1]"
    # a path the user gave is named by its option (not twice when the message names it)
    assert words("load_volume(): no such file: 'm.nii.gz'") == "no such file: --moving 'm.nii.gz'"
    assert words("load_checkpoint(): cannot read 'run'") == "cannot read --model 'run'"
    assert words("f(): 'model' is 'run'") == "--model is 'run'"
    assert words("'moving_seg' and 'unknown' stay") == "--moving-seg and 'unknown' stay"


# --- 2 and 3. --model: a run folder, a folder without model.pt, a file that is no checkpoint ----


def test_model_may_be_a_run_folder(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = _register(pair, "--moved", str(pair["out"] / "m.nii.gz"), model=pair["run"])
    assert main(args) == 0, capsys.readouterr().err
    assert (pair["out"] / "m.nii.gz").is_file()


@pytest.mark.parametrize("build", [_register, _sweep, _tune, _batch])
@pytest.mark.parametrize("kind", ["empty folder", "nifti", "missing"])
def test_bad_model_is_one_line_naming_model(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str], build, kind: str
) -> None:
    empty = pair["out"].parent / "runs" / "empty"
    empty.mkdir()
    (empty / "checkpoint_0000500.pt").write_bytes(b"")
    model = {"empty folder": empty, "nifti": pair["fixed"], "missing": empty / "nope.pt"}[kind]
    extra = ("--moved", str(pair["out"] / "m.nii.gz")) if build is _register else ()
    assert main(build(pair, *extra, model=model)) == 2
    command = build.__name__[1:]
    err = _one_line_error(capsys, command)
    assert "argument --model: " in err
    expected = {
        "empty folder": f"folder '{empty}' holds no model.pt",
        "nifti": f"'{pair['fixed']}' is not a hyperreg checkpoint (it is an image file)",
        "missing": f"no such file or folder: '{model}'",
    }[kind]
    assert expected in err
    if kind == "empty folder":
        assert "checkpoint_0000500.pt" in err  # what the folder does hold
    assert not pair["out"].exists()


def test_non_checkpoint_file_is_one_line(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = pair["out"].parent / "notes.txt"
    bad.write_text("not a checkpoint\n" * 5)
    assert main(_register(pair, "--moved", str(pair["out"] / "m.nii.gz"), model=bad)) == 2
    err = _one_line_error(capsys, "register")
    assert f"'{bad}' is not a hyperreg checkpoint (torch.load cannot read it)" in err


# --- 4. --out on an existing file ------------------------------------------------------------


@pytest.mark.parametrize("build", [_sweep, _tune, _batch])
def test_out_on_a_file_is_one_line_naming_out(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str], build
) -> None:
    blocker = pair["out"].parent / "results"
    blocker.write_text("a file")
    for out in (blocker, blocker / "sub"):
        assert main(build({**pair, "out": out})) == 2
        err = _one_line_error(capsys, build.__name__[1:])
        assert "argument --out: " in err and str(blocker) in err
    assert blocker.read_text() == "a file"


def test_train_out_on_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "run"
    blocker.write_text("a file")
    args = ["train", "--data", str(tmp_path), "--steps", "1", "--out", str(blocker)]
    assert main([*args, "--device", "cpu"]) == 2
    assert "argument --out: " in _one_line_error(capsys, "train")


# --- 5. an intensity image given as a label map ---------------------------------------------------


@pytest.mark.parametrize("role", ["moving_seg", "fixed_seg"])
@pytest.mark.parametrize("build", [_register, _sweep])
def test_intensity_image_as_label_map_is_an_error(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str], build, role: str
) -> None:
    segs = ["--moving-seg", str(pair["moving_seg"]), "--fixed-seg", str(pair["fixed_seg"])]
    segs[segs.index(str(pair[role]))] = str(_intensity(pair))
    extra = ["--moved", str(pair["out"] / "m.nii.gz")] if build is _register else []
    assert main(build(pair, *extra, *segs)) == 2
    err = _one_line_error(capsys, build.__name__[1:])
    option = "--" + role.replace("_", "-")
    assert f"{option} must be a label map of integer ids" in err
    assert "is it an intensity image?" in err
    assert not pair["out"].exists()


def test_tune_rejects_an_intensity_image_in_a_label_column(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_tune(pair, fixed_seg=_intensity(pair))) == 2
    err = _one_line_error(capsys, "tune")
    assert "row 0 of --pairs: 'fixed_seg' must be a label map of integer ids" in err
    assert not pair["out"].exists()


def test_batch_records_an_intensity_label_map_as_a_failed_pair(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_batch(pair, moving_seg=_intensity(pair))) == 1  # a bad pair: recorded, exit 1
    err = capsys.readouterr().err
    assert "pair00000 failed: 'moving_seg' must be a label map of integer ids" in err
    failure = json.loads((pair["out"] / "pairs" / "pair00000" / "failure.json").read_text())
    # the message itself, not the exception's class name (issue 23)
    assert not failure["error"].startswith("ValueError") and "moving_seg" in failure["error"]
    assert not (pair["out"] / "pairs" / "pair00000" / "moved.nii.gz").exists()


def test_check_label_map_rule(tmp_path: Path) -> None:
    labels = write_nifti(
        tmp_path / "labels.nii.gz", np.arange(480, dtype=np.float32).reshape(24, 20, 1)
    )
    check_label_map("f", "seg", labels)  # integer ids stored as floats are fine
    near = write_nifti(tmp_path / "near.nii.gz", np.full((24, 20, 1), 2.999, np.float32))
    check_label_map("f", "seg", near)  # within the 1e-2 tolerance
    with pytest.raises(ValueError, match="f\\(\\): 'seg' must be a label map of integer ids"):
        check_label_map("f", "seg", write_nifti(tmp_path / "i.nii.gz", blob((24, 20), (5, 5))))
    many = np.arange(MAX_LABELS + 1, dtype=np.int16)
    scan = write_nifti(tmp_path / "scan.nii.gz", np.resize(many, (50, 50, 1)).astype(np.int16))
    with pytest.raises(ValueError, match=f"{MAX_LABELS + 1} distinct values"):
        check_label_map("f", "seg", scan)


# --- 6. folding is printed one way everywhere -------------------------------------------------


def test_folding_is_printed_as_percent_of_voxels(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    warp = pair["out"] / "warp.nii.gz"
    assert main(_register(pair, "--warp", str(warp))) == 0
    assert main(["jacobian", "--warp", str(warp), "--out", str(pair["out"] / "j.nii.gz")]) == 0
    assert main(_tune(pair, "--refine-rounds", "0", "--out", str(pair["out"] / "tune"))) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if "folding " in line]
    assert len(lines) == 3, printed
    assert all("% of voxels (J ≤ 0)" in line for line in lines), lines
    assert "fraction" not in printed
    assert "within noise" in lines[2]  # λ* with its range, to the digits that range supports


# --- 7. train prints its final line once ------------------------------------------------------


def test_train_reports_the_model_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "scans"
    data.mkdir()
    for index in range(2):
        write_nifti(data / f"s{index}.nii.gz", blob((24, 20), (11 + index, 9))[..., None])
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--steps", "1", "--batch-size", "1", "--out", str(out)]
    assert main([*args, "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    mentions = [
        line for line in (captured.out + captured.err).splitlines() if str(out / "model.pt") in line
    ]
    assert len(mentions) == 1, mentions
    assert mentions[0].startswith("hyperreg train: trained to step 1")


# --- 8. shared options are defined once: identical help everywhere -----------------------------


def test_shared_options_have_one_help_text() -> None:
    parser = build_parser()

    def helps(command: str) -> dict[str, str]:
        actions = subparser(parser, command)._actions
        return {a.option_strings[-1]: a.help for a in actions if a.option_strings}

    shared = {
        "--model": ("register", "sweep", "tune", "batch"),
        "--moving": ("register", "sweep"),
        "--fixed": ("register", "sweep"),
        "--moving-seg": ("register", "sweep"),
        "--fixed-seg": ("register", "sweep"),
        "--normalization": ("register", "sweep", "batch"),
        "--lambdas": ("sweep",),
        "--chunk": ("sweep", "tune"),
        "--amp": ("sweep", "tune"),
        "--device": ("train", "register", "sweep", "tune", "batch", "demo"),
        "--debug": ("train", "register", "warp", "jacobian", "demo", "sweep", "tune", "batch"),
    }
    for option, commands in shared.items():
        texts = {helps(command)[option] for command in commands}
        assert len(texts) == 1, (option, texts)
