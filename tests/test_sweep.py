"""λ sweeps and λ* tuning: batched sweep == single-λ calls, CLI outputs, tuning on a known case."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from lambda_helpers import SHAPE, blob, labels_of, save_tiny_model, tiny_model, write_pair
from torch import nn

from hyperreg.apps.inputs import PairSpec
from hyperreg.cli import main
from hyperreg.config import ModelConfig
from hyperreg.registration.lambdas import register_pair
from hyperreg.geometry.io import Volume
from hyperreg.method.objective import Objective
from hyperreg.method.model import RegistrationOutput
from hyperreg.method.spatial import warp
from hyperreg.apps.inputs import parse_lambdas
from hyperreg.apps.sweep import sweep_lambdas
from hyperreg.apps.tune import tune_lambda


def _volume(data: np.ndarray) -> Volume:
    return Volume(data=data, affine=np.eye(4), disk_shape=data.shape)


def _pair(shape: tuple[int, ...]) -> dict[str, Volume]:
    moving = blob(shape, tuple(s / 2 - 1 for s in shape), sigma=2.5)
    fixed = blob(shape, tuple(s / 2 + 0.5 for s in shape), sigma=2.5)
    return {
        "moving": _volume(moving),
        "fixed": _volume(fixed),
        "moving_seg": _volume(labels_of(moving).astype(np.int32)),
        "fixed_seg": _volume(labels_of(fixed).astype(np.int32)),
    }


# --------------------------------------------------------------------------------------------
# parse_lambdas
# --------------------------------------------------------------------------------------------


def test_parse_lambdas_range_list_and_single() -> None:
    values = parse_lambdas("0:1:11")
    assert len(values) == 11 and values[0] == 0.0 and values[-1] == 1.0
    assert values[3] == 0.3  # rounded, not 0.30000000000000004
    assert parse_lambdas("0.2:0.4:3") == [0.2, 0.3, 0.4]
    assert parse_lambdas("0.1, 0.5,1") == [0.1, 0.5, 1.0]
    assert parse_lambdas("0.25") == [0.25]
    assert parse_lambdas("0.5:0.5:1") == [0.5]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0:2:3", r"\[0, 1\]"),
        ("-0.1,0.5", r"\[0, 1\]"),
        ("nan", r"\[0, 1\]"),
        ("0:1:0", "count"),
        ("1:0:3", "start"),
        ("0:1", "start:stop:count"),
        ("a,b", "start:stop:count"),
        ("", "start:stop:count"),
        ("0:1:2.5", "start:stop:count"),
    ],
)
def test_parse_lambdas_rejects(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_lambdas(text)


# --------------------------------------------------------------------------------------------
# sweep_lambdas
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ndim", "chunk"), [(2, None), (2, 2), (3, 3)])
def test_sweep_equals_single_lambda_calls(ndim: int, chunk: int | None) -> None:
    shape = SHAPE if ndim == 2 else (12, 10, 14)
    model = tiny_model(ndim)
    pair = _pair(shape)
    lambdas = [0.0, 0.2, 0.5, 0.9, 1.0]
    results = sweep_lambdas(model, **pair, lambdas=lambdas, chunk=chunk, ncc=True)
    assert [r.lam for r in results] == pytest.approx(lambdas)
    disps = [r.disp for r in results]
    assert max(float(np.abs(d).max()) for d in disps) > 0.5  # non-trivial fields
    assert float(np.abs(disps[0] - disps[-1]).max()) > 0.1  # that change with λ
    for lam, result in zip(lambdas, results):
        single = register_pair(model, pair["moving"], pair["fixed"], lam, **_segs(pair))
        np.testing.assert_allclose(result.disp, single.disp, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(result.moved, single.moved, atol=1e-4)
        np.testing.assert_array_equal(result.moved_seg, single.moved_seg)
        assert result.dice is not None and single.dice is not None
        for label, value in single.dice.items():
            assert result.dice[label] == pytest.approx(value)
        assert result.folding_fraction == pytest.approx(single.folding_fraction, abs=1e-6)
        assert result.log_jacobian_std == pytest.approx(single.log_jacobian_std, abs=1e-4)
        assert result.ncc is not None and 0.0 <= result.ncc <= 1.0


def _segs(pair: dict[str, Volume]) -> dict[str, Volume]:
    return {"moving_seg": pair["moving_seg"], "fixed_seg": pair["fixed_seg"]}


def test_sweep_accepts_tensor_and_keeps_order() -> None:
    model = tiny_model()
    pair = _pair(SHAPE)
    results = sweep_lambdas(model, pair["moving"], pair["fixed"], torch.tensor([0.7, 0.1]))
    assert [round(r.lam, 6) for r in results] == [0.7, 0.1]
    assert results[0].dice is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lambdas": []}, ValueError, "at least one"),
        ({"lambdas": [0.2, 1.5]}, ValueError, r"\[0, 1\]"),
        ({"lambdas": [0.2, float("nan")]}, ValueError, r"\[0, 1\]"),
        ({"lambdas": "0.2"}, TypeError, "sequence"),
        ({"lambdas": [0.2], "chunk": 0}, ValueError, "chunk"),
        ({"lambdas": [0.2], "amp": True}, ValueError, "CUDA"),
    ],
)
def test_sweep_rejects(kwargs: dict, error: type, match: str) -> None:
    model = tiny_model()
    pair = _pair(SHAPE)
    with pytest.raises(error, match=match):
        sweep_lambdas(model, pair["moving"], pair["fixed"], **kwargs)


# --------------------------------------------------------------------------------------------
# hyperreg sweep
# --------------------------------------------------------------------------------------------


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    paths = write_pair(tmp_path / "data", "a")
    paths["model"] = save_tiny_model(tmp_path / "model.pt")
    paths["out"] = tmp_path / "out"
    return paths


def _sweep_args(files: dict[str, Path], *extra: str) -> list[str]:
    args = ["sweep", "--model", str(files["model"]), "--moving", str(files["moving"])]
    args += ["--fixed", str(files["fixed"]), "--out", str(files["out"])]
    return args + list(extra)


def test_sweep_cli_writes_csv_and_figures(files: dict[str, Path], capsys) -> None:
    segs = ["--moving-seg", str(files["moving_seg"]), "--fixed-seg", str(files["fixed_seg"])]
    grid = ["--lambdas", "0:1:5", "--chunk", "2", "--save-fields", "--init", "none"]
    code = main(_sweep_args(files, *segs, *grid))
    assert code == 0, capsys.readouterr().err
    out = files["out"]
    with (out / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(r["lambda"]) for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert list(rows[0]) == [
        "lambda",
        "mean_dice",
        "dice_3",
        "dice_4",
        "folding_percent",
        "log_jacobian_std",
        "ncc",
        "verdict",
        "kept",
    ]
    for row in rows:
        assert 0.0 <= float(row["mean_dice"]) <= 1.0
        assert float(row["mean_dice"]) == pytest.approx(
            (float(row["dice_3"]) + float(row["dice_4"])) / 2, abs=1e-5
        )
        assert 0.0 <= float(row["folding_percent"]) <= 100.0
    for name in ("sweep_curves.png", "sweep_montage.png", "sweep_qc.png"):
        assert (out / name).stat().st_size > 5000
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    for tag in ("lam0", "lam0.25", "lam1"):
        for kind in ("moved", "warp", "moved_seg"):
            assert (out / f"{kind}_{tag}.nii.gz").is_file(), f"{kind}_{tag}"
    printed = capsys.readouterr().out
    assert "no registration: mean Dice" in printed


def test_sweep_saves_what_register_saves_with_an_affine_stage(
    files: dict[str, Path], capsys
) -> None:
    """Under --init affine (the default) warp_lam<λ> is the composed transform register --warp
    writes at that λ (not the deformable field alone), and moved/moved_seg are register's."""
    # blobs 5.4 voxels apart: the stage keeps the identity for motions under 3 voxels (the
    # fixture's pair, 2.2 voxels apart, was kept as it came; an affine there was a wrong zoom)
    files = {**files, **write_pair(files["out"].parent / "shifted", "b", offset=4.0)}
    out = files["out"]
    segs = ["--moving-seg", str(files["moving_seg"])]
    sweep = [*segs, "--fixed-seg", str(files["fixed_seg"]), "--lambdas", "0.2,0.7"]
    code = main(_sweep_args(files, *sweep, "--save-fields", "--device", "cpu"))
    assert code == 0, capsys.readouterr().err
    for lam in ("0.2", "0.7"):
        reg = out / f"register_{lam}"
        args = ["register", "--model", str(files["model"]), "--moving", str(files["moving"])]
        args += ["--fixed", str(files["fixed"]), "--lambda", lam, "--device", "cpu", *segs]
        args += ["--moved", str(reg / "moved.nii.gz"), "--warp", str(reg / "warp.nii.gz")]
        args += ["--moved-seg", str(reg / "moved_seg.nii.gz")]
        args += ["--field-out", str(reg / "field.nii.gz")]
        assert main(args) == 0, capsys.readouterr().err
        fields = (out / f"warp_lam{lam}.nii.gz", reg / "warp.nii.gz", reg / "field.nii.gz")
        swept, composed, deformable = (nib.load(p).get_fdata() for p in fields)
        assert np.abs(composed - deformable).max() > 0.5  # the affine stage is not the identity
        # the same transform, up to grouped vs plain convolution rounding
        np.testing.assert_allclose(swept, composed, atol=1e-3)
        np.testing.assert_allclose(
            nib.load(out / f"moved_lam{lam}.nii.gz").get_fdata(),
            nib.load(reg / "moved.nii.gz").get_fdata(),
            atol=1e-3,
        )
        same = np.asanyarray(nib.load(out / f"moved_seg_lam{lam}.nii.gz").dataobj) == (
            np.asanyarray(nib.load(reg / "moved_seg.nii.gz").dataobj)
        )
        assert same.mean() > 0.99
    # sweep.csv scores the label maps it writes (one interpolation through the chain)
    from hyperreg.method.metrics import labels_in_both, mean_dice

    with (out / "sweep.csv").open() as handle:
        rows = {f"{float(r['lambda']):g}": float(r["mean_dice"]) for r in csv.DictReader(handle)}
    moving_seg, fixed_seg = (
        np.asanyarray(nib.load(files[k]).dataobj)[..., 0] for k in ("moving_seg", "fixed_seg")
    )
    labels = labels_in_both(moving_seg, fixed_seg)
    for lam in ("0.2", "0.7"):
        written = np.asanyarray(nib.load(out / f"moved_seg_lam{lam}.nii.gz").dataobj)[..., 0]
        assert rows[lam] == pytest.approx(mean_dice(written, fixed_seg, labels), abs=2e-6)


