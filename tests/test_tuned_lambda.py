"""``tune`` feeds ``register``: ``--lambda tune.json`` in register, sweep and batch; what tune
measures (refinement as register runs it, or said); the bracketing flags' names.

Tiny 2D pairs and a tiny model (tests/lambda_helpers.py), run in-process through
``hyperreg.cli.main``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from lambda_helpers import save_tiny_model, write_pair

from hyperreg.apps.tune import read_tuned_lambda
from hyperreg.cli import main


@pytest.fixture()
def pair(tmp_path: Path) -> dict[str, Path]:
    paths = write_pair(tmp_path / "data", "a")
    paths["model"] = save_tiny_model(tmp_path / "model.pt")
    row = {k: str(paths[k]) for k in ("moving", "fixed", "moving_seg", "fixed_seg")}
    paths["csv"] = tmp_path / "pairs.csv"
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    return paths


def _tune(pair: dict[str, Path], out: Path, *extra: str) -> list[str]:
    args = ["tune", "--model", str(pair["model"]), "--pairs", str(pair["csv"])]
    return [*args, "--out", str(out), "--lambdas", "0.1,0.6", "--device", "cpu", *extra]


def test_tune_json_drives_register_sweep_and_batch(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(_tune(pair, tmp_path / "tune", "--bracket-rounds", "1", "--bracket-points", "1")) == 0
    )
    tune_json = tmp_path / "tune" / "tune.json"
    record = json.loads(tune_json.read_text())
    star = record["lambda_star"]
    assert record["refine_steps"] == 0 and record["passes"] == 1  # what each λ ran with
    assert star in {row["lambda"] for row in record["grid"]}
    capsys.readouterr()

    common = ["--model", str(pair["model"]), "--device", "cpu", "--lambda", str(tune_json)]
    moved = tmp_path / "reg" / "moved.nii.gz"
    reg = ["register", *common, "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    assert main([*reg, "--moved", str(moved)]) == 0
    out = capsys.readouterr().out
    said = f"hyperreg register: λ {star:.4g} (from tune.json: λ* over 1 validation pair, "
    assert said in out, out
    assert f"λ = {star:g}: wrote {moved}" in out  # registered at λ*

    sweep = ["sweep", *common, "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    assert main([*sweep, "--lambdas", "0.9", "--out", str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert f"chosen λ = {star:.4g}: given" in out and "hyperreg sweep: λ" in out
    with (tmp_path / "sweep" / "sweep.csv").open() as handle:
        chosen = [row for row in csv.DictReader(handle) if row["chosen"]]
    assert [float(row["lambda"]) for row in chosen] == pytest.approx([star], abs=1e-6)

    batch = ["batch", *common, "--pairs", str(pair["csv"]), "--out", str(tmp_path / "batch")]
    assert main([*batch, "--no-progress"]) == 0
    assert "hyperreg batch: λ" in capsys.readouterr().out
    with (tmp_path / "batch" / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(r["lambda_chosen"]) for r in rows] == pytest.approx([star], abs=1e-6)


def test_lambda_file_errors_name_the_option(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reg = ["register", "--model", str(pair["model"]), "--moving", str(pair["moving"])]
    reg += ["--fixed", str(pair["fixed"]), "--device", "cpu", "--moved", str(tmp_path / "m.nii")]
    missing = tmp_path / "gone.json"
    assert main([*reg, "--lambda", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"hyperreg register: error: argument --lambda: no such file: '{missing}'"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"lambda_star": 1.5}))
    assert main([*reg, "--lambda", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --lambda" in err and "lambda_star" in err
    assert not (tmp_path / "m.nii").exists()


def test_read_tuned_lambda_says_what_it_was_measured_with(tmp_path: Path) -> None:
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"lambda_star": 0.25, "pairs": 8, "refine_steps": 30, "passes": 2}))
    tuned = read_tuned_lambda(path)
    assert tuned.lam == 0.25 and (tuned.refine_steps, tuned.passes) == (30, 2)
    expected = "from tune.json: λ* over 8 validation pairs, refined 30 steps, 2 network passes"
    assert tuned.source == expected
    assert read_tuned_lambda(tmp_path).lam == 0.25  # a folder: its tune.json


def test_tune_measures_the_model_default_refinement(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from hyperreg.apps import models

    def refining(path: object, payload: object = None) -> models.DefaultRefine:
        return models.DefaultRefine(2, "refinement: 2 steps, a test default")

    monkeypatch.setattr(models, "checkpoint_default_refine", refining)
    assert main(_tune(pair, tmp_path / "t1", "--bracket-rounds", "0")) == 0
    out = capsys.readouterr().out
    assert "each λ registered as 'register' runs it: 1 network pass, refined 2 steps" in out
    assert json.loads((tmp_path / "t1" / "tune.json").read_text())["refine_steps"] == 2
    assert main(_tune(pair, tmp_path / "t2", "--bracket-rounds", "0", "--refine", "0")) == 0
    out = capsys.readouterr().out
    assert "not as 'register' runs it by default (refined 2 steps)" in out
    assert json.loads((tmp_path / "t2" / "tune.json").read_text())["refine_steps"] == 0


def test_bracket_flags_and_their_former_names(
    pair: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(_tune(pair, tmp_path / "new", "--bracket-rounds", "1", "--bracket-points", "2")) == 0
    )
    grid = json.loads((tmp_path / "new" / "tune.json").read_text())["grid"]
    assert len(grid) == 4 and {r["stage"] for r in grid} == {"coarse", "bracket1"}
    capsys.readouterr()
    assert main(_tune(pair, tmp_path / "old", "--refine-rounds", "0")) == 0
    err = capsys.readouterr().err
    assert "--refine-rounds is now --bracket-rounds" in err
    assert len(json.loads((tmp_path / "old" / "tune.json").read_text())["grid"]) == 2
