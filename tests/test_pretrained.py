"""The bundled pretrained models: listed, chosen by dimensionality, used without --model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from lambda_helpers import write_pair

from hyperreg.pretrained import bundled_models, default_model, load_pretrained
from hyperreg.cli import main


def test_a_2d_model_is_bundled_with_its_card() -> None:
    models = bundled_models()
    two_d = [m for m in models if m.ndim == 2]
    assert two_d, f"no bundled 2D model: {models}"
    for m in models:
        assert m.path.stat().st_size <= 10_000_000, f"{m.path} is over 10 MB"
        card = m.card.read_text()
        for section in ("command", "people", "steps", "λ"):
            assert section in card, f"model card {m.card} has no '{section}'"
    assert default_model(2).ndim == 2
    model = load_pretrained(2)
    assert model.config.ndim == 2 and not model.training


def test_model_cards_speak_of_the_model_not_its_development() -> None:
    """A card is read by users: no work diary (sessions, run folders, verdict words of the
    project's own targets)."""
    import re

    diary = re.compile(r"\bsession\b|\bsessions\b|MISSED|runs/|\brun [A-F]\b", re.IGNORECASE)
    for m in bundled_models():
        texts = [m.card.read_text(), m.summary, m.default_lambda_note, m.default_refine_note]
        for text in texts:
            found = diary.findall(text or "")
            assert not found, f"{m.card.name}: development history in user text: {found}"


def test_no_bundled_model_for_a_dimensionality_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no bundled model registers 3D images"):
        default_model(3, folder=tmp_path)  # an empty folder: nothing shipped


def test_a_malformed_index_is_a_packaging_error(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text(json.dumps({"models": [{"name": "x"}]}))
    with pytest.raises(RuntimeError, match="malformed"):
        bundled_models(tmp_path)


def test_register_without_model_uses_the_bundled_one(tmp_path: Path, capsys) -> None:
    pair = write_pair(tmp_path, "p")
    moved = tmp_path / "moved.nii.gz"
    args = ["register", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    code = main([*args, "--lambda", "0.3", "--moved", str(moved), "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "using the bundled model" in out.out
    assert moved.is_file()


def test_a_default_register_says_what_ran_in_six_lines(tmp_path: Path, capsys) -> None:
    """What ran, λ and its source, the outputs, Dice, folding: about six lines; -v says more."""
    pair = write_pair(tmp_path, "p")
    args = ["register", "--moving", str(pair["moving"]), "--fixed", str(pair["fixed"])]
    args += ["--moving-seg", str(pair["moving_seg"]), "--fixed-seg", str(pair["fixed_seg"])]
    args += ["--moved", str(tmp_path / "moved.nii.gz"), "--device", "cpu"]
    assert main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) <= 6, printed
    said = "\n".join(printed)
    assert "using the bundled model" in said and "λ = 0.05 (the model's default λ" in said
    assert "mean Dice" in said and "folding" in said and "wrote" in said
    assert main([*args, "-v"]) == 0
    assert len(capsys.readouterr().out.splitlines()) > len(printed)


def test_models_command_lists_them(capsys) -> None:
    assert main(["models"]) == 0
    printed = capsys.readouterr().out
    assert all(m.name in printed for m in bundled_models())
    assert "model card" in printed
    assert "defaults: λ 0.2, refinement 30 steps, passes 2, flip averaging" in printed  # 3D


def test_demo_registers_with_the_bundled_model(tmp_path: Path) -> None:
    from hyperreg.apps.demo import run_demo

    report = run_demo(tmp_path / "demo", device="cpu", eval_pairs=1, progress=False)
    assert "bundled pretrained model" in report
    import csv

    with (tmp_path / "demo" / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows and all(0 <= float(r["dice"]) <= 1 for r in rows)
    assert not (tmp_path / "demo" / "model").exists()  # nothing was trained


def test_export_model_stores_float16_weights_that_load_as_float32(tmp_path: Path) -> None:
    import torch
    from lambda_helpers import save_tiny_model

    from hyperreg.pretrained import export_model
    from hyperreg.method.model import load_checkpoint

    full = save_tiny_model(tmp_path / "full.pt")
    slim = export_model(full, tmp_path / "slim.pt")
    stored = torch.load(slim, weights_only=True)["state_dict"]
    assert all(v.dtype == torch.float16 for v in stored.values() if v.is_floating_point())
    (a, _), (b, _) = load_checkpoint(full), load_checkpoint(slim)
    assert all(p.dtype == torch.float32 for p in b.parameters())
    for name, value in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[name], value, rtol=1e-3, atol=1e-6)
    x = torch.rand(1, 1, 24, 20)
    lam = torch.tensor([[0.3]])
    with torch.no_grad():
        torch.testing.assert_close(
            b(x, x.flip(2), lam).disp, a(x, x.flip(2), lam).disp, rtol=0.02, atol=0.02
        )


def test_a_3d_model_is_bundled_and_registers_a_1mm_pair_at_its_2mm(tmp_path: Path, capsys) -> None:
    import nibabel as nib
    import numpy as np

    bundled = default_model(3)
    assert bundled.ndim == 3 and bundled.path.stat().st_size <= 10_000_000
    model = load_pretrained(3)
    assert model.config.ndim == 3 and model.config.spacing == 2.0
    grid = np.stack(np.meshgrid(*[np.arange(40.0)] * 3, indexing="ij"))
    paths = {}
    for name, centre in (("moving", (18.0, 20.0, 21.0)), ("fixed", (20.0, 20.0, 19.0))):
        image = np.exp(-((grid - np.array(centre)[:, None, None, None]) ** 2).sum(0) / 60.0)
        paths[name] = tmp_path / f"{name}.nii.gz"
        nib.save(nib.Nifti1Image(image.astype(np.float32), np.eye(4)), paths[name])
    moved = tmp_path / "moved.nii.gz"
    args = ["register", "--moving", str(paths["moving"]), "--fixed", str(paths["fixed"])]
    args += ["--init", "none", "--lambda", "0.3", "--moved", str(moved), "--device", "cpu"]
    code = main([*args, "-v"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "using the bundled model" in out.out and "hypermorph-3d" in out.out
    assert "model's 2 mm voxels" in out.out + out.err
    assert nib.load(moved).shape == (40, 40, 40)


def test_bundled_models_are_named_for_model_and_init(tmp_path: Path, monkeypatch) -> None:
    """--model hypermorph-2d and --init hypermorph-2d work from any folder."""
    import hyperreg.training.train as training

    from hyperreg.apps.models import model_file as model_path

    assert model_path("hypermorph-2d") == default_model(2).path
    seen = {}

    def train(config, *args, **kwargs):  # the run's config, and the init model as its result
        seen["c"] = config
        Path(config.out).mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(default_model(2).path, Path(config.out) / "model.pt"))

    monkeypatch.setattr(training, "train", train)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scans").mkdir()
    args = ["train", "--data", "scans", "--init", "hypermorph-2d", "--out", "run"]
    assert main([*args, "--device", "cpu"]) == 0
    assert Path(seen["c"].init) == default_model(2).path