def test_sweep_field_names_keep_every_lambda_apart(files: dict[str, Path], capsys) -> None:
    """λ values that agree to 4 decimals get their own files; a repeated λ is an error first."""
    code = main(_sweep_args(files, "--lambdas", "0.12341,0.12342", "--save-fields"))
    assert code == 0, capsys.readouterr().err
    assert {p.name for p in files["out"].glob("warp_*.nii.gz")} == {
        "warp_lam0.12341.nii.gz",
        "warp_lam0.12342.nii.gz",
    }
    out = files["out"].parent / "repeated"
    args = _sweep_args(files, "--lambdas", "0.3,0.3", "--save-fields")
    args[args.index("--out") + 1] = str(out)
    assert main(args) == 2
    assert "repeats [0.3]" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


def test_sweep_cli_without_labels(files: dict[str, Path], capsys) -> None:
    assert main(_sweep_args(files, "--lambdas", "0.1,0.9")) == 0
    with (files["out"] / "sweep.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and rows[0]["mean_dice"] == ""
    assert (files["out"] / "sweep_montage.png").is_file()
    assert (files["out"] / "sweep_qc.png").is_file()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--lambdas", "0:2:3"], r"\[0, 1\]"),
        (["--lambdas", "0:1:0"], "count"),
        (["--moving-seg", "x.nii.gz"], "--fixed-seg"),
        (["--chunk", "0"], "positive integer"),
    ],
)
def test_sweep_cli_bad_input_exits_2(files: dict[str, Path], capsys, extra, match) -> None:
    assert main(_sweep_args(files, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyperreg sweep: error:") and len(err.strip().splitlines()) == 1
    assert __import__("re").search(match, err), err
    assert not (files["out"] / "sweep.csv").exists()


def test_sweep_cli_missing_file_exits_2(files: dict[str, Path], capsys) -> None:
    files = {**files, "moving": files["out"].parent / "nope.nii.gz"}
    assert main(_sweep_args(files)) == 2
    assert "nope.nii.gz" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# tune_lambda on a model whose answer is known
# --------------------------------------------------------------------------------------------

TRUE_LAMBDA = 0.37
SHIFT = 4.0  # voxels: the fixed image is the moving image shifted by SHIFT along axis 0
SLOPE = 40.0  # voxels of error per unit of |λ - TRUE_LAMBDA|
FOLD_BELOW = 0.42  # the fold stub folds for λ below this


class _KnownModel(nn.Module):
    """Stub with HyperMorph's interface whose displacement is exact only at λ = 0.37.

    ``disp_0 = SHIFT - SLOPE * |λ - 0.37|`` (constant). With ``fold``, for λ < 0.42 a ripple of
    3 voxels (period 4 rows) in a background corner (rows >= 26, columns <= 5, no labels there)
    folds the field there without changing any Dice.
    """

    def __init__(self, fold: bool = False) -> None:
        super().__init__()
        self.config = ModelConfig(ndim=2)
        self.objective = Objective(int_downsize=1)  # HyperMorph carries its objective too
        self.anchor = nn.Parameter(torch.zeros(()))  # gives the model a device
        self.fold = fold

    def forward(self, moving: torch.Tensor, fixed: torch.Tensor, lam) -> RegistrationOutput:
        lam = torch.as_tensor(lam, dtype=torch.float32).reshape(-1)
        batch, _, rows, cols = moving.shape
        disp = torch.zeros(batch, 2, rows, cols)
        disp[:, 0] = (SHIFT - SLOPE * (lam - TRUE_LAMBDA).abs()).view(-1, 1, 1)
        if self.fold:
            ripple = 3.0 * torch.sin(2 * math.pi * torch.arange(rows) / 4.0).view(-1, 1)
            corner = torch.zeros(rows, cols)
            corner[26:, :6] = 1.0
            strength = (lam < FOLD_BELOW).float().view(-1, 1, 1)
            disp[:, 0] += strength * corner * ripple
        return RegistrationOutput(warp(moving, disp), disp, None)


@pytest.fixture()
def known_pairs(tmp_path: Path) -> list[PairSpec]:
    from lambda_helpers import write_nifti

    pairs = []
    for index, (centre, sigma) in enumerate([((12.0, 14.0), 5.0), ((10.0, 12.0), 4.0)]):
        shape = (32, 28)
        fixed = blob(shape, centre, sigma)
        moving = blob(shape, (centre[0] + SHIFT, centre[1]), sigma)  # moved[x] = moving(x + 4)
        paths = {}
        for name, data in (
            ("moving", moving),
            ("fixed", fixed),
            ("moving_seg", labels_of(moving)),
            ("fixed_seg", labels_of(fixed)),
        ):
            paths[name] = write_nifti(tmp_path / f"{index}_{name}.nii.gz", data[..., None])
        pairs.append(PairSpec(index=index, **paths))
    return pairs


def test_tune_finds_the_known_lambda(known_pairs: list[PairSpec]) -> None:
    result = tune_lambda(_KnownModel(), known_pairs, init="none")
    # Dice is 1 exactly while the error |SLOPE (λ - 0.37)| rounds to 0 voxels
    assert abs(result.lambda_star - TRUE_LAMBDA) <= 0.5 / SLOPE
    assert result.dice_at_star == pytest.approx(1.0)
    assert result.constraint_met and result.pairs == 2
    lams = [row["lambda"] for row in result.grid]
    assert lams == sorted(lams) and min(lams) == 0.0 and max(lams) == 1.0
    assert {row["stage"] for row in result.grid} == {"coarse", "bracket1", "bracket2"}
    star_row = next(row for row in result.grid if row["lambda"] == result.lambda_star)
    assert star_row["mean_dice"] == result.dice_at_star
    assert max(row["mean_dice"] for row in result.grid) == result.dice_at_star
    assert set(result.per_label) == {3, 4}
    for entry in result.per_label.values():
        assert entry["lambda"] in lams and entry["dice"] == pytest.approx(1.0)
        assert abs(entry["lambda"] - TRUE_LAMBDA) <= 0.5 / SLOPE


def test_tune_reports_the_range_within_noise_and_no_registration(
    known_pairs: list[PairSpec],
) -> None:
    from hyperreg.apps.tune import DICE_NOISE_FLOOR
    from hyperreg.method.metrics import mean_dice

    result = tune_lambda(_KnownModel(), known_pairs, init="none")
    lo, hi = result.lambda_star_range
    assert lo <= result.lambda_star <= hi
    # both pairs score Dice 1 at λ*, so the standard error is 0 and the floor applies
    assert result.dice_tolerance == DICE_NOISE_FLOOR
    inside = [r for r in result.grid if lo <= r["lambda"] <= hi]
    assert all(r["mean_dice"] >= result.dice_at_star - DICE_NOISE_FLOOR for r in inside)
    assert abs(lo - TRUE_LAMBDA) <= 0.5 / SLOPE and abs(hi - TRUE_LAMBDA) <= 0.5 / SLOPE
    before = []
    for pair in known_pairs:
        moving = _label_data(pair.moving_seg)
        before.append(mean_dice(moving, _label_data(pair.fixed_seg), [3, 4]))
    assert result.dice_before == pytest.approx(np.mean(before))
    assert result.dice_before < result.dice_at_star
    star_row = next(r for r in result.grid if r["lambda"] == result.lambda_star)
    assert star_row["sem_dice"] == 0.0


def _label_data(path: Path) -> np.ndarray:
    from hyperreg.geometry.io import load_volume

    return load_volume(path, label=True).data


def test_sweep_reports_dice_before() -> None:
    pair = _pair(SHAPE)
    results = sweep_lambdas(tiny_model(), pair["moving"], pair["fixed"], [0.2, 0.8], **_segs(pair))
    single = register_pair(tiny_model(), pair["moving"], pair["fixed"], 0.2, **_segs(pair))
    assert single.dice_before is not None
    for result in results:
        assert result.dice_before == pytest.approx(single.dice_before)
    bare = sweep_lambdas(tiny_model(), pair["moving"], pair["fixed"], [0.2])
    assert bare[0].dice_before is None


def _rows(*entries: tuple[float, float, bool]) -> list[dict]:
    return [{"lambda": lam, "mean_dice": dice, "feasible": ok} for lam, dice, ok in entries]


def test_lambda_star_range_on_hand_built_rows() -> None:
    from hyperreg.apps.tune import lambda_star_range

    rows = _rows(
        (0.0, 0.805, False),  # better, but over the folding limit: never in the range
        (0.1, 0.795, True),
        (0.2, 0.800, True),
        (0.3, 0.785, True),  # a dip below the tolerance inside the range does not split it
        (0.4, 0.792, True),
        (0.5, 0.700, True),
    )
    for row in rows:
        row["sem_dice"] = 0.01
    assert lambda_star_range(rows, 0.2) == (0.1, 0.4, 0.01)
    # a standard error below the floor, or none (one pair): the tolerance is 0.002
    for sem in (0.0005, None, float("nan")):
        for row in rows:
            row["sem_dice"] = sem
        assert lambda_star_range(rows, 0.2) == (0.2, 0.2, 0.002)
    rows[1]["mean_dice"] = 0.7985
    assert lambda_star_range(rows, 0.2) == (0.1, 0.2, 0.002)
    # λ* infeasible (no λ met the limit): the range is λ* alone
    assert lambda_star_range(rows, 0.0) == (0.0, 0.0, 0.002)
    with pytest.raises(ValueError, match="'star'"):
        lambda_star_range(rows, 0.25)


def test_lambda_star_is_rounded_to_its_range() -> None:
    from hyperreg.apps.tune import TuneResult

    grid = _rows((0.3, 0.8, True), (0.3333, 0.8, True), (0.34, 0.8, True), (0.4, 0.8, True))
    result = TuneResult(0.3333, 0.8, 0.0, True, {}, grid, 2, None, (0.2, 0.4), 0.004, 0.6)
    assert result.lambda_star_rounded == "0.33"
    assert result.lambda_star_text == "0.33 (0.2 to 0.4 within noise)"
    result.lambda_star_range = (0.3333, 0.3333)  # nearest evaluated neighbour 0.0067 away
    assert result.lambda_star_text == "0.3333 (no other λ within noise)"
    result.lambda_star_range = (0.33, 0.34)
    assert result.lambda_star_text == "0.333 (0.33 to 0.34 within noise)"
    result.lambda_star_range = None
    assert result.lambda_star_text == "0.3333"
    assert result.to_dict()["lambda_star_range"] is None


def test_tune_respects_the_folding_limit(known_pairs: list[PairSpec]) -> None:
    free = tune_lambda(_KnownModel(fold=True), known_pairs, init="none")
    limited = tune_lambda(_KnownModel(fold=True), known_pairs, max_folding=0.0, init="none")
    assert limited.constraint_met
    assert limited.folding_percent_at_star == 0.0
    assert free.folding_percent_at_star > 0.0  # the unconstrained optimum folds
    assert abs(free.lambda_star - TRUE_LAMBDA) <= 0.5 / SLOPE and free.dice_at_star == 1.0
    assert FOLD_BELOW <= limited.lambda_star <= FOLD_BELOW + 0.01  # first feasible λ evaluated
    assert limited.dice_at_star < free.dice_at_star
    feasible = [r for r in limited.grid if r["folding_percent"] <= 0.0]
    assert limited.dice_at_star == max(r["mean_dice"] for r in feasible)
    for entry in limited.per_label.values():
        row = next(r for r in limited.grid if r["lambda"] == entry["lambda"])
        assert row["feasible"]


def test_tune_unmet_limit_warns(known_pairs: list[PairSpec]) -> None:
    with pytest.warns(UserWarning, match="least"):
        result = tune_lambda(
            _KnownModel(fold=True),
            known_pairs[:1],
            lambdas=[0.0, 0.2],
            bracket_rounds=0,
            max_folding=0.0,
            init="none",
        )
    assert not result.constraint_met and result.lambda_star == 0.2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lambdas": [0.5]}, "2 distinct"),
        ({"max_folding": -1.0}, "max_folding"),
        ({"bracket_points": 0}, "bracket_points"),
    ],
)
def test_tune_rejects(known_pairs: list[PairSpec], kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tune_lambda(_KnownModel(), known_pairs, **kwargs)
    with pytest.raises(ValueError, match="moving_seg"):
        tune_lambda(_KnownModel(), [PairSpec(0, Path("m.nii.gz"), Path("f.nii.gz"))])


def test_tune_cli_writes_json_and_figure(tmp_path: Path, capsys) -> None:
    rows = []
    for tag, offset in (("a", 0.0), ("b", 1.5)):
        paths = write_pair(tmp_path / "val", tag, offset)
        rows.append({k: p.name for k, p in paths.items()})
    pairs_csv = tmp_path / "val" / "pairs.csv"
    with pairs_csv.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["moving", "fixed", "moving_seg", "fixed_seg"])
        writer.writeheader()
        writer.writerows(rows)
    model = save_tiny_model(tmp_path / "model.pt")
    out = tmp_path / "tune"
    args = ["tune", "--model", str(model), "--pairs", str(pairs_csv), "--out", str(out)]
    assert main([*args, "--max-folding", "0.5"]) == 0, capsys.readouterr().err
    report = json.loads((out / "tune.json").read_text())
    assert 0.0 <= report["lambda_star"] <= 1.0
    grid = {row["lambda"]: row for row in report["grid"]}
    assert grid[report["lambda_star"]]["mean_dice"] == report["dice_at_star"]
    assert report["dice_at_star"] == max(r["mean_dice"] for r in report["grid"] if r["feasible"])
    assert set(report["per_label_lambda_star"]) == {"3", "4"}
    assert report["max_folding_percent"] == 0.5 and report["pairs"] == 2
    lo, hi = report["lambda_star_range"]
    assert lo <= report["lambda_star"] <= hi and report["dice_noise_tolerance"] >= 0.002
    assert 0.0 <= report["dice_before"] <= 1.0
    assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG"
    said = capsys.readouterr().out
    assert "λ* =" in said
    # λ counted once, not once per pair: the grid's 11 plus the bracketing rounds' new values
    coarse = sum(row["stage"] == "coarse" for row in report["grid"])
    total = len(report["grid"])
    assert coarse == 11 and total > coarse
    assert (
        f"{total} λ ({coarse} on the grid, {total - coarse} in bracketing rounds) × 2 pair(s) "
        f"= {2 * total} registrations"
    ) in said
    # a validation CSV without label maps is bad input
    bad_csv = tmp_path / "val" / "nolabels.csv"
    bad_csv.write_text("moving,fixed\na_moving.nii.gz,a_fixed.nii.gz\n")
    assert main(["tune", "--model", str(model), "--pairs", str(bad_csv), "--out", str(out)]) == 2
    assert "moving_seg" in capsys.readouterr().err


