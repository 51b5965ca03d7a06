"""Network passes (registration/passes.py): the network applied to its own output, the fields
composed; through the pipeline and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from lambda_helpers import SHAPE, blob, save_tiny_model, tiny_model, volume_pair, write_nifti

from hyperreg.cli import main
from hyperreg.method.spatial import compose_displacements, warp
from hyperreg.registration.lambdas import sweep_lambdas
from hyperreg.registration.pairs import network_inputs
from hyperreg.registration.passes import MAX_PASSES, register_passes
from hyperreg.registration.pipeline import InputError, load_pair
from hyperreg.registration.refine import Refinement


def _smooth_field(shape: tuple[int, ...], amplitude: float, seed: int) -> torch.Tensor:
    """A smooth random displacement ``(1, 2, *shape)`` of about ``amplitude`` voxels."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(1, 2, 3, 3, generator=generator) * amplitude
    return torch.nn.functional.interpolate(coarse, size=shape, mode="bicubic", align_corners=True)


def test_the_composed_field_warps_as_the_two_fields_in_turn() -> None:
    shape = (40, 36)
    image = torch.from_numpy(blob(shape, (18, 17), sigma=6.0).astype(np.float32))[None, None]
    first, second = _smooth_field(shape, 1.5, 0), _smooth_field(shape, 1.5, 1)
    in_turn = warp(warp(image, first), second)
    composed = warp(image, compose_displacements(first, second))
    inside = (slice(None), slice(None), slice(6, -6), slice(6, -6))
    difference = (in_turn - composed)[inside].abs().max()
    assert difference < 0.01 * float(image.max())
    # the fields do not commute: the order matters
    swapped = warp(image, compose_displacements(second, first))
    assert (in_turn - swapped)[inside].abs().max() > 4 * difference


def test_constant_shifts_add() -> None:
    first = torch.zeros(1, 2, 10, 12)
    first[:, 0] = 1.25
    second = torch.zeros(1, 2, 10, 12)
    second[:, 1] = -0.5
    total = compose_displacements(first, second)
    np.testing.assert_allclose(total[:, 0].numpy(), 1.25, atol=1e-6)
    np.testing.assert_allclose(total[:, 1].numpy(), -0.5, atol=1e-6)


def test_one_pass_is_the_networks_field() -> None:
    model, pair = tiny_model(2), volume_pair()
    once = register_passes(model, pair["moving"], pair["fixed"], 0.3, 1)
    plain = sweep_lambdas(model, pair["moving"], pair["fixed"], [0.3])[0]
    np.testing.assert_allclose(once.disp, plain.disp, atol=1e-6)
    np.testing.assert_allclose(once.moved, plain.moved, atol=1e-5)


def test_two_passes_register_the_first_pass_moved_image_again() -> None:
    """Pass 2 sees the normalised moving image warped by pass 1 (not normalised again), and the
    result is pass 1 then pass 2, checked against the network called by hand."""
    model, pair = tiny_model(2), volume_pair()
    twice = register_passes(
        model, pair["moving"], pair["fixed"], 0.3, 2,
        moving_seg=pair["moving_seg"], fixed_seg=pair["fixed_seg"],
    )  # fmt: skip
    moving_t, fixed_t, _ = network_inputs(
        model, pair["moving"], pair["fixed"], "minmax", torch.device("cpu")
    )
    with torch.no_grad():
        first = model(moving_t, fixed_t, 0.3)
        second = model(warp(moving_t, first.disp), fixed_t, 0.3)
    expected = second.disp + warp(first.disp, second.disp)
    np.testing.assert_allclose(twice.disp, expected[0].numpy(), atol=1e-5)
    assert np.abs(second.disp.numpy()).max() > 0.05  # the second pass did move something
    # outputs are warped once from the inputs, with Dice over the inputs' labels
    raw = torch.from_numpy(pair["moving"].data.astype(np.float32))[None, None]
    np.testing.assert_allclose(twice.moved, warp(raw, expected, padding="itk")[0, 0], atol=1e-5)
    assert twice.dice is not None and set(twice.dice) == {3, 4}


def test_refinement_refines_the_last_pass() -> None:
    model, pair = tiny_model(2), volume_pair()
    plain = register_passes(model, pair["moving"], pair["fixed"], 0.3, 2)
    refined = register_passes(
        model, pair["moving"], pair["fixed"], 0.3, 2, Refinement(steps=10, lr=0.1)
    )
    stats = refined.refinement
    assert stats is not None and stats.steps > 0 and stats.loss_after < stats.loss_before
    assert plain.refinement is None
    assert np.abs(refined.disp - plain.disp).max() > 1e-3


