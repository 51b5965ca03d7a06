"""Test-time refinement, inverse fields, and their command-line options."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from lambda_helpers import SHAPE, blob, tiny_model, volume_pair, write_nifti
from shared_paths import CASES as CASES_DIR
from shared_paths import DATA
from test_spatial import _recording_grid_sample
from hyperreg.cli import main
from hyperreg.config import ModelConfig
from hyperreg.geometry.fields import load_displacement
from hyperreg.geometry.io import Volume
from hyperreg.method.model import HyperMorph, save_checkpoint
from hyperreg.method.spatial import warp
from hyperreg.registration.lambdas import register_pair
from hyperreg.registration.pipeline import load_pair
from hyperreg.registration.refine import (
    Refinement,
    inverse_displacement,
    refine_flow,
    refine_pair,
)
from hyperreg.registration.results import RefineStats

CASES = CASES_DIR / "files"


@pytest.mark.parametrize("ndim", [2, 3])
def test_refinement_lowers_the_loss_and_keeps_the_fixed_grid(ndim: int) -> None:
    model = tiny_model(ndim)
    pair = volume_pair(ndim)
    before = register_pair(
        model,
        pair["moving"],
        pair["fixed"],
        0.2,
        moving_seg=pair["moving_seg"],
        fixed_seg=pair["fixed_seg"],
    )
    after = refine_pair(
        model,
        pair["moving"],
        pair["fixed"],
        0.2,
        Refinement(steps=30, lr=0.1),
        moving_seg=pair["moving_seg"],
        fixed_seg=pair["fixed_seg"],
    )
    stats = after.refinement
    assert stats is not None
    assert stats.loss_after < stats.loss_before
    assert stats.similarity_after > stats.similarity_before
    assert stats.steps == 30 and stats.seconds > 0
    assert after.disp.shape == before.disp.shape == (ndim, *pair["fixed"].spatial_shape)
    assert after.moved.shape == pair["fixed"].spatial_shape
    assert after.moved_seg is not None and after.moved_seg.shape == pair["fixed"].spatial_shape
    assert after.mean_dice is not None and after.mean_dice >= before.mean_dice - 1e-6
    assert after.folding_fraction < 0.005
    # the network's own weights are untouched
    again = register_pair(model, pair["moving"], pair["fixed"], 0.2)
    np.testing.assert_array_equal(again.disp, before.disp)


def test_refined_flow_is_the_same_at_one_and_two_threads(monkeypatch) -> None:
    # A 64³ pair: the half-resolution velocity (32³) is integrated in samplings split into
    # batch items (its gradient is a sum over them), and the 64³ warp too; the refined flow and
    # the field must not depend on torch's thread count, bitwise.
    batches = _recording_grid_sample(monkeypatch)
    model = tiny_model(3)
    grid = torch.stack(torch.meshgrid(*[torch.arange(64.0)] * 3, indexing="ij"))
    fixed = torch.exp(-((grid - 30.0) ** 2).sum(0) / 200.0)[None, None]
    moving = torch.exp(-((grid - torch.tensor([34.0, 28.0, 31.0]).view(3, 1, 1, 1)) ** 2).sum(0)
                       / 150.0)[None, None]  # fmt: skip
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            batches.clear()
            refined = refine_flow(model, moving, fixed, 0.2, Refinement(steps=3, lr=0.1))
            results.append(refined)
            assert max(batches) > 1  # split samplings were used
    finally:
        torch.set_num_threads(threads)
    one, two = results
    assert torch.equal(one.flow, two.flow)
    assert torch.equal(one.output.disp, two.output.disp)
    # the scalar losses are means, which torch reduces in an order that follows the threads
    for before_after in ((one.loss_before, two.loss_before), (one.loss_after, two.loss_after)):
        assert before_after[0] == pytest.approx(before_after[1], rel=1e-6)
    assert one.loss_after < one.loss_before


def test_zero_steps_is_the_networks_field() -> None:
    model = tiny_model(2)
    pair = volume_pair(2)
    plain = register_pair(model, pair["moving"], pair["fixed"], 0.4)
    refined = refine_pair(model, pair["moving"], pair["fixed"], 0.4, Refinement(steps=0))
    np.testing.assert_allclose(refined.disp, plain.disp, atol=1e-6)
    assert refined.refinement is not None
    assert refined.refinement.loss_before == refined.refinement.loss_after


def test_refined_smoothness_is_the_objectives_term_like_the_networks() -> None:
    """Refinement reports the smoothness of the model's objective (int_downsize factor for a
    half-resolution velocity), the same number register_pair reports for the same field."""
    model = tiny_model(2)
    assert model.config.int_downsize > 1  # a half-resolution velocity: the factor matters
    pair = volume_pair(2)
    plain = register_pair(model, pair["moving"], pair["fixed"], 0.4)
    refined = refine_pair(model, pair["moving"], pair["fixed"], 0.4, Refinement(steps=0))
    assert plain.smoothness is not None and plain.smoothness > 0
    assert refined.smoothness == pytest.approx(plain.smoothness, rel=1e-5)


def test_field_only_results_skip_the_images() -> None:
    """images=False (the pipeline's chained path) returns the same field, no moved images."""
    model = tiny_model(2)
    pair = volume_pair(2)
    full = refine_pair(model, pair["moving"], pair["fixed"], 0.4, Refinement(steps=2))
    field = refine_pair(
        model, pair["moving"], pair["fixed"], 0.4, Refinement(steps=2), images=False
    )
    np.testing.assert_allclose(field.disp, full.disp, atol=1e-6)
    assert field.moved is None and field.moved_seg is None and field.dice is None
    assert full.moved is not None
    assert field.folding_fraction == full.folding_fraction


def test_mutual_information_refinement_raises_mi() -> None:
    model = tiny_model(2)
    pair = volume_pair(2)
    fixed = pair["fixed"]
    inverted = Volume(1.0 - fixed.data, fixed.affine, fixed.disk_shape)  # another "contrast"
    result = refine_pair(model, pair["moving"], inverted, 0.2, Refinement(steps=25, sim="mi"))
    assert result.refinement is not None and result.refinement.similarity == "mi"
    assert result.refinement.similarity_after > result.refinement.similarity_before


def test_results_carry_typed_statistics_not_an_untyped_dict() -> None:
    """Issue 21: refinement, dice_before, ncc and smoothness are typed fields of the results
    (register_pair, refine_pair and the pipeline's PairResult), filled when computed."""
    model = tiny_model(2)
    pair = volume_pair(2)
    segs = {"moving_seg": pair["moving_seg"], "fixed_seg": pair["fixed_seg"]}
    refined = refine_pair(
        model, pair["moving"], pair["fixed"], 0.2, Refinement(steps=6, levels=2), **segs
    )
    assert not hasattr(refined, "extra")
    stats = refined.refinement
    assert isinstance(stats, RefineStats)
    assert stats.steps == 6 and stats.similarity == "ncc" and stats.seconds > 0
    assert stats.steps_taken[0] > 0 and 0 < stats.steps_taken[1] <= 6  # both levels ran
    assert isinstance(stats.fell_back, bool) and not stats.fell_back
    assert stats.loss_after < stats.loss_before
    assert refined.ncc is not None and 0 < refined.ncc <= 1  # local NCC of the result
    assert refined.smoothness is not None and refined.smoothness > 0
    plain = register_pair(model, pair["moving"], pair["fixed"], 0.2, **segs)
    assert plain.refinement is None and plain.ncc is None
    assert plain.smoothness is not None and plain.smoothness > 0
    assert plain.dice_before is not None and 0 <= plain.dice_before < 1
    assert refined.dice_before == pytest.approx(plain.dice_before)  # the unregistered pair
    unlabelled = register_pair(model, pair["moving"], pair["fixed"], 0.2)
    assert unlabelled.dice_before is None
    prepared = load_pair(pair["moving"], pair["fixed"], init="none", **segs)
    (through,) = prepared.register(model, [0.2], Refinement(steps=6, levels=2))
    assert through.refinement is not None and through.refinement.steps == 6
    assert through.refinement.loss_after == stats.loss_after
    assert through.dice_before == pytest.approx(plain.dice_before)
    (network,) = prepared.register(model, [0.2], Refinement(steps=0), inverse=True)
    assert network.refinement is None  # 0 steps: the network's field, not refined


@pytest.mark.parametrize(
    ("refinement", "match"),
    [
        (Refinement(steps=-1), r"'steps' must be an integer in \[0, 10000\], got -1"),
        (Refinement(steps=10001), r"'steps' must be an integer in \[0, 10000\]"),
        (Refinement(steps=True), r"'steps' must be an integer"),  # type: ignore[arg-type]
        (Refinement(sim="cc"), r"'sim' must be one of \('ncc', 'mse', 'mi', 'mind'\)"),
        (Refinement(lr=0.0), r"'lr' must lie in \(0, 100\)"),
    ],
)
def test_bad_refinement_is_rejected(refinement: Refinement, match: str) -> None:
    pair = volume_pair(2)
    with pytest.raises(ValueError, match=match):
        refine_pair(tiny_model(2), pair["moving"], pair["fixed"], 0.3, refinement)


def test_refine_flow_rejects_non_finite_images() -> None:
    model = tiny_model(2)
    moving = torch.rand(1, 1, *SHAPE)
    moving[0, 0, 3, 4] = float("nan")
    with pytest.raises(ValueError, match=r"'moving' has 1 non-finite voxels"):
        refine_flow(model, moving, torch.rand(1, 1, *SHAPE), 0.5, Refinement(steps=2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_refinement_runs_on_the_models_cuda_device() -> None:
    model = tiny_model(2).cuda()
    moving = torch.rand(1, 1, *SHAPE, device="cuda")
    fixed = torch.roll(moving, 1, 2)
    refined = refine_flow(model, moving, fixed, 0.2, Refinement(steps=10))
    assert refined.flow.device.type == "cuda" and refined.output.disp.device.type == "cuda"
    assert refined.loss_after < refined.loss_before


# --- inverse ---------------------------------------------------------------------------------


def _smooth_flow(model: HyperMorph, shape: tuple[int, ...], amplitude: float) -> torch.Tensor:
    """A smooth velocity on the model's padded half-resolution grid (sinusoids)."""
    x = torch.zeros(1, 1, *shape)
    size = model.predict_flow(x, x, 0.5).shape[2:]
    axes = torch.meshgrid(*[torch.linspace(0, np.pi, s) for s in size], indexing="ij")
    channels = [amplitude * torch.sin(axes[0] + n) * torch.cos(axes[-1] - n) for n in range(2)]
    if len(shape) == 3:
        channels.append(amplitude * torch.sin(axes[1]))
    return torch.stack(channels)[None]


@pytest.mark.parametrize("ndim", [2, 3])
def test_inverse_composed_with_forward_is_near_identity(ndim: int) -> None:
    model = tiny_model(ndim)
    shape = (40, 36) if ndim == 2 else (20, 18, 22)
    image = torch.from_numpy(blob(shape, tuple(s / 2 for s in shape), sigma=5.0))[None, None]
    flow = _smooth_flow(model, shape, amplitude=1.5)
    forward = model.flow_to_output(flow, image).disp
    inverse = inverse_displacement(model, flow, image)
    assert float(forward.abs().max()) > 1.0  # a non-trivial field (voxels)
    # inverse(x) + forward(x + inverse(x)) = 0 and forward(x) + inverse(x + forward(x)) = 0
    both_ways = [inverse + warp(forward, inverse), forward + warp(inverse, forward)]
    for residual in both_ways:
        assert float(residual.norm(dim=1).median()) < 0.1
    # warping forward, then with the inverse, gives the image back (interior, interpolation)
    moved = warp(image, forward)
    back = warp(moved, inverse)
    inner = (slice(None), slice(None), *[slice(4, -4)] * ndim)
    assert float((back - image)[inner].abs().max()) < 0.05
    assert float((moved - image)[inner].abs().max()) > 0.1  # it did move


def test_inverse_needs_a_velocity_field() -> None:
    model = HyperMorph(
        ModelConfig(
            ndim=2, enc_channels=(4,) * 4, dec_channels=(4,) * 7, hyper_hidden=(8,), int_steps=0
        )
    )
    with pytest.raises(ValueError, match="model without a velocity field"):
        inverse_displacement(model, torch.zeros(1, 2, 32, 32), torch.zeros(1, 1, 24, 20))


# --- command line ----------------------------------------------------------------------------


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    moving = blob(SHAPE, (11, 9))
    fixed = blob(SHAPE, (13, 10))
    paths = {
        # an axial grid, so that the ITK format can hold the 2D field on every hyperreg version
        "moving": write_nifti(tmp_path / "moving.nii.gz", moving[..., None], np.eye(4)),
        "fixed": write_nifti(tmp_path / "fixed.nii.gz", fixed[..., None], np.eye(4)),
        "model": save_checkpoint(tiny_model(2), tmp_path / "model.pt"),
        "out": tmp_path / "out",
    }
    plain = HyperMorph(
        ModelConfig(
            ndim=2, enc_channels=(4,) * 4, dec_channels=(4,) * 7, hyper_hidden=(8,), int_steps=0
        )
    )
    paths["disp_model"] = save_checkpoint(plain, tmp_path / "disp_model.pt")
    return paths


def _args(files: dict[str, Path], *extra: str, model: str = "model") -> list[str]:
    out = files["out"]
    return [
        "register",
        "--model",
        str(files[model]),
        "--moving",
        str(files["moving"]),
        "--fixed",
        str(files["fixed"]),
        "--lambda",
        "0.3",
        "--moved",
        str(out / "moved.nii.gz"),
        "--warp",
        str(out / "warp.nii.gz"),
        "--init",
        "none",  # --inverse-warp inverts a field without an affine stage
        "--device",
        "cpu",
        *extra,
    ]


@pytest.mark.parametrize("fmt", ["voxel", "itk"])
def test_register_refine_and_inverse_warp(
    files: dict[str, Path], fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    inverse = files["out"] / "inverse.nii.gz"
    args = _args(files, "--refine", "5", "--inverse-warp", str(inverse), "--warp-format", fmt)
    assert main([*args, "-v"]) == 0
    text = capsys.readouterr().out
    assert "refined 5 steps in" in text and "NCC" in text and "->" in text
    forward = load_displacement(files["out"] / "warp.nii.gz").disp
    backward = load_displacement(inverse).disp
    assert backward.shape == forward.shape
    f = torch.from_numpy(forward)[None].double()
    b = torch.from_numpy(backward)[None].double()
    assert float((b + warp(f, b)).norm(dim=1).median()) < 0.1


@pytest.mark.parametrize("steps", ["-1", "20000", "ten", "2.5"])
def test_register_rejects_bad_refine_counts(
    files: dict[str, Path], steps: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_args(files, "--refine", steps)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--refine" in err and "10000" in err
    assert not files["out"].exists()


def test_inverse_warp_of_a_displacement_model_is_one_line(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inverse = files["out"] / "inverse.nii.gz"
    assert main(_args(files, "--inverse-warp", str(inverse), model="disp_model")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model without a velocity field" in err
    assert "--inverse-warp" in err
    assert not files["out"].exists()


@pytest.mark.skipif(not CASES.is_dir(), reason=f"shared cases not found at {CASES}")
def test_refine_on_a_nan_image_is_the_c06_error(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES / "c06_moving_with_nan.nii.gz"
    fixed = DATA / "neurite-oasis/OASIS_OAS1_0001_MR1/slice_norm.nii.gz"
    files = {**files, "moving": case, "fixed": fixed}
    assert main(_args(files, "--refine", "10")) == 2
    err = capsys.readouterr().err.strip()
    count = int((~np.isfinite(np.asanyarray(nib.load(case).dataobj))).sum())
    assert len(err.splitlines()) == 1 and f"{count} non-finite" in err
    assert not files["out"].exists()


def test_sweep_and_batch_take_refine(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    args = [
        "sweep",
        "--model",
        str(files["model"]),
        "--moving",
        str(files["moving"]),
        "--fixed",
        str(files["fixed"]),
        "--lambdas",
        "0.2,0.6",
        "--out",
        str(out),
        "--refine",
        "3",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    assert capsys.readouterr().out.count("refined 3 steps") == 2
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(
        f"moving,fixed\n{files['moving']},{files['fixed']}\n"
        f"{tmp_path / 'missing.nii.gz'},{files['fixed']}\n"
    )
    batch = tmp_path / "batch"
    args = [
        "batch",
        "--model",
        str(files["model"]),
        "--pairs",
        str(pairs),
        "--out",
        str(batch),
        "--lambda",
        "0.3",
        "--refine",
        "3",
        "--refine-sim",
        "mi",
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(args) == 1  # the missing file fails its row, the other is done
    summary = (batch / "summary.csv").read_text().splitlines()
    header = summary[0].split(",")
    assert len(summary) == 2 and "refine_seconds" in header and "refine_similarity_after" in header
    row = dict(zip(header, summary[1].split(",")))
    assert float(row["refine_similarity_after"]) > float(row["refine_similarity_before"])
