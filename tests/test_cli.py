"""Command line, run in-process on temporary files (and the shared bad-input cases)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from shared_paths import CASES as CASES_DIR
from shared_paths import DATA
from hyperreg.cli import main
from hyperreg.config import ModelConfig
from hyperreg.geometry.fields import load_displacement
from hyperreg.method.model import HyperMorph, save_checkpoint

CASES = CASES_DIR / "files"
needs_cases = pytest.mark.skipif(not CASES.is_dir(), reason=f"shared cases not found at {CASES}")

AFFINE = np.array(
    [[-1.0, 0, 0, 80], [0, 0, 1, -112], [0, -1, 0, 96], [0, 0, 0, 1]], dtype=np.float64
)


def _write(path: Path, data: np.ndarray, affine: np.ndarray = AFFINE) -> Path:
    img = nib.Nifti1Image(data, affine)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    nib.save(img, path)
    return path


def _blob(shape: tuple[int, ...], centre: tuple[float, ...]) -> np.ndarray:
    grid = np.meshgrid(*[np.arange(s, dtype=np.float32) for s in shape], indexing="ij")
    dist = sum((g - c) ** 2 for g, c in zip(grid, centre))
    return np.exp(-dist / (2 * 4.0**2)).astype(np.float32)


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    """A tiny 2D pair stored as (I, J, 1) NIfTI files with label maps, and a model."""
    shape = (24, 20)
    moving = _blob(shape, (11, 9))
    fixed = _blob(shape, (13, 10))
    paths = {
        "moving": _write(tmp_path / "moving.nii.gz", moving[..., None]),
        "fixed": _write(tmp_path / "fixed.nii.gz", fixed[..., None]),
        "moving_seg": _write(
            tmp_path / "moving_seg.nii.gz", (moving > 0.5).astype(np.uint8)[..., None] * 3
        ),
        "fixed_seg": _write(
            tmp_path / "fixed_seg.nii.gz", (fixed > 0.5).astype(np.uint8)[..., None] * 3
        ),
    }
    torch.manual_seed(0)
    model = HyperMorph(
        ModelConfig(ndim=2, enc_channels=(4, 4, 4, 4), dec_channels=(4,) * 7, hyper_hidden=(8, 8))
    )
    paths["model"] = save_checkpoint(model, tmp_path / "model.pt")
    paths["out"] = tmp_path / "out"
    return paths


def _register_args(
    files: dict[str, Path], lam: str = "0.3", segs: bool = True, **over: Path
) -> list[str]:
    """`hyperreg register` arguments for the fixture files; ``segs`` adds the label-map flags."""
    paths = {**files, **over}
    out = files["out"]
    args = ["register", "--model", str(paths["model"]), "--moving", str(paths["moving"])]
    args += ["--fixed", str(paths["fixed"]), "--lambda", lam]
    args += ["--moved", str(out / "moved.nii.gz"), "--warp", str(out / "warp.nii.gz")]
    if segs:
        args += ["--moving-seg", str(paths["moving_seg"])]
        args += ["--moved-seg", str(out / "moved_seg.nii.gz")]
        args += ["--fixed-seg", str(paths["fixed_seg"])]
    # the deformable stage on the pair as it lies in world space (the affine stage: test_native)
    return [*args, "--init", "none", "--device", "cpu"]


def test_register_writes_outputs_on_fixed_grid(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_register_args(files)) == 0
    printed = capsys.readouterr().out
    assert "mean Dice" in printed and "folding " in printed and "% of voxels (J ≤ 0)" in printed
    fixed = nib.load(files["fixed"])
    for name in ("moved", "moved_seg"):
        img = nib.load(files["out"] / f"{name}.nii.gz")
        assert img.shape == fixed.shape == (24, 20, 1)
        np.testing.assert_allclose(img.affine, fixed.affine, atol=1e-6)
    seg = nib.load(files["out"] / "moved_seg.nii.gz")
    assert np.issubdtype(np.asanyarray(seg.dataobj).dtype, np.integer)
    assert set(np.unique(np.asanyarray(seg.dataobj))) <= {0, 3}
    warp = nib.load(files["out"] / "warp.nii.gz")
    assert warp.shape == (24, 20, 1, 2)
    np.testing.assert_allclose(warp.affine, fixed.affine, atol=1e-6)


@pytest.mark.parametrize("lam", ["1.5", "-0.1", "nan", "abc"])
def test_register_rejects_lambda_outside_unit_interval(
    files: dict[str, Path], lam: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_register_args(files, lam=lam)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "λ must" in err and "[0, 1]" in err
    assert not files["out"].exists()


def test_missing_input_is_one_line_error(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = files["out"].parent / "nope.nii.gz"
    assert main(_register_args(files, moving=missing)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hyperreg register: error:") and "nope.nii.gz" in err
    assert len(err.splitlines()) == 1
    assert not files["out"].exists()


def test_debug_reraises(files: dict[str, Path]) -> None:
    missing = files["out"].parent / "nope.nii.gz"
    with pytest.raises(FileNotFoundError):
        main(_register_args(files, moving=missing) + ["--debug"])


def test_bad_checkpoint_is_clean_error(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = files["out"].parent / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main(_register_args(files, model=bad)) == 2
    assert "bad.pt" in capsys.readouterr().err


def test_help_and_unknown_command_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert main(["frobnicate"]) == 2
    assert main([]) == 2


def test_train_then_register(tmp_path: Path, files: dict[str, Path]) -> None:
    data = tmp_path / "scans"
    data.mkdir()
    rng = np.random.default_rng(0)
    for index in range(3):
        centre = (12 + rng.uniform(-2, 2), 16 + rng.uniform(-2, 2))
        _write(data / f"subject{index}.nii.gz", _blob((32, 32), centre)[..., None])
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--data",
            str(data),
            "--ndim",
            "2",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--checkpoint-every",
            "2",
        ]
    )
    assert code == 0
    assert (out / "model.pt").is_file() and (out / "checkpoint_0000002.pt").is_file()
    log = (out / "train_log.csv").read_text().splitlines()
    assert log[0].startswith("step,loss") and len(log) == 4
    args = _register_args(files, model=out / "model.pt")
    assert main(args) == 0


# --- shared bad-input cases (../shared/cases/README.md) -----------------------------------


def _case_args(files: dict[str, Path], **over: Path) -> list[str]:
    return _register_args(files, lam="0.5", segs=False, **over)


@needs_cases
@pytest.mark.parametrize(
    ("case", "role", "expected"),
    [
        ("c03_4d_series.nii.gz", "moving", "4D series"),
        ("c06_moving_with_nan.nii.gz", "moving", "non-finite"),
        ("c09_truncated.nii.gz", "moving", "truncated"),
    ],
)
def test_bad_case_files_fail_cleanly(
    files: dict[str, Path], case: str, role: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    slice_fixed = DATA / "neurite-oasis/OASIS_OAS1_0001_MR1/slice_norm.nii.gz"
    over = {role: CASES / case, "fixed": slice_fixed}
    assert main(_case_args(files, **over)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert case in err and expected in err
    assert not files["out"].exists()


@needs_cases
def test_nan_count_is_named(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    data = np.asanyarray(nib.load(CASES / "c06_moving_with_nan.nii.gz").dataobj)
    count = int((~np.isfinite(data)).sum())
    slice_fixed = DATA / "neurite-oasis/OASIS_OAS1_0001_MR1/slice_norm.nii.gz"
    main(_case_args(files, moving=CASES / "c06_moving_with_nan.nii.gz", fixed=slice_fixed))
    assert f"{count} non-finite" in capsys.readouterr().err


@needs_cases
def test_all_zero_fixed_is_refused_and_the_model_stays_finite(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """c07: the registration pipeline refuses a constant image with one line (issue #35 wins
    over the case table's warning); the model itself stays finite on it (tensor level)."""
    moving = DATA / "neurite-oasis/OASIS_OAS1_0002_MR1/slice_norm.nii.gz"
    fixed = CASES / "c07_fixed_all_zero.nii.gz"
    args = _case_args(files, moving=moving, fixed=fixed)
    for init in ("none", "affine"):
        args[args.index("--init") + 1] = init
        assert main(args) == 2
        printed = capsys.readouterr()
        err = printed.err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"--fixed '{fixed}' is constant (all voxels = 0.0)" in err
        assert "nan" not in (printed.out + printed.err).lower()
        assert not files["out"].exists()
    from hyperreg.geometry.intensity import normalize_intensity
    from hyperreg.method.model import load_checkpoint

    model, _ = load_checkpoint(files["model"])
    images = [nib.load(path).get_fdata(dtype=np.float32)[..., 0] for path in (moving, fixed)]
    moving_t, fixed_t = (
        torch.from_numpy(normalize_intensity(i, "minmax"))[None, None] for i in images
    )
    with torch.no_grad():
        out = model(moving_t, fixed_t, 0.5)
    assert all(torch.isfinite(t).all() for t in (out.moved, out.disp))


# --- grids, warp and jacobian commands (issue 3) -------------------------------------------

XY_AFFINE = np.array(
    [[0.8, -0.9, 0, -3.0], [0.6, 1.2, 0, 4.0], [0, 0, 2.0, 1.0], [0, 0, 0, 1]], dtype=np.float64
)  # in-plane rotation, 1 x 1.5 mm, slice axis along z: an ITK-representable 2D grid


def test_register_resamples_a_moving_image_on_another_grid(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    fixed = nib.load(files["fixed"])
    data = np.asanyarray(fixed.dataobj)
    flip = np.diag([-1.0, 1.0, 1.0, 1.0])
    flip[0, 3] = data.shape[0] - 1
    other = _write(files["out"].parent / "flipped.nii.gz", data[::-1].copy(), AFFINE @ flip)
    assert main(_register_args(files, moving=other)) == 0
    lines = capsys.readouterr().out.splitlines()
    note = [line for line in lines if "resampled moving" in line]
    assert len(note) == 1 and note[0].startswith(f"hyperreg register: resampled moving '{other}'")
    assert "orientation RIA" in note[0] and "onto the fixed grid (shape (24, 20)" in note[0]
    # the fixed image, registered to itself through a flipped copy: the moved image is the fixed
    moved = np.asanyarray(nib.load(files["out"] / "moved.nii.gz").dataobj)
    assert np.corrcoef(moved.ravel(), data.ravel())[0, 1] > 0.99


def test_register_no_resample_makes_different_grids_an_error(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    shifted = AFFINE.copy()
    shifted[[0, 2], 3] += 2.0  # in the slice's plane (x, z), so the two still overlap
    other = _write(
        files["out"].parent / "shifted.nii.gz", _blob((24, 20), (11, 9))[..., None], shifted
    )
    assert main(_register_args(files, moving=other) + ["--no-resample"]) == 2
    err = capsys.readouterr().err.strip()
    # the moving label map is still on the unshifted grid: a warning says so, then the error
    warning, error = err.splitlines()
    assert "label map" in warning and "not on the grid of its image" in warning
    err = error
    assert "error:" in err and "shifted.nii.gz" in err
    assert "are on different grids" in err and "affines differ" in err
    assert not files["out"].exists()


def test_register_itk_format_on_a_coronal_slice_writes_a_field_of_one_slice(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A coronal (LIA) slice stored (I, J, 1): a 3D ITK field of one slice (SimpleITK applies
    such a field built from its array: test_native), with a warning that ITK's NIfTI reader
    cannot read the file itself."""
    assert main(_register_args(files) + ["--warp-format", "itk"]) == 0
    assert "SimpleITK's and ANTs' NIfTI readers cannot read" in capsys.readouterr().err
    path = files["out"] / "warp.nii.gz"
    assert nib.load(path).shape == (24, 20, 1, 1, 3)
    loaded = load_displacement(path)
    assert loaded.format == "itk" and loaded.disp.shape == (2, 24, 20)


@pytest.fixture()
def xy_files(tmp_path: Path, files: dict[str, Path]) -> dict[str, Path]:
    """The tiny pair again, on an oblique, anisotropic grid in the world x-y plane."""
    paths = dict(files)
    for name in ("moving", "fixed", "moving_seg", "fixed_seg"):
        data = np.asanyarray(nib.load(files[name]).dataobj)
        paths[name] = _write(tmp_path / f"xy_{name}.nii.gz", data, XY_AFFINE)
    return paths


@pytest.mark.parametrize("fmt", ["voxel", "itk"])
def test_warp_command_reproduces_the_registered_outputs(
    xy_files: dict[str, Path], fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = xy_files["out"]
    assert main(_register_args(xy_files) + ["--warp-format", fmt]) == 0
    field = nib.load(out / "warp.nii.gz")
    assert field.shape == ((24, 20, 1, 2) if fmt == "voxel" else (24, 20, 1, 1, 2))
    assert (int(field.header["intent_code"]) == 1007) == (fmt == "itk")
    np.testing.assert_array_equal(field.affine, nib.load(xy_files["fixed"]).affine)
    # labels: the same ids, integer type, equal to the registered label map
    seg_out = out / "warped_seg.nii.gz"
    args = ["warp", "--moving", str(xy_files["moving_seg"]), "--warp", str(out / "warp.nii.gz")]
    assert main([*args, "--moved", str(seg_out), "--nearest"]) == 0
    warped = np.asanyarray(nib.load(seg_out).dataobj)
    assert warped.dtype == np.uint8 and warped.shape == (24, 20, 1)
    np.testing.assert_array_equal(warped, np.asanyarray(nib.load(out / "moved_seg.nii.gz").dataobj))
    assert "looks like a label map" not in capsys.readouterr().err
    # the label map warped as an image: written (the user may mean it) with a one-line warning
    assert main([*args, "--moved", str(out / "blended.nii.gz")]) == 0
    err = capsys.readouterr().err
    assert f"warning: '{xy_files['moving_seg']}' looks like a label map" in err
    assert "warp it as a label map instead" in err and "--labels '" in err
    # intensities: both `warp` and `register` write the moving image in its own units
    image_out = out / "warped.nii.gz"
    args[2] = str(xy_files["moving"])
    assert main([*args, "--moved", str(image_out)]) == 0
    np.testing.assert_allclose(
        nib.load(image_out).get_fdata(),
        nib.load(out / "moved.nii.gz").get_fdata(),
        atol=1e-6,
    )
    assert "wrote" in capsys.readouterr().out


def test_warp_command_resamples_a_moving_file_on_another_grid(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_register_args(files)) == 0
    data = np.asanyarray(nib.load(files["moving_seg"]).dataobj)
    flip = np.diag([1.0, -1.0, 1.0, 1.0])
    flip[1, 3] = data.shape[1] - 1
    other = _write(files["out"].parent / "seg_flipped.nii.gz", data[:, ::-1].copy(), AFFINE @ flip)
    out = files["out"]
    args = ["warp", "--moving", str(other), "--warp", str(out / "warp.nii.gz"), "--nearest"]
    assert main([*args, "--moved", str(out / "a.nii.gz")]) == 0
    assert "label map (nearest neighbour)" in capsys.readouterr().out  # one interpolation
    np.testing.assert_array_equal(
        np.asanyarray(nib.load(out / "a.nii.gz").dataobj),
        np.asanyarray(nib.load(out / "moved_seg.nii.gz").dataobj),
    )
    assert main([*args, "--moved", str(out / "b.nii.gz"), "--no-resample"]) == 2
    assert "are on different grids" in capsys.readouterr().err
    assert not (out / "b.nii.gz").exists()


def test_jacobian_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shape = (12, 10)
    disp = np.zeros((*shape, 1, 2), np.float32)
    disp[..., 0, 0] = 0.5 * np.arange(shape[0], dtype=np.float32)[:, None]  # J = 1.5 everywhere
    field = _write(tmp_path / "warp.nii.gz", disp, AFFINE)
    out = tmp_path / "jac.nii.gz"
    assert main(["jacobian", "--warp", str(field), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "folding 0.000 % of voxels (J ≤ 0), std log J 0.0000" in printed
    img = nib.load(out)
    assert img.shape == (12, 10, 1) and img.get_data_dtype() == np.float32
    np.testing.assert_array_equal(img.affine, AFFINE)
    np.testing.assert_allclose(img.get_fdata(), 1.5, atol=1e-6)
    disp[6:, ..., 0, 0] = -2.0 * np.arange(6, dtype=np.float32)[:, None]  # a fold
    _write(field, disp, AFFINE)
    assert main(["jacobian", "--warp", str(field), "--out", str(out)]) == 0
    assert "folding 0.000 %" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["warp", "jacobian"])
def test_warp_and_jacobian_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    image = _write(tmp_path / "image.nii.gz", _blob((12, 10), (5, 5))[..., None])
    out = tmp_path / "out" / "result.nii.gz"
    for bad_field in (image, tmp_path / "missing.nii.gz"):  # a scalar image is not a field
        if command == "warp":
            args = ["warp", "--moving", str(image), "--warp", str(bad_field), "--moved", str(out)]
        else:
            args = ["jacobian", "--warp", str(bad_field), "--out", str(out)]
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"hyperreg {command}: error:") and len(err.splitlines()) == 1
        assert bad_field.name in err
    assert not out.parent.exists()


# --- output paths are checked before any work -----------------------------------------------


def test_output_under_a_regular_file_fails_before_writing(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = files["out"].parent / "blocker"
    blocker.write_text("a file, not a folder")
    args = _register_args(files)
    args[args.index("--moved-seg") + 1] = str(blocker / "seg.nii.gz")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err
    assert not files["out"].exists()  # moved and warp were not written either


def test_duplicate_output_paths_are_refused(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = _register_args(files)
    args[args.index("--warp") + 1] = args[args.index("--moved") + 1]
    assert main(args) == 2
    assert "are the same file" in capsys.readouterr().err
    assert not files["out"].exists()


def test_output_may_not_overwrite_an_input(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = files["moving"].read_bytes()
    args = _register_args(files)
    args[args.index("--moved") + 1] = str(files["moving"])
    assert main(args) == 2
    assert "would overwrite the input" in capsys.readouterr().err
    assert files["moving"].read_bytes() == before


def test_normalization_none_rejects_intensities_outside_unit_range(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bright = _write(tmp_path / "bright.nii.gz", 200 * _blob((24, 20), (11, 9))[..., None])
    args = _register_args(files, moving=bright) + ["--normalization", "none"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "bright.nii.gz" in err and "outside the [0, 1]" in err
    assert not files["out"].exists()


@pytest.mark.parametrize(
    ("drop", "expected"),
    [
        (("--moved-seg", "--fixed-seg"), "--moving-seg is used only with"),
        (("--moving-seg", "--moved-seg"), "--fixed-seg needs --moving-seg"),
        (("--moved", "--warp", "--moved-seg"), "nothing to write"),
    ],
)
def test_label_and_output_flags_must_make_sense(
    files: dict[str, Path], drop: tuple[str, ...], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _register_args(files)
    for flag in drop:
        index = args.index(flag)
        del args[index : index + 2]
    assert main(args) == 2
    assert expected in capsys.readouterr().err


def test_register_prints_dice_before_and_moved_keeps_intensity_units(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bright = _write(tmp_path / "bright.nii.gz", 200 * _blob((24, 20), (11, 9))[..., None])
    assert main(_register_args(files, moving=bright)) == 0
    assert "before registration:" in capsys.readouterr().out
    moved = nib.load(files["out"] / "moved.nii.gz").get_fdata()
    assert 100 < moved.max() <= 200 + 1e-3


@pytest.mark.parametrize(("ndim", "extra", "lr"), [("2", [], 1e-3), ("3", [], 1e-4),
                                                   ("3", ["--lr", "5e-4"], 5e-4)])
def test_train_default_lr_depends_on_dimensionality(
    tmp_path: Path, monkeypatch, ndim: str, extra: list[str], lr: float
) -> None:
    """3D trains at 1e-4 unless told otherwise (1e-3 diverged on brain volumes)."""
    import hyperreg.training.train as training

    seen = {}

    def fake_train(config, *args, **kwargs):  # the run's config; an untrained model as result
        seen["config"] = config
        return save_checkpoint(HyperMorph(config.model), tmp_path / "run" / "model.pt")

    monkeypatch.setattr(training, "train", fake_train)
    data = tmp_path / "scans"
    data.mkdir()
    args = ["train", "--data", str(data), "--ndim", ndim, "--out", str(tmp_path / "run")]
    assert main([*args, "--device", "cpu", *extra]) == 0
    from hyperreg.config import DEFAULT_LR

    # the CLI leaves lr at 0 unless --lr is given; train() resolves 0 to DEFAULT_LR[ndim]
    assert (seen["config"].lr or DEFAULT_LR[int(ndim)]) == lr
    assert seen["config"].model.ndim == int(ndim)