@pytest.mark.parametrize("passes", [0, MAX_PASSES + 1, True, 1.5])
def test_a_bad_pass_count_is_rejected(passes: object) -> None:
    model, pair = tiny_model(2), volume_pair()
    with pytest.raises(ValueError, match="'passes' must be an integer from 1 to"):
        register_passes(model, pair["moving"], pair["fixed"], 0.3, passes)  # type: ignore[arg-type]


def test_the_pipeline_runs_passes_per_lambda_and_refuses_an_inverse() -> None:
    model, pair = tiny_model(2), volume_pair()
    prepared = load_pair(
        pair["moving"], pair["fixed"], moving_seg=pair["moving_seg"],
        fixed_seg=pair["fixed_seg"], init="none",
    )  # fmt: skip
    # an untrained model's field: compared as given (the never-worse rule off)
    results = prepared.register(model, [0.2, 0.6], passes=2, never_worse=False)
    for result in results:
        alone = register_passes(model, pair["moving"], pair["fixed"], result.lam, 2)
        np.testing.assert_allclose(result.disp, alone.disp, atol=1e-6)
        assert result.dice is not None
    with pytest.raises(InputError, match="single network pass"):
        prepared.register(model, [0.2], passes=2, inverse=True)


def test_register_command_takes_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = save_tiny_model(tmp_path / "model.pt")
    moving = write_nifti(tmp_path / "m.nii.gz", blob(SHAPE, (10, 8))[..., None])
    fixed = write_nifti(tmp_path / "f.nii.gz", blob(SHAPE, (13, 11))[..., None])
    common = ["register", "--model", str(model), "--moving", str(moving), "--fixed", str(fixed),
              "--init", "none", "--device", "cpu", "--lambda", "0.3", "--keep-worse"]  # fmt: skip
    for passes in ("1", "2"):
        out = tmp_path / f"warp{passes}.nii.gz"
        assert main([*common, "--passes", passes, "--warp", str(out)]) == 0
    assert "2 network passes" in capsys.readouterr().out
    one = np.asarray(nib.load(tmp_path / "warp1.nii.gz").dataobj)
    two = np.asarray(nib.load(tmp_path / "warp2.nii.gz").dataobj)
    assert np.abs(one - two).max() > 1e-3
    assert main([*common, "--passes", "0", "--warp", str(tmp_path / "bad.nii.gz")]) == 2
    assert "--passes" in capsys.readouterr().err
    assert not (tmp_path / "bad.nii.gz").exists()


def test_sweep_and_batch_take_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    model = save_tiny_model(tmp_path / "model.pt")
    moving = write_nifti(tmp_path / "m.nii.gz", blob(SHAPE, (10, 8))[..., None])
    fixed = write_nifti(tmp_path / "f.nii.gz", blob(SHAPE, (13, 11))[..., None])
    common = ["--model", str(model), "--device", "cpu", "--init", "none", "--keep-worse"]
    pair = ["--moving", str(moving), "--fixed", str(fixed)]
    for passes in ("1", "2"):
        out = tmp_path / f"sweep{passes}"
        args = ["sweep", *common, *pair, "--lambdas", "0.2,0.6", "--passes", passes]
        assert main([*args, "--save-fields", "--out", str(out)]) == 0
    one = np.asarray(nib.load(tmp_path / "sweep1" / "warp_lam0.2.nii.gz").dataobj)
    two = np.asarray(nib.load(tmp_path / "sweep2" / "warp_lam0.2.nii.gz").dataobj)
    assert np.abs(one - two).max() > 1e-3
    csv = tmp_path / "pairs.csv"
    csv.write_text(f"moving,fixed\n{moving},{fixed}\n")
    batch = ["batch", *common, "--pairs", str(csv), "--out", str(tmp_path / "batch"),
             "--lambda", "0.3", "--no-progress"]  # fmt: skip
    assert main(batch) == 0
    (record,) = (tmp_path / "batch" / "pairs").glob("*/record.json")  # one pair
    first = json.loads(record.read_text())
    assert "passes" not in first  # one pass: records of earlier versions still match
    caplog.set_level("INFO")
    assert main([*batch, "--passes", "2"]) == 2  # another setting: refused, nothing written
    assert json.loads(record.read_text()) == first
    assert main([*batch, "--passes", "2", "--overwrite"]) == 0  # registered again
    assert "passes 1 -> 2" in caplog.text
    again = json.loads(record.read_text())
    assert again["passes"] == 2
    capsys.readouterr()


