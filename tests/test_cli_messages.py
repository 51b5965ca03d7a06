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

from hyperreg._errors import InputError, MissingInputError, passed_as
from hyperreg.apps.inputs import MAX_LABELS, check_label_map, read_label_map
from hyperreg.cli import build_parser, main
from hyperreg.cli.args import subparser
from hyperreg.cli.messages import error_text, one_map_labels_text, options_of


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
        (("--moved", "{out}/a.txt"), "--moved must end in ('.nii.gz', '.nii', '.mgz')"),
        (("--warp", "{out}/w.mgz"), "--warp must end in ('.nii.gz', '.nii'), got"),
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
    err = _one_line_error(capsys, "register")
    assert f"error: argument --moving: no such file: '{missing}'" in err
    # without --model: said before a bundled model is picked and read
    args = ["register", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    args += ["--moving-seg", str(missing), "--fixed-seg", str(pair["fixed"])]
    assert main([*args, "--moved", str(pair["out"] / "m.nii.gz")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "argument --moving-seg: no such file" in captured.err


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
    square = np.zeros((24, 20, 1), np.float32)
    square[6:18, 5:15] = 1.0  # integer ids, piecewise constant: a label map given as an image
    labels = write_nifti(tmp_path / "labels.nii.gz", square)
    args = _register(pair, "--moved", str(pair["out"] / "m.nii.gz"), fixed=labels)
    assert main(args) == 0
    err = capsys.readouterr().err
    # warnings print as the library wrote them (naming the file), one line each
    assert f"hyperreg register: warning: '{labels}' given as the fixed image looks like" in err
    assert err.count("looks like a label map") == 1
    assert "(): " not in err
    # tune logs its refinement rounds; batch logs a failed pair
    assert main(_tune(pair, "--bracket-rounds", "1", "--bracket-points", "2")) == 0
    err = capsys.readouterr().err
    assert "hyperreg tune: round 1 brackets λ in [0, 1]" in err and "(): " not in err
    missing = tmp_path / "gone.nii.gz"
    pair = {**pair, "out": tmp_path / "batch"}
    assert main(_batch(pair, fixed=missing)) == 1
    err = capsys.readouterr().err
    assert f"hyperreg batch: warning: a_moving__to__gone failed: no such file: '{missing}'" in err
    assert "(): " not in err


def test_errors_name_options_through_dest() -> None:
    """An error's argument (data, not text) is mapped to its option by argparse's ``dest``."""
    options = options_of(build_parser(), "register")
    assert options["warp_out"] == "--warp" and options["lam"] == "--lambda"  # dest = argument
    err = InputError(
        "register_files", "{0} and {1} are the same file '{out}'", "warp_out", "moved", out="x"
    )
    assert str(err) == "register_files(): 'warp_out' and 'moved' are the same file 'x'"
    assert err.detail == "'warp_out' and 'moved' are the same file 'x'"
    assert error_text(err, options) == "argument --warp: --warp and --moved are the same file 'x'"
    lam = InputError("as_lambda_tensor", "{0} must lie in\n[0, 1], got {v}", "lam", v=[2.0])
    assert error_text(lam, options) == "argument --lambda: --lambda must lie in [0, 1], got [2.0]"
    # a low-level argument renamed by the caller that knows which of its own fed it
    missing = MissingInputError("load_volume", "no such file: '{path}'", "path", path="m{1}.nii")
    with pytest.raises(FileNotFoundError) as info, passed_as(path="moving"):
        raise missing
    assert info.value.argument == "moving" and str(info.value).startswith("load_volume(): ")
    assert error_text(missing, options) == "argument --moving: no such file: 'm{1}.nii'"
    # an argument that no option feeds: the message unchanged, not garbled
    other = InputError("f", "{0} needs {1}, got '{value}'", "renamed", "moving", value="a {b}")
    assert error_text(other, options) == "f(): 'renamed' needs 'moving', got 'a {b}'"
    # an argument no option feeds among the named ones stays quoted
    seg = InputError("f", "{0} needs {1}", "moved_seg", "unknown")
    assert error_text(seg, options) == "argument --moved-seg: --moved-seg needs 'unknown'"
    # an error without structured data: its message unchanged, on one line
    assert error_text(ValueError("f(): 'moving' is\nbad"), options) == "f(): 'moving' is bad"


def test_input_errors_pickle_with_their_data() -> None:
    import pickle

    err = MissingInputError("f", "no such file: '{path}'", "path", path="a.nii")
    with pytest.raises(MissingInputError), passed_as(path="fixed"):
        raise err
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is MissingInputError and isinstance(back, FileNotFoundError)
    assert (str(back), back.argument, back.detail) == (str(err), "fixed", err.detail)


def test_cli_maps_an_input_error_to_its_option(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyperreg.cli import register_commands

    def fail(*args: object, **kwargs: object) -> None:
        raise InputError("register_files", "{0} is wrong: '{path}'", "moving", path="m.nii")

    monkeypatch.setattr("hyperreg.apps.register.register_files", fail)
    args = _register(pair, "--moved", str(pair["out"] / "m.nii.gz"))
    assert register_commands is not None and main(args) == 2
    err = _one_line_error(capsys, "register")
    assert err == "hyperreg register: error: argument --moving: --moving is wrong: 'm.nii'"

    def renamed(*args: object, **kwargs: object) -> None:
        raise InputError("register_files", "{0} is wrong", "no_such_dest")

    monkeypatch.setattr("hyperreg.apps.register.register_files", renamed)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hyperreg register: error: register_files(): 'no_such_dest' is wrong"


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
    assert "a_moving__to__a_fixed failed: 'moving_seg' must be a label map of integer ids" in err
    failure = json.loads(
        (pair["out"] / "pairs" / "a_moving__to__a_fixed" / "failure.json").read_text()
    )
    # the message itself, not the exception's class name (issue 23)
    assert not failure["error"].startswith("ValueError") and "moving_seg" in failure["error"]
    assert not (pair["out"] / "pairs" / "a_moving__to__a_fixed" / "moved.nii.gz").exists()


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


def test_register_reads_each_label_map_once(
    pair: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check that a label map holds ids is made on the one read the registration uses."""
    import hyperreg.geometry.io as io

    reads: list[Path] = []
    original = io.read_raw

    def counted(path: Path, suffix: str):  # type: ignore[no-untyped-def]
        reads.append(Path(path))
        return original(path, suffix)

    monkeypatch.setattr(io, "read_raw", counted)
    segs = ["--moving-seg", str(pair["moving_seg"]), "--fixed-seg", str(pair["fixed_seg"])]
    moved_seg = pair["out"] / "ms.nii.gz"
    assert main(_register(pair, "--moved-seg", str(moved_seg), *segs)) == 0
    assert "mean Dice" in capsys.readouterr().out
    assert reads.count(pair["moving_seg"]) == 1 and reads.count(pair["fixed_seg"]) == 1
    assert moved_seg.exists()


@pytest.mark.parametrize("role", ["moving_seg", "fixed_seg"])
def test_register_rejects_an_integer_scan_as_label_map(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str], role: str
) -> None:
    """An intensity image stored as integers reads as a label map; its count of distinct
    values says what it is, before any output."""
    many = np.arange(MAX_LABELS + 1, dtype=np.int16)
    scan = write_nifti(pair["moving"].parent / "scan.nii.gz", np.resize(many, (50, 50, 1)))
    segs = {"moving_seg": pair["moving_seg"], "fixed_seg": pair["fixed_seg"], role: scan}
    args = ["--moving-seg", str(segs["moving_seg"]), "--fixed-seg", str(segs["fixed_seg"])]
    assert main(_register(pair, "--moved", str(pair["out"] / "m.nii.gz"), *args)) == 2
    err = _one_line_error(capsys, "register")
    option = "--" + role.replace("_", "-")
    assert f"{option} must be a label map (at most {MAX_LABELS} distinct ids)" in err
    assert f"has {MAX_LABELS + 1} distinct values" in err
    assert not pair["out"].exists()


def test_read_label_map_is_the_label_read(pair: dict[str, Path], tmp_path: Path) -> None:
    from hyperreg.geometry.io import load_volume

    volume = read_label_map("f", "seg", pair["moving_seg"])
    expected = load_volume(pair["moving_seg"], label=True)
    assert volume.data.dtype == np.int32
    np.testing.assert_array_equal(volume.data, expected.data)
    np.testing.assert_array_equal(volume.affine, expected.affine)
    assert volume.disk_shape == expected.disk_shape and volume.codes == expected.codes
    with pytest.raises(ValueError, match="f\\(\\): 'seg' must be a label map of integer ids"):
        read_label_map("f", "seg", pair["moving"])  # a blob in [0, 1]: its message, not io's
    nan = np.full((24, 20, 1), np.nan, np.float32)
    with pytest.raises(ValueError, match="non-finite") as caught:
        read_label_map("f", "seg", write_nifti(tmp_path / "nan.nii.gz", nan))
    with pytest.raises(ValueError) as checked:
        check_label_map("f", "seg", tmp_path / "nan.nii.gz")
    assert str(caught.value) == str(checked.value)  # the check's own message


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


def test_file_errors_name_the_option_that_gave_the_file(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A low-level reader's argument (``load_volume``'s ``path``) is renamed by the caller that
    knows which of its own fed it, so the line names the option without parsing the message."""
    missing = pair["out"].parent / "nope.nii.gz"
    out = str(pair["out"] / "m.nii.gz")
    # no --model: the bundled model is chosen from the fixed image's header
    args = ["register", "--moving", str(pair["moving"]), "--fixed", str(missing), "--moved", out]
    assert main([*args, "--device", "cpu"]) == 2
    err = _one_line_error(capsys, "register")
    assert err == f"hyperreg register: error: argument --fixed: no such file: '{missing}'"
    args = ["warp", "--moving", str(pair["moving"]), "--warp", str(missing), "--moved", out]
    assert main(args) == 2
    err = _one_line_error(capsys, "warp")
    assert err == f"hyperreg warp: error: argument --warp: no such file: '{missing}'"
    args = ["warp", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    args += ["--affine", str(missing.with_suffix(".mat"))]  # outputs are checked first
    assert main([*args, "--moved", str(pair["out"] / "m.txt")]) == 2
    err = _one_line_error(capsys, "warp")
    assert err.startswith("hyperreg warp: error: argument --moved: --moved must end in ")


def test_no_cli_module_parses_messages() -> None:
    """Errors name their argument as data; no command-line module rewrites text (issue 21)."""
    import ast

    import hyperreg.cli

    for path in Path(hyperreg.cli.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            module = node.module if isinstance(node, ast.ImportFrom) else None
            assert "re" not in names and module != "re", f"{path.name} imports re"


def test_unreadable_fixed_image_names_its_option(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a header that reads but data cut short: found by the model's choice, read by the pair
    whole = pair["fixed"].read_bytes()
    cut = tmp_path / "cut.nii.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    for command in (_register, _sweep):
        assert (
            main(
                command(
                    pair,
                    "--moved" if command is _register else "--out",
                    str(tmp_path / ("m.nii.gz" if command is _register else "s")),
                    fixed=cut,
                )
            )
            == 2
        )
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"hyperreg {command.__name__[1:]}: error: argument --fixed: ")
        assert "(): " not in err and str(cut) in err


def test_inverse_warp_with_an_initial_affine_inverts_the_whole_chain(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hyperreg.geometry.affine import AffineTransform, save_affine

    mat = save_affine(tmp_path / "a.mat", AffineTransform(np.eye(4), "affine"), ndim=2)
    args = _register(
        pair,
        "--init",
        "none",
        "--initial-affine",
        str(mat),
        "--moved",
        str(tmp_path / "m.nii.gz"),
        "--inverse-warp",
        str(tmp_path / "i.nii.gz"),
    )
    assert main(args) == 0  # the initial affine is inverted with the field
    assert (tmp_path / "m.nii.gz").exists() and (tmp_path / "i.nii.gz").exists()


def test_ctrl_c_is_one_line_and_exit_code_130(
    pair: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hyperreg.cli.run as run

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(run.COMMANDS, "register", interrupted)
    assert main(_register(pair, "--moved", str(pair["out"] / "m.nii.gz"))) == 130
    assert capsys.readouterr().err.strip() == "hyperreg register: interrupted"


def test_an_unknown_option_is_said_by_its_subcommand_with_the_closest_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["register", "--moving", "a.nii.gz", "--fixed", "b.nii.gz", "--refien", "3"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hyperreg register: error: unrecognized arguments: --refien 3 "
        "(did you mean --refine or --refine-lr?)"
    )
    assert main(["affine", "--moving", "a", "--fixed", "b", "--zzz"]) == 2
    assert (
        capsys.readouterr().err.strip() == "hyperreg affine: error: unrecognized arguments: --zzz"
    )


def test_an_unwritable_output_is_said_before_a_model_is_read(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["register", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    assert main([*args, "--warp", "/proc/nope/w.nii.gz"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no 'using the bundled model' first
    assert captured.err.strip() == (
        "hyperreg register: error: argument --warp: cannot write '/proc/nope/w.nii.gz': its "
        "folder '/proc/nope' is missing and cannot be created, as '/proc' does not take new "
        "files (No such file or directory)"
    )


# --- what cannot be registered is refused before any output --------------------------------------


@pytest.mark.parametrize("role", ["moving", "fixed"])
@pytest.mark.parametrize("value", [0.0, 3.5])
def test_a_constant_image_is_refused_before_any_output(
    pair: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    role: str,
    value: float,
) -> None:
    constant = write_nifti(tmp_path / "constant.nii.gz", np.full((24, 20, 1), value, np.float32))
    out = pair["out"]
    args = _register(pair, "--moved", str(out / "m.nii.gz"), "--warp", str(out / "w.nii.gz"))
    assert main([*args, f"--{role}", str(constant)]) == 2
    err = _one_line_error(capsys, "register")
    assert f"--{role} '{constant}' is constant (all voxels = {value})" in err
    assert "nothing to register" in err and "warning" not in err
    assert not out.exists()


def test_a_constant_image_is_refused_by_affine_sweep_and_tune(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    constant = write_nifti(tmp_path / "constant.nii.gz", np.zeros((24, 20, 1), np.float32))
    out = pair["out"]
    affine = ["affine", "--moving", str(constant), "--fixed", str(pair["fixed"])]
    assert main([*affine, "--moved", str(out / "m.nii.gz")]) == 2
    assert "--moving" in _one_line_error(capsys, "affine")
    assert main(_sweep(pair, moving=constant)) == 2
    assert "is constant" in _one_line_error(capsys, "sweep")
    assert main(_tune(pair, moving=constant)) == 2
    err = _one_line_error(capsys, "tune")
    assert f"argument --pairs: --pairs row 0: 'moving' '{constant}' is constant" in err
    assert not out.exists()


def test_a_batch_records_a_constant_pair_as_failed_and_goes_on(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    constant = write_nifti(tmp_path / "constant.nii.gz", np.zeros((24, 20, 1), np.float32))
    good = {k: str(pair[k]) for k in ("moving", "fixed", "moving_seg", "fixed_seg")}
    csv_path = tmp_path / "pairs.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(good))
        writer.writeheader()
        writer.writerow({**good, "fixed": str(constant)})
        writer.writerow(good)
    out = tmp_path / "batch"
    args = ["batch", "--model", str(pair["model"]), "--pairs", str(csv_path), "--out", str(out)]
    assert main([*args, "--lambda", "0.5", "--no-progress", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    stem = Path(good["moving"]).name.removesuffix(".nii.gz")  # folders: <moving>__to__<fixed>
    first, second = f"{stem}__to__constant", f"{stem}__to__{Path(good['fixed']).name[:-7]}"
    failed = [line for line in err.splitlines() if f"{first} failed" in line]
    assert len(failed) == 1 and f"'{constant}' is constant" in failed[0]
    assert second not in " ".join(line for line in err.splitlines() if "failed" in line)
    assert not list((out / "pairs" / first).glob("*.nii*"))
    assert list((out / "pairs" / second).glob("*.nii*"))  # the next pair went on


def test_init_none_without_overlap_is_refused(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    far = np.eye(4)
    far[0, 3] = 1000.0  # the same image 1 m away: the fields of view do not meet
    moving = write_nifti(tmp_path / "far.nii.gz", blob((24, 20), (11, 9))[..., None], far)
    out = pair["out"]
    args = _register(pair, "--moved", str(out / "m.nii.gz"), "--init", "none", moving=moving)
    assert main(args) == 2
    err = _one_line_error(capsys, "register")
    assert "do not overlap in world space" in err and "--init 'affine'" in err
    assert not out.exists()


def test_a_nan_refinement_loss_is_a_runtime_error(
    pair: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hyperreg.registration.refine_levels as levels

    terms = levels._terms

    def nan_terms(*args, **kwargs):  # type: ignore[no-untyped-def]
        loss, image = terms(*args, **kwargs)
        return loss * float("nan"), image

    monkeypatch.setattr(levels, "_terms", nan_terms)
    out = pair["out"]
    args = _register(pair, "--moved", str(out / "m.nii.gz"), "--refine", "5")
    assert main(args) == 1
    err = _one_line_error(capsys, "register")
    assert "loss became NaN" in err and "--refine 0" in err
    assert not out.exists()


def test_a_colour_image_is_refused_before_any_output(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = np.random.default_rng(0).integers(0, 256, (24, 20, 3)).astype(np.uint8)
    colour = write_nifti(tmp_path / "photo.nii.gz", picture)  # (X, Y, RGB), not 3 slices
    out = pair["out"]
    assert main(_register(pair, "--moved", str(out / "m.nii.gz"), moving=colour)) == 2
    err = _one_line_error(capsys, "register")
    assert f"argument --moving: '{colour}' has shape (24, 20, 3): a 2D colour image" in err
    assert not out.exists()


def test_labels_in_one_map_only_are_counted_and_the_mean_over_both_is_given() -> None:
    dice = {3: 0.8, 4: 0.0, 5: 0.0, 6: 0.6}
    line = one_map_labels_text(dice, [3, 6])
    assert line is not None and line.startswith("2 of those labels are in one map only")
    assert "over the 2 labels both maps hold, mean Dice 0.7000" in line
    assert one_map_labels_text(dice, [3, 4, 5, 6]) is None  # every label in both maps
    assert one_map_labels_text(dice, None) is None and one_map_labels_text(None, [3]) is None


@pytest.mark.parametrize(
    ("similarity", "name"),
    [("ncc", "NCC"), ("mse", "-MSE/σ²"), ("mi", "MI (nats)"), ("mind", "-MIND distance")],
)
def test_refine_text_names_the_similarity_refined(similarity: str, name: str) -> None:
    from types import SimpleNamespace

    from hyperreg.cli.messages import refine_text

    stats = SimpleNamespace(steps=3, seconds=0.5, similarity=similarity, similarity_before=-2.0,
                            similarity_after=-1.0, loss_before=1.0, loss_after=0.5)  # fmt: skip
    assert refine_text(stats).startswith(f"refined 3 steps in 0.50 s: {name} -2.0000 -> -1.0000")
