"""λ when none is given (the model's default, with its source) and λ chosen per pair
(``--lambda auto``): the library functions and the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lambda_helpers import write_blob_pair
from hyperreg.apps.models import (
    FALLBACK_LAMBDA,
    DefaultLambda,
    check_lambda,
    checkpoint_default_lambda,
    model_default_lambda,
    resolve_model,
)
from hyperreg.pretrained import default_model
from hyperreg.cli import main
from hyperreg.registration.autolambda import AUTO_GRID
from hyperreg.registration.pipeline import InputError


@pytest.fixture()
def pair(tmp_path: Path) -> dict[str, Path]:
    """Two 64 x 64 blobs (:func:`lambda_helpers.write_blob_pair`) and an output folder."""
    return {**write_blob_pair(tmp_path), "out": tmp_path / "out"}


def test_default_lambda_sources_in_order(tmp_path: Path) -> None:
    path = tmp_path / "best.pt"
    own = checkpoint_default_lambda({"default_lambda": 0.2, "validation": {"dice_0.5": 0.9}}, path)
    assert own.lam == 0.2 and "default_lambda" in own.source
    row = {"score": 0.7, "mean_dice": 0.7, "dice_0.1": 0.70, "dice_0.3": 0.74, "dice_0.5": 0.72}
    best = checkpoint_default_lambda({"validation": row, "step": 900}, path)
    assert best.lam == 0.3 and "validation Dice" in best.source and "900" in best.source
    nan_only = checkpoint_default_lambda({"validation": {"dice_0.3": float("nan")}}, path)
    assert nan_only.lam == FALLBACK_LAMBDA and "fallback" in nan_only.source
    bundled = default_model(2)
    card = checkpoint_default_lambda({}, bundled.path)
    assert card.lam == 0.05 and bundled.name in card.source


def test_resolve_model_records_the_default_on_the_model() -> None:
    resolved = resolve_model("hypermorph-2d")  # by name: still the bundled model's card
    assert resolved.default_lambda is not None and resolved.default_lambda.lam == 0.05
    assert model_default_lambda(resolved.model) == resolved.default_lambda
    assert model_default_lambda(object()).lam == FALLBACK_LAMBDA


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -0.1, "best", True])
def test_check_lambda_refuses(bad) -> None:
    with pytest.raises(InputError, match=r"'lam' must be a number in \[0, 1\], 'auto' or None"):
        check_lambda("f", bad)


def test_check_lambda_accepts_numpy_numbers() -> None:
    check_lambda("f", np.float32(0.3))
    check_lambda("f", np.float64(1.0))
    check_lambda("f", "auto")
    check_lambda("f", None)


def test_register_files_without_lambda_uses_the_default(pair: dict[str, Path]) -> None:
    from hyperreg.apps.register import register_files

    model = resolve_model("hypermorph-2d").model
    result = register_files(model, pair["moving"], pair["fixed"], init="none")
    assert result.lam == pytest.approx(0.05) and "hypermorph-2d" in result.lam_reason
    model.default_lambda = DefaultLambda(0.7, "a test")
    assert register_files(model, pair["moving"], pair["fixed"], init="none").lam == (
        pytest.approx(0.7)
    )


def test_register_cli_default_and_auto(pair: dict[str, Path], capsys) -> None:
    base = ["register", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    base += ["--moved", str(pair["out"] / "moved.nii.gz"), "--init", "none", "--device", "cpu"]
    assert main([*base, "-v"]) == 0
    out = capsys.readouterr().out
    assert "λ = 0.05: the model's default λ, from the card of the bundled model hypermorph-2d" in (
        out
    )
    assert main([*base, "--lambda", "auto", "-v"]) == 0
    out = capsys.readouterr().out
    line = next(t for t in out.splitlines() if "auto:" in t)
    assert float(line.split("=")[1].split(":")[0]) in AUTO_GRID
    assert main([*base, "--lambda", "auto"]) == 0  # without -v the λ line still says why
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("λ = "))
    assert "(auto: " in line and ("similarity" in line or "folding" in line)
    assert main([*base, "--lambda", "0.3"]) == 0
    assert "default λ" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("value", "message"),
    [("nan", "lie in"), ("1.5", "lie in"), ("-0.2", "lie in"), ("best", "or 'auto'")],
)
def test_lambda_errors_name_the_option(pair: dict[str, Path], capsys, value, message) -> None:
    images = ["--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    for command in (
        ["register", *images, "--moved", "x.nii.gz"],
        ["sweep", *images, "--out", "o"],
        ["batch", "--pairs", "p.csv", "--out", "o"],
    ):
        assert main([*command, "--lambda", value]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "argument --lambda" in err and message in err


def test_sweep_and_batch_auto(pair: dict[str, Path], capsys) -> None:
    import csv

    images = ["--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    out = pair["out"]
    sweep = ["sweep", *images, "--lambdas", "0.2,0.5", "--lambda", "auto", "--init", "none"]
    assert main([*sweep, "--out", str(out / "sweep"), "--device", "cpu"]) == 0
    assert "chosen λ = " in capsys.readouterr().out
    with open(out / "sweep" / "sweep.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["chosen"].startswith("auto: ")
    assert float(chosen[0]["lambda"]) in AUTO_GRID

    table = out / "pairs.csv"
    table.write_text(f"moving,fixed\n{pair['moving']},{pair['fixed']}\n")
    batch = ["batch", "--pairs", str(table), "--out", str(out / "batch"), "--lambda", "auto"]
    assert main([*batch, "--init", "none", "--no-progress", "--device", "cpu"]) == 0
    with open(out / "batch" / "summary.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["lambda"] == "auto" and float(row["lambda_chosen"]) in AUTO_GRID
    assert row["lambda_reason"].startswith("auto: ")