def test_sweep_qc_figure_shows_the_moved_image_on_the_fixed_images_scale(
    tmp_path: Path, monkeypatch
) -> None:
    """Raw intensities 0-2000: the QC 'after' image is normalised like the 'before' one."""
    import nibabel as nib

    import hyperreg.apps.sweep_figures as sweep_module

    raw = write_pair(tmp_path / "raw", "r")
    for key in ("moving", "fixed"):
        img = nib.load(raw[key])
        scaled = np.asarray(img.dataobj, dtype=np.float32) * 2000.0
        nib.save(nib.Nifti1Image(scaled, img.affine, img.header), raw[key])
    shown = []
    real = sweep_module.checkerboard
    monkeypatch.setattr(
        sweep_module, "checkerboard", lambda a, b, *k, **kw: shown.append(a) or real(a, b, *k, **kw)
    )
    model = save_tiny_model(tmp_path / "model.pt")
    args = ["sweep", "--model", str(model), "--moving", str(raw["moving"]), "--fixed"]
    args += [str(raw["fixed"]), "--out", str(tmp_path / "out"), "--lambdas", "0.3"]
    args += ["--init", "none"]
    assert main(args) == 0
    before, after = shown
    assert float(before.max()) <= 1.0 + 1e-6
    assert 0.5 < float(after.max()) <= 1.0 + 1e-3