def _losses(folder: Path) -> list[float]:
    rows = (folder / "train_log.csv").read_text().splitlines()[1:]
    return [float(row.split(",")[1]) for row in rows]


def test_cascade_steps_train_the_network_on_its_own_moved_image(tmp_path: Path) -> None:
    """With cascade_every 2, step 1 is an ordinary step and step 2 a second-pass step: the same
    batch and λ (same seed) give another loss there, and training goes on from it."""
    from test_train import SMALL, BlobPairs

    from hyperreg.config import TrainConfig
    from hyperreg.training.train import train

    def run(name: str, every: int) -> list[float]:
        config = TrainConfig(
            out=str(tmp_path / name), steps=4, batch_size=2, seed=3, device="cpu",
            model=SMALL, checkpoint_every=4, cascade_every=every, prefetch=False,
        )  # fmt: skip
        train(config, BlobPairs(), progress=False)
        return _losses(tmp_path / name)

    plain, cascade = run("plain", 0), run("cascade", 2)
    assert len(plain) == len(cascade) == 4 and all(np.isfinite(cascade))
    assert cascade[0] == pytest.approx(plain[0], abs=1e-7)
    assert cascade[1] != pytest.approx(plain[1], abs=1e-6)


def test_a_model_that_records_two_passes_runs_them_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ModelConfig.passes is the default of the pipeline and of every command; --passes
    overrides it; an inverse field runs one pass; the checkpoint keeps it."""
    import dataclasses

    from hyperreg.method.model import load_checkpoint, save_checkpoint

    model = tiny_model(2)
    model.config = dataclasses.replace(model.config, passes=2)
    path = save_checkpoint(model, tmp_path / "two.pt")
    assert load_checkpoint(path)[0].config.passes == 2
    pair = volume_pair()
    prepared = load_pair(pair["moving"], pair["fixed"], init="none")
    raw = dict(never_worse=False)  # an untrained model's fields, compared as given
    default = prepared.register(model, [0.3], **raw)[0]
    two = register_passes(model, pair["moving"], pair["fixed"], 0.3, 2)
    np.testing.assert_allclose(default.disp, two.disp, atol=1e-6)
    one = prepared.register(model, [0.3], passes=1, **raw)[0]
    assert np.abs(one.disp - default.disp).max() > 1e-3
    inverse = prepared.register(model, [0.3], inverse=True, **raw)[0]  # one pass, no error
    np.testing.assert_allclose(inverse.disp, one.disp, atol=1e-6)
    moving = write_nifti(tmp_path / "m.nii.gz", blob(SHAPE, (10, 8))[..., None])
    fixed = write_nifti(tmp_path / "f.nii.gz", blob(SHAPE, (13, 11))[..., None])
    common = ["register", "--model", str(path), "--moving", str(moving), "--fixed", str(fixed),
              "--init", "none", "--device", "cpu", "--lambda", "0.3"]  # fmt: skip
    assert main([*common, "-v", "--warp", str(tmp_path / "w.nii.gz")]) == 0
    said = capsys.readouterr().out
    assert "2 network passes" in said and "the model's default; --passes 1" in said
    assert main([*common, "--passes", "1", "--warp", str(tmp_path / "w1.nii.gz")]) == 0
    assert "network passes" not in capsys.readouterr().out
    inverse = ["--warp", str(tmp_path / "w2.nii.gz"), "--inverse-warp", str(tmp_path / "i.nii.gz")]
    assert main([*common, *inverse]) == 0  # one pass: said in one line, not silently
    notes = [t for t in capsys.readouterr().out.splitlines() if "--inverse-warp" in t]
    assert len(notes) == 1 and "runs one pass (the model's default is 2)" in notes[0]
    assert main([*common, *inverse, "--passes", "1"]) == 0
    assert "--inverse-warp" not in capsys.readouterr().out


def test_export_records_the_passes_a_card_measured(tmp_path: Path) -> None:
    from hyperreg.method.model import load_checkpoint
    from hyperreg.pretrained import export_model

    source = save_tiny_model(tmp_path / "model.pt")
    assert load_checkpoint(source)[0].config.passes == 1
    out = export_model(source, tmp_path / "exported.pt", passes=2)
    assert load_checkpoint(out)[0].config.passes == 2
    again = export_model(out, tmp_path / "again.pt")  # None keeps it
    assert load_checkpoint(again)[0].config.passes == 2
