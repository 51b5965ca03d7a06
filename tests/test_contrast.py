"""Other contrasts (T2/FLAIR to T1): detection, the remapped moving image refined with the
model's own similarity, normalised gradient fields in the verdict, ``--contrast`` and an
explicit ``--refine-sim``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lambda_helpers import write_nifti
from hyperreg._errors import InputError
from hyperreg.registration.contrast import (
    ContrastCheck,
    compare_contrasts,
    pair_similarity,
    similarity_for,
)
from hyperreg.registration.refine import Refinement

T1 = (0.0, 0.25, 0.5, 0.85)  # background, CSF, grey matter, white matter
T2 = (0.0, 1.0, 0.6, 0.35)  # CSF bright, grey above white: the T1 order inverted in the brain


def phantom(values: tuple[float, ...], shift: float = 0.0, seed: int = 0) -> np.ndarray:
    """A 64 x 64 head: nested ellipses of CSF, grey and white matter with ``values``, moved
    ``shift`` voxels along the first axis, 2 % noise inside."""
    i, j = np.meshgrid(np.arange(64.0), np.arange(64.0), indexing="ij")
    r = np.sqrt(((i - 32 - shift) / 26) ** 2 + ((j - 32) / 22) ** 2)
    classes = np.select([r < 0.45, r < 0.75, r < 1.0], [3, 2, 1], 0)
    image = np.asarray(values)[classes]
    noise = np.random.default_rng(seed).normal(0, 0.02, image.shape)
    return (image + noise * (classes > 0)).astype(np.float32)


def test_inverted_tissue_order_is_another_contrast() -> None:
    found = compare_contrasts(phantom(T2, seed=1), phantom(T1))
    assert found.differ and found.rise < 0
    assert "does not rise" in found.reason
    assert compare_contrasts(phantom(T1), phantom(T2, 1.5, seed=1)).differ  # T1 -> T2 too


def test_t1_pairs_and_monotone_changes_are_the_same_contrast() -> None:
    fixed = phantom(T1)
    for moving in (phantom(T1, 2.0, seed=1), phantom(T1, seed=1) ** 2.0, 300 * phantom(T1) ** 0.5):
        found = compare_contrasts(moving, fixed)
        assert not found.differ and found.rise > 0.8, found


def test_too_little_overlap_is_not_judged() -> None:
    empty = np.zeros((64, 64), np.float32)
    found = compare_contrasts(phantom(T2), empty)
    assert not found.differ and found.voxels == 0 and np.isnan(found.rise)
    with pytest.raises(InputError, match="shape"):
        compare_contrasts(np.zeros((4, 4)), np.zeros((4, 5)))


def test_similarity_choice() -> None:
    differ = ContrastCheck(True, -0.9, -0.5, 1000, "a test")
    same = ContrastCheck(False, 0.99, 0.8, 1000, "a test")
    assert similarity_for("auto", differ) == "ngf"  # the verdict's
    assert similarity_for("auto", same) is None  # the model's own
    assert similarity_for("same", differ) is None
    assert similarity_for("different", None) == "ngf"
    with pytest.raises(InputError, match="contrast"):
        similarity_for("t2", None)
    assert pair_similarity("same", phantom(T2), phantom(T1)) == (None, None)
    assert pair_similarity("auto", phantom(T2), phantom(T1))[0] == "ngf"


@pytest.fixture()
def t2_pair(tmp_path: Path) -> dict[str, Path]:
    """A T2-like moving phantom and a T1-like fixed one, 1.5 voxels apart, as 2D NIfTI."""
    return {
        "moving": write_nifti(tmp_path / "t2.nii.gz", phantom(T2, 1.5, seed=1)),
        "fixed": write_nifti(tmp_path / "t1.nii.gz", phantom(T1)),
        "out": tmp_path,
    }


def test_register_remaps_and_judges_by_ngf(t2_pair: dict[str, Path], caplog) -> None:
    from hyperreg.apps.models import resolve_model
    from hyperreg.apps.register import register_files
    from hyperreg.method.losses import ngf_loss
    from hyperreg.registration.similarity import network_input

    model = resolve_model("hypermorph-2d").model
    args = (model, t2_pair["moving"], t2_pair["fixed"], 0.3)
    with caplog.at_level("INFO", logger="hyperreg"):
        auto = register_files(*args, init="none", refine=Refinement(steps=2))
    # refined with the model's own NCC, on the remapped image: it starts far more similar to
    # the fixed image than the T2 as read does
    assert auto.refinement is not None and auto.refinement.similarity == "ncc"
    notes = [r.getMessage() for r in caplog.records if "other contrasts (" in r.getMessage()]
    assert len(notes) == 1 and "intensities" in notes[0] and "gradient" in notes[0]
    same = register_files(*args, init="none", refine=Refinement(steps=2), contrast="same")
    assert same.refinement is not None and same.refinement.similarity == "ncc"
    assert auto.refinement.similarity_before > same.refinement.similarity_before + 0.1
    # the outputs come from the T2 as read (its bright CSF ring), not the remapped image
    ring = (phantom(T1) > 0.15) & (phantom(T1) < 0.35)
    assert auto.moved[ring].mean() > 0.7
    # the verdict scores the pair as it came (the T2 as read, not the remapped image the
    # network saw) by normalised gradient fields: the same number ngf_loss gives
    plain = register_files(*args, init="none", refine=Refinement(steps=0))
    fixed = network_input(model, _volume(t2_pair["fixed"]), _volume(t2_pair["fixed"]), "robust")
    moving = network_input(model, _volume(t2_pair["moving"]), _volume(t2_pair["fixed"]), "robust")
    expected = -float(ngf_loss(moving, fixed))
    assert plain.verdict is not None
    assert plain.verdict.similarity_before == pytest.approx(expected, rel=1e-5)
    ncc = register_files(*args, init="none", refine=Refinement(steps=0), contrast="same")
    assert ncc.verdict is not None and ncc.verdict.similarity_before != pytest.approx(expected)


def _volume(path: Path):
    from hyperreg.registration.inputs import load_input

    return load_input(path)


def test_cli_contrast_and_explicit_refine_sim(t2_pair: dict[str, Path], capsys) -> None:
    from hyperreg.cli import main

    base = ["register", "--moving", str(t2_pair["moving"]), "--fixed", str(t2_pair["fixed"])]
    base += ["--moved", str(t2_pair["out"] / "moved.nii.gz"), "--init", "none"]
    base += ["--device", "cpu", "--refine", "2", "-v"]
    assert main(base) == 0
    said = capsys.readouterr()
    assert sum("other contrasts (" in t for t in (said.out + said.err).splitlines()) == 1
    assert "raised to 0.2 for other contrasts" in said.out + said.err  # the model's 0.05
    for extra in (["--contrast", "same"], ["--refine-sim", "ncc"]):
        assert main([*base, *extra]) == 0
        said = capsys.readouterr()
        assert "other contrasts" not in said.out + said.err
    assert main([*base, "--contrast", "t2"]) != 0
    assert "--contrast" in capsys.readouterr().err
    # without -v: the one λ line says the default was raised; asked-for contrasts are said too
    assert main([*base[:-1], "--contrast", "different"]) == 0
    said = capsys.readouterr()
    assert "other contrasts (as asked)" in said.err
    line = next(t for t in said.out.splitlines() if t.startswith("λ = 0.2 ("))
    assert "raised to 0.2" in line


def test_sweep_notes_other_contrasts_once(t2_pair: dict[str, Path], capsys) -> None:
    from hyperreg.cli import main

    base = ["sweep", "--moving", str(t2_pair["moving"]), "--fixed", str(t2_pair["fixed"])]
    base += ["--lambdas", "0.3", "--init", "none", "--device", "cpu"]
    assert main([*base, "--out", str(t2_pair["out"] / "auto")]) == 0
    said = capsys.readouterr()
    assert sum("other contrasts" in t for t in (said.out + said.err).splitlines()) == 1
    assert main([*base, "--out", str(t2_pair["out"] / "same"), "--contrast", "same"]) == 0
    said = capsys.readouterr()
    assert "other contrasts" not in said.out + said.err


def test_other_contrasts_run_the_affine_stage_again_on_the_drawn_image(tmp_path: Path) -> None:
    from hyperreg.registration.pipeline import load_pair

    t2 = write_nifti(tmp_path / "t2.nii.gz", phantom(T2, 3.0, seed=1))
    t1 = write_nifti(tmp_path / "t1.nii.gz", phantom(T1))
    t1b = write_nifti(tmp_path / "t1b.nii.gz", phantom(T1, 3.0, seed=2))
    note = "affine stage ran again on the moving image drawn"
    once = load_pair(t2, t1, contrast="same")  # the default of load_pair
    again = load_pair(t2, t1, contrast="auto")
    assert not any(note in n for n in once.notes)
    assert sum(note in n for n in again.notes) == 1
    assert again.affine is not None and once.affine is not None
    assert again.affine.seconds > once.affine.seconds * 0.5  # both runs counted
    # the same contrast: one run, whatever is asked
    assert not any(note in n for n in load_pair(t1b, t1, contrast="auto").notes)
    # the drawn image's run recovers the 3-voxel shift along the first axis (1 mm voxels):
    # measured 2.81 mm, against 4.10 mm from Mattes MI on the T2 as read
    shift = abs(again.transform.matrix[0, 3])
    assert abs(shift - 3.0) < 0.5, again.transform.matrix
