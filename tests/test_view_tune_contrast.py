"""``view`` and ``tune`` handle a pair of other contrasts as ``register`` does: the affine stage
run again, the moving image drawn in the fixed image's intensities for the network, the
verdict's similarity and (view) the raised default λ; ``--contrast`` on both commands."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from lambda_helpers import write_nifti
from test_contrast import T1, T2, phantom

from hyperreg.apps.inputs import PairSpec
from hyperreg.apps.models import resolve_model
from hyperreg.apps.register import register_files
from hyperreg.apps.tune import tune_lambda
from hyperreg.apps.view import open_view
from hyperreg.cli import main


def _classes(shift: float = 0.0) -> np.ndarray:
    """The phantom's tissue classes (0 background, 1 CSF, 2 grey, 3 white) as a label map."""
    return np.searchsorted([0.1, 0.3, 0.7], phantom(T1, shift), side="right").astype(np.int16)


@pytest.fixture()
def t2_pair(tmp_path: Path) -> dict[str, Path]:
    """A T2-like moving phantom and a T1-like fixed one, 1.5 voxels apart, with label maps."""
    return {
        "moving": write_nifti(tmp_path / "t2.nii.gz", phantom(T2, 1.5, seed=1)),
        "fixed": write_nifti(tmp_path / "t1.nii.gz", phantom(T1)),
        "moving_seg": write_nifti(tmp_path / "t2_seg.nii.gz", _classes(1.5)),
        "fixed_seg": write_nifti(tmp_path / "t1_seg.nii.gz", _classes()),
    }


@pytest.fixture(scope="module")
def model():
    return resolve_model("hypermorph-2d").model


def test_view_registers_a_t2_pair_as_register_does(t2_pair, model, tmp_path: Path) -> None:
    images = {k: t2_pair[k] for k in ("moving", "fixed")}
    session = open_view(model, **images, out=tmp_path / "view", init="none", grid=[0.3])
    assert session.similarity == "ngf" and session.pair.remapped is not None
    assert session.lam == pytest.approx(0.2)  # the model's 0.05, raised as register raises it
    viewed, _ = session.result(0.3)
    registered = register_files(model, *images.values(), 0.3, init="none")
    np.testing.assert_allclose(viewed.disp, registered.disp, atol=1e-5)
    assert viewed.verdict is not None and registered.verdict is not None
    assert viewed.verdict.kept == registered.verdict.kept
    assert viewed.verdict.similarity_after == pytest.approx(registered.verdict.similarity_after)
    # the images as read, as before: no remapped image, the model's similarity and λ
    same = open_view(model, **images, out=tmp_path / "same", init="none", contrast="same")
    assert same.similarity is None and same.pair.remapped is None
    assert same.lam == pytest.approx(0.05)
    assert not np.allclose(same.result(0.3)[0].disp, viewed.disp, atol=1e-3)
    with pytest.raises(ValueError, match="'contrast' must be one of"):
        open_view(model, **images, init="none", contrast="t2")


def test_tune_registers_a_t2_pair_as_register_does(t2_pair, model) -> None:
    spec = PairSpec(0, **t2_pair)
    options = dict(lambdas=[0.2, 0.6], bracket_rounds=0, init="none")
    auto = {row["lambda"]: row["mean_dice"] for row in tune_lambda(model, [spec], **options).grid}
    segs = {k: t2_pair[k] for k in ("moving_seg", "fixed_seg")}
    for lam, dice in auto.items():  # tune scores every field as it is (no never-worse rule)
        found = register_files(
            model, t2_pair["moving"], t2_pair["fixed"], lam, init="none", never_worse=False,
            **segs,
        )  # fmt: skip
        assert dice == pytest.approx(found.mean_dice, abs=1e-6)
    same = tune_lambda(model, [spec], contrast="same", **options).grid
    assert [row["mean_dice"] for row in same] != pytest.approx(list(auto.values()), abs=1e-4)
    # a row's own contrast cell wins over the option, as in batch
    row_same = PairSpec(0, **t2_pair, contrast="same")
    assert tune_lambda(model, [row_same], **options).grid == same
    with pytest.raises(ValueError, match="'contrast' must be one of"):
        tune_lambda(model, [spec], contrast="t2", **options)


def test_cli_view_and_tune_take_contrast(t2_pair, tmp_path: Path, capsys, caplog) -> None:
    rows = tmp_path / "pairs.csv"
    with rows.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(t2_pair))
        writer.writeheader()
        writer.writerow({k: str(v) for k, v in t2_pair.items()})
    tune = ["tune", "--pairs", str(rows), "--init", "none", "--lambdas", "0.2,0.6"]
    tune += ["--bracket-rounds", "0", "--device", "cpu"]
    for extra, other in (([], True), (["--contrast", "same"], False)):
        caplog.clear()
        with caplog.at_level("INFO", logger="hyperreg"):
            assert main([*tune, *extra, "--out", str(tmp_path / f"tune{len(extra)}")]) == 0
        assert any("other contrasts (" in r.getMessage() for r in caplog.records) is other
    capsys.readouterr()
    view = ["view", "--moving", str(t2_pair["moving"]), "--fixed", str(t2_pair["fixed"])]
    for command in ([*view, "--no-browser"], [*tune, "--out", str(tmp_path / "bad")]):
        assert main([*command, "--contrast", "t2"]) == 2
        err = capsys.readouterr().err
        assert "--contrast" in err and len(err.strip().splitlines()) == 1
