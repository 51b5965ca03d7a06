"""Refinement when none is asked for: a model's default steps (a bundled model's card), how
``register`` and ``batch`` use them and say so, and ``--refine 0`` / ``sweep`` running none."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lambda_helpers import write_blob_pair
from hyperreg.apps import models
from hyperreg.apps.models import (
    DefaultRefine,
    checkpoint_default_refine,
    model_default_refine,
    pair_refinement,
    resolve_model,
)
from hyperreg.cli import main
from hyperreg.pretrained import bundled_models, default_model
from hyperreg.registration.refine import Refinement


@pytest.fixture()
def pair(tmp_path: Path) -> dict[str, Path]:
    """Two 64 x 64 blobs (:func:`lambda_helpers.write_blob_pair`) and an output folder."""
    return {**write_blob_pair(tmp_path), "out": tmp_path / "out"}


@pytest.fixture()
def three_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model resolved from now on records a default of 3 refinement steps."""
    found = DefaultRefine(3, "refinement: 3 steps, a test")
    monkeypatch.setattr(models, "checkpoint_default_refine", lambda path, payload=None: found)


def test_the_cards_give_the_defaults(tmp_path: Path) -> None:
    three_d = default_model(3)
    found = checkpoint_default_refine(three_d.path)
    assert found.steps == three_d.default_refine == 30
    source = f"refinement: 30 steps, the default of the bundled model {three_d.name} ("
    assert found.source.startswith(source)
    assert checkpoint_default_refine(default_model(2).path).steps == 0
    assert checkpoint_default_refine(tmp_path / "model.pt").steps == 0
    assert {m.name: m.default_refine for m in bundled_models()} == {
        "hypermorph-2d": 0,
        "hypermorph-3d": 30,
    }


def test_pair_refinement_resolves_none_only() -> None:
    resolved = resolve_model("hypermorph-2d")
    assert model_default_refine(resolved.model).steps == 0
    assert pair_refinement(resolved.model, None) is None
    resolved.model.default_refine = DefaultRefine(4, "a test")
    assert pair_refinement(resolved.model, None) == Refinement(steps=4)
    assert pair_refinement(resolved.model, Refinement(steps=0)) is None
    given = Refinement(steps=7, sim="mi")
    assert pair_refinement(resolved.model, given) is given
    assert model_default_refine(object()).steps == 0


def test_register_files_refines_by_the_models_default(pair: dict[str, Path]) -> None:
    from hyperreg.apps.register import register_files

    model = resolve_model("hypermorph-2d").model
    args = (model, pair["moving"], pair["fixed"], 0.3)
    assert register_files(*args, init="none").refinement is None
    model.default_refine = DefaultRefine(3, "a test")
    refined = register_files(*args, init="none").refinement
    assert refined is not None and 0 < refined.steps <= 3
    assert register_files(*args, init="none", refine=Refinement(steps=0)).refinement is None


def test_register_cli_says_why_it_refined(pair: dict[str, Path], capsys, three_steps) -> None:
    base = ["register", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    base += ["--moved", str(pair["out"] / "moved.nii.gz"), "--init", "none", "--device", "cpu"]
    assert main([*base, "-v"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, t in enumerate(lines) if t.startswith("refined"))
    assert lines[at - 1] == "refinement: 3 steps, a test; --refine 0: the network alone"
    assert main([*base, "--refine", "0"]) == 0
    assert "refined" not in capsys.readouterr().out
    assert main([*base, "--refine", "2", "-v"]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("refined"))
    assert "a test" not in line


def test_batch_and_sweep_with_a_default(pair: dict[str, Path], capsys, three_steps) -> None:
    out = pair["out"]
    table = out.parent / "pairs.csv"
    table.write_text(f"moving,fixed\n{pair['moving']},{pair['fixed']}\n")
    batch = ["batch", "--pairs", str(table), "--init", "none", "--no-progress", "--device", "cpu"]
    assert main([*batch, "--out", str(out / "b")]) == 0
    assert "batch: refinement: 3 steps, a test; --refine 0" in capsys.readouterr().out
    assert main([*batch, "--out", str(out / "b0"), "--refine", "0"]) == 0
    assert "refinement:" not in capsys.readouterr().out
    for name, refined in (("b", True), ("b0", False)):
        with open(out / name / "summary.csv", newline="") as handle:
            (row,) = list(csv.DictReader(handle))
        assert bool(row["refine_seconds"]) is refined
    images = ["--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    sweep = ["sweep", *images, "--lambdas", "0.2,0.5", "--init", "none", "--device", "cpu"]
    assert main([*sweep, "--out", str(out / "s")]) == 0
    assert "refined" not in capsys.readouterr().out  # sweep refines only when asked


@pytest.mark.parametrize("option", [["--refine-sim", "mi"], ["--refine-lr", "0.2"]])
def test_refine_settings_without_steps(
    pair: dict[str, Path], capsys, monkeypatch: pytest.MonkeyPatch, option
) -> None:
    base = ["register", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    base += ["--moved", str(pair["out"] / "moved.nii.gz"), "--init", "none", "--device", "cpu"]
    # a model that refines no steps by default: the settings alone are an error
    assert main([*base, *option]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hyperreg register: error: argument --refine: give --refine a number of steps: the "
        "model refines none by default, so a similarity or learning rate alone would change "
        "nothing"
    )
    assert not (pair["out"] / "moved.nii.gz").exists()
    sweep = ["sweep", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    assert main([*sweep, "--out", str(pair["out"] / "s"), *option]) == 2
    assert f"{option[0]} needs --refine N" in capsys.readouterr().err
    # a model with a default: its steps, with these settings
    found = DefaultRefine(3, "refinement: 3 steps, a test")
    monkeypatch.setattr(models, "checkpoint_default_refine", lambda path, payload=None: found)
    assert main([*base, *option, "-v"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(t for t in lines if t.startswith("refined"))
    assert ("MI (nats)" in line) is (option[0] == "--refine-sim")


def test_pair_refinement_with_default_steps() -> None:
    from hyperreg.apps.models import DefaultSteps
    from hyperreg.registration.pipeline import InputError

    model = resolve_model("hypermorph-2d").model
    with pytest.raises(InputError, match="'refine' a number of steps"):
        pair_refinement(model, DefaultSteps(sim="mi"))
    model.default_refine = DefaultRefine(5, "a test")
    assert pair_refinement(model, DefaultSteps(sim="mi", lr=0.3)) == Refinement(
        steps=5, sim="mi", lr=0.3
    )
    with pytest.raises(InputError, match="'lr' must lie in"):
        pair_refinement(model, DefaultSteps(lr=-1.0))


def test_load_pretrained_models_carry_their_cards_defaults() -> None:
    from hyperreg import load_pretrained
    from hyperreg.apps.models import model_default_lambda

    three_d, two_d = load_pretrained(ndim=3), load_pretrained(ndim=2)
    assert model_default_refine(three_d).steps == 30 and model_default_refine(two_d).steps == 0
    assert pair_refinement(three_d, None) == Refinement(steps=30)
    assert model_default_lambda(three_d).lam == default_model(3).default_lambda
    assert "hypermorph-3d" in model_default_lambda(three_d).source
    assert model_default_lambda(two_d).lam == default_model(2).default_lambda
