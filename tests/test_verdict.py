"""Trust on every pair: the verdict (``ok`` / ``check: <reason>``) and the never-worse rule.

The rule and the verdict are a pure function of the similarities and statistics
(:func:`hyperreg.registration.verdict.judge`), tested on numbers first; then on real slices with
the bundled 2D model through the path every command runs (``load_pair`` then
``PreparedPair.register``): a slice registered to itself and to a copy stored flipped, a wrong
initial affine, and the verdict in ``batch``'s summary.csv.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from shared_paths import data_path, needs_data

from hyperreg.registration.verdict import (
    MAX_FOLDING,
    SIMILARITY_MARGIN,
    AffineShape,
    decompose_affine,
    judge,
)


def _rotation(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def test_decompose_affine_recovers_scales_and_shears_under_a_rotation() -> None:
    scales = np.diag([1.2, 0.8, 1.1])
    shear = np.array([[1.0, 0.1, -0.05], [0.0, 1.0, 0.2], [0.0, 0.0, 1.0]])
    matrix = np.eye(4)
    matrix[:3, :3] = _rotation(0.4) @ scales @ shear
    matrix[:3, 3] = [5.0, -3.0, 2.0]  # translation does not enter
    shape = decompose_affine(matrix)
    assert shape.scales == pytest.approx((1.2, 0.8, 1.1))
    assert shape.shears == pytest.approx((0.1, -0.05, 0.2))
    assert not shape.mirrored
    flipped = matrix.copy()
    flipped[:3, 0] *= -1
    assert decompose_affine(flipped).mirrored


def test_decompose_affine_rejects_a_bad_matrix() -> None:
    with pytest.raises(ValueError, match="decompose_affine"):
        decompose_affine(np.eye(2))


def test_judge_keeps_an_improving_registration_and_says_ok() -> None:
    verdict = judge(0.1, 0.2, 0.45, folding_fraction=0.0, affine=AffineShape((1, 1, 1), (0, 0, 0)))
    assert verdict.ok and verdict.text == "ok" and verdict.kept == "registered"


def test_judge_falls_back_to_the_better_of_affine_and_headers() -> None:
    worse = judge(0.30, 0.50, 0.40)
    assert worse.kept == "affine" and worse.text.startswith("check: registration lowered")
    assert "kept the affine alone" in worse.text
    headers = judge(0.60, 0.50, 0.40)
    assert headers.kept == "headers" and "as it came" in headers.text
    no_affine = judge(0.60, None, 0.50)
    assert no_affine.kept == "headers" and math.isnan(no_affine.similarity_affine)
    kept = judge(0.60, None, 0.50, never_worse=False)
    assert kept.kept == "registered" and "kept it" in kept.text


def test_judge_margin_separates_noise_from_a_worse_registration() -> None:
    best = 0.5
    within = judge(best, None, best * (1 - 0.5 * SIMILARITY_MARGIN))
    beyond = judge(best, None, best * (1 - 2 * SIMILARITY_MARGIN))
    assert within.ok and within.kept == "registered"
    assert beyond.kept == "headers"
    mse = judge(-0.0, None, -0.01)  # an MSE of identical images (0): the absolute margin
    assert mse.kept == "headers"
    with pytest.raises(ValueError, match="margin"):
        judge(0.1, None, 0.2, margin=-1.0)


def test_judge_flags_folding_and_an_implausible_affine() -> None:
    folded = judge(0.1, 0.2, 0.4, folding_fraction=2 * MAX_FOLDING)
    assert folded.kept == "registered" and "folding" in folded.text
    scaled = judge(0.1, 0.2, 0.4, affine=AffineShape((2.0, 1.0, 2.0), (0.0, 0.0, 0.0)))
    assert "implausible affine: scales 2.00 1.00 2.00" in scaled.text
    sheared = judge(0.1, 0.2, 0.4, affine=AffineShape((1.0, 1.0, 1.0), (0.5, 0.0, 0.0)))
    assert "shears" in sheared.text
    mirrored = judge(0.1, 0.2, 0.4, affine=AffineShape((1.0, 1.0, 1.0), (0, 0, 0), True))
    assert "mirrors" in mirrored.text


# real slices, bundled 2D model ------------------------------------------------------------


def _slice(person: str = "OASIS_OAS1_0001_MR1"):
    from hyperreg.geometry.io import load_volume

    root = data_path("neurite-oasis", person)
    image = load_volume(root / "slice_norm.nii.gz")
    seg = load_volume(root / "slice_seg24.nii.gz", label=True)
    return image, seg


def _flipped(volume):
    """``volume`` with array axis 0 reversed and its affine adjusted: the same world image."""
    from hyperreg.geometry.io import Volume

    flip = np.eye(4)
    flip[0, 0], flip[0, 3] = -1.0, volume.data.shape[0] - 1
    data = np.ascontiguousarray(volume.data[::-1])
    return Volume(data=data, affine=volume.affine @ flip, disk_shape=volume.disk_shape)


@pytest.fixture(scope="module")
def model_2d():
    import hyperreg

    return hyperreg.load_pretrained(ndim=2)


def _register(model, moving, fixed, moving_seg, fixed_seg, refine):
    from hyperreg.apps.models import model_default_lambda, pair_refinement
    from hyperreg.registration.pipeline import load_pair

    pair = load_pair(moving, fixed, model=model, moving_seg=moving_seg, fixed_seg=fixed_seg)
    lam = model_default_lambda(model).lam
    return pair.register(model, [lam], pair_refinement(model, refine))[0]


@needs_data("neurite-oasis")
@pytest.mark.parametrize("case", ["identical", "flipped copy"])
@pytest.mark.parametrize("refine", ["refine 0", "default"])
def test_a_slice_registered_to_itself_stays_in_place(model_2d, case: str, refine: str) -> None:
    from hyperreg.registration.refine import Refinement

    image, seg = _slice()
    moving, moving_seg = (image, seg) if case == "identical" else (_flipped(image), _flipped(seg))
    steps = Refinement(steps=0) if refine == "refine 0" else None
    result = _register(model_2d, moving, image, moving_seg, seg, steps)
    assert result.mean_dice >= 0.98
    assert np.sqrt((result.disp**2).sum(0)).mean() < 0.5  # voxels
    assert result.verdict is not None and result.verdict.kept != "registered"
    assert result.verdict.similarity_after < result.verdict.similarity_before
    assert result.folding_fraction == 0.0 and result.log_jacobian_std == 0.0


@needs_data("neurite-oasis")
def test_never_worse_off_keeps_the_registration_and_flags_it(model_2d) -> None:
    from hyperreg.registration.pipeline import load_pair
    from hyperreg.registration.refine import Refinement

    image, seg = _slice()
    pair = load_pair(image, image, model=model_2d, moving_seg=seg, fixed_seg=seg)
    on, off = (
        pair.register(model_2d, [0.1], Refinement(steps=0), never_worse=rule)[0]
        for rule in (True, False)
    )
    assert off.verdict.kept == "registered" and off.verdict.text.startswith("check:")
    assert off.mean_dice < on.mean_dice == 1.0
    assert np.abs(off.disp).max() > 0 and np.abs(on.disp).max() == 0


@needs_data("neurite-oasis")
def test_a_normal_pair_is_registered_and_ok(model_2d) -> None:
    image, seg = _slice("OASIS_OAS1_0001_MR1")
    moving, moving_seg = _slice("OASIS_OAS1_0002_MR1")
    result = _register(model_2d, moving, image, moving_seg, seg, None)
    verdict = result.verdict
    assert verdict.ok and verdict.kept == "registered", verdict.text
    assert verdict.similarity_after > verdict.similarity_before
    assert result.mean_dice > result.dice_before


@needs_data("neurite-oasis")
def test_a_scale_2_initial_affine_is_flagged(model_2d) -> None:
    from hyperreg.geometry.affine import AffineTransform
    from hyperreg.registration.pipeline import load_pair

    image, seg = _slice()
    centre = image.affine @ np.array([*(np.array(image.data.shape) - 1) / 2, 0.0, 1.0])
    normal = np.cross(image.affine[:3, 0], image.affine[:3, 1])
    normal /= np.linalg.norm(normal)
    linear = 2.0 * np.eye(3) - np.outer(normal, normal)  # scale 2 in the slice's plane
    matrix = np.eye(4)
    matrix[:3, :3] = linear
    matrix[:3, 3] = centre[:3] - linear @ centre[:3]
    pair = load_pair(
        image,
        image,
        model=model_2d,
        moving_seg=seg,
        fixed_seg=seg,
        init="none",
        initial_affine=AffineTransform(matrix),
    )
    result = pair.register(model_2d, [0.1])[0]
    verdict = result.verdict
    assert "implausible affine: scales" in verdict.text
    assert sorted(verdict.affine.scales) == pytest.approx([1.0, 2.0, 2.0])


@needs_data("neurite-oasis")
def test_batch_summary_has_the_verdict_and_lists_the_pairs_to_check(tmp_path, capsys) -> None:
    from hyperreg.cli import main

    root = data_path("neurite-oasis")
    one, two = root / "OASIS_OAS1_0001_MR1", root / "OASIS_OAS1_0002_MR1"
    pairs = tmp_path / "pairs.csv"
    rows = [
        (one / "slice_norm.nii.gz", one / "slice_norm.nii.gz", one / "slice_seg24.nii.gz"),
        (two / "slice_norm.nii.gz", one / "slice_norm.nii.gz", two / "slice_seg24.nii.gz"),
    ]
    with pairs.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["moving", "fixed", "moving_seg", "fixed_seg"])
        for moving, fixed, moving_seg in rows:
            writer.writerow([moving, fixed, moving_seg, one / "slice_seg24.nii.gz"])
    out = tmp_path / "batch"
    args = ["batch", "--pairs", str(pairs), "--out", str(out), "--no-progress", "--refine", "0"]
    assert main([*args, "--device", "cpu"]) == 0
    with (out / "summary.csv").open(newline="") as handle:
        summary = list(csv.DictReader(handle))
    for column in ("verdict", "kept", "similarity_before", "similarity_after", "affine_shape"):
        assert column in summary[0], column
    identical, normal = summary
    assert identical["verdict"].startswith("check: registration lowered similarity")
    assert identical["kept"] == "headers" and float(identical["mean_dice"]) == 1.0
    assert normal["verdict"] == "ok" and normal["kept"] == "registered"
    assert float(normal["similarity_after"]) > float(normal["similarity_before"])
    assert normal["affine_shape"].startswith("scales ")
    printed = capsys.readouterr().out
    assert "1 pair(s) to check" in printed and f"{identical['name']} (" in printed


@pytest.mark.slow  # a 3D registration (about 10-20 s on one thread)
@needs_data("ixi-2mm")
def test_a_3d_head_registered_to_itself_stays_in_place() -> None:
    import hyperreg
    from hyperreg.geometry.io import load_volume
    from hyperreg.registration.refine import Refinement

    root = data_path("ixi-2mm")
    image = load_volume(root / "IXI012-HH-1211_T1.nii.gz")
    seg = load_volume(root / "IXI012-HH-1211_DLMUSE.nii.gz", label=True)
    model = hyperreg.load_pretrained(ndim=3)
    result = _register(model, image, image, seg, seg, Refinement(steps=0))
    assert result.mean_dice >= 0.98
    assert np.sqrt((result.disp**2).sum(0)).mean() < 0.5
    assert result.verdict.kept == "headers"


@needs_data("neurite-oasis")
def test_register_says_one_line_for_a_pair_to_check_and_none_for_a_good_one(
    tmp_path, capsys
) -> None:
    from hyperreg.cli import main

    one, two = (
        data_path("neurite-oasis", p) for p in ("OASIS_OAS1_0001_MR1", "OASIS_OAS1_0002_MR1")
    )
    fixed = str(one / "slice_norm.nii.gz")
    common = ["register", "--fixed", fixed, "--refine", "0", "--device", "cpu"]
    assert main([*common, "--moving", fixed, "--moved", str(tmp_path / "same.nii.gz")]) == 0
    said = capsys.readouterr()
    checks = [line for line in (said.out + said.err).splitlines() if "check:" in line]
    short = "OASIS_OAS1_0001_MR1/slice_norm.nii.gz"  # folder and name, not the whole path
    assert len(checks) == 1 and short in checks[0] and "kept the pair as it came" in checks[0]
    moving = str(two / "slice_norm.nii.gz")
    assert main([*common, "--moving", moving, "--moved", str(tmp_path / "other.nii.gz")]) == 0
    said = capsys.readouterr()
    assert "check:" not in said.out + said.err


@needs_data("neurite-oasis")
def test_register_says_the_verdict_last_with_short_file_names(tmp_path) -> None:
    """A slice registered to itself: the 'check:' warning comes after the affine stage's line
    and the other lines (stdout and stderr as a terminal interleaves them), and names the
    files by folder and name, not by their absolute paths."""
    import os
    import subprocess
    import sys

    one = data_path("neurite-oasis") / "OASIS_OAS1_0001_MR1"
    image = one / "slice_norm.nii.gz"
    command = [sys.executable, "-m", "hyperreg", "register", "--moving", str(image)]
    command += ["--fixed", str(image), "--moved", "moved.nii.gz", "--refine", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [*command, "--device", "cpu"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout
    lines = run.stdout.strip().splitlines()
    check = [i for i, line in enumerate(lines) if "check: " in line]
    affine = [i for i, line in enumerate(lines) if "affine" in line and "check: " not in line]
    assert len(check) == 1 and affine and check[0] == len(lines) - 1, lines
    assert str(one) not in lines[check[0]]
    assert "OASIS_OAS1_0001_MR1/slice_norm.nii.gz" in lines[check[0]]


def _network_grid_pair():
    """A tiny 3D model that registers at 2 mm, and a 1 mm pair chained through a shift (so
    the network grid, the affine-aligned image and the verdict's three scores all exist)."""
    import dataclasses

    from lambda_helpers import blob, tiny_model

    from hyperreg.geometry.affine import AffineTransform
    from hyperreg.geometry.io import Volume
    from hyperreg.registration.pipeline import load_pair

    model = tiny_model(3)
    model.config = dataclasses.replace(model.config, spacing=2.0)
    shape = (32, 28, 30)
    moving = Volume(blob(shape, (15, 13, 14), sigma=5.0), np.eye(4), shape)
    fixed = Volume(blob(shape, (17, 15, 15), sigma=5.0), np.eye(4), shape)
    shift = np.eye(4)
    shift[:3, 3] = (-2.0, -2.0, -1.0)
    pair = load_pair(moving, fixed, model=model, init="none", initial_affine=AffineTransform(shift))
    assert pair.chained
    return model, pair


def test_the_verdict_reuses_the_engines_network_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixed image and the affine-aligned moving image are brought to the network grid
    once per registration (by the engine), and the verdict is the one it gave when it made
    its own copies."""
    import contextlib

    import hyperreg.registration.pairs as pairs
    import hyperreg.registration.prepared as prepared
    import hyperreg.registration.similarity as similarity

    resampled: list[object] = []
    original = pairs.resample_to

    def counted(volume, grid, **kwargs):  # type: ignore[no-untyped-def]
        resampled.append(volume)
        return original(volume, grid, **kwargs)

    monkeypatch.setattr(pairs, "resample_to", counted)
    monkeypatch.setattr(similarity, "resample_to", counted, raising=False)
    model, pair = _network_grid_pair()
    result = pair.register(model, [0.5])[0]
    assert not pair.network_tensors  # handed back once the verdict scored them
    assert sum(v is pair.fixed for v in resampled) == 1
    assert sum(v is pair.aligned for v in resampled) == 1
    monkeypatch.setattr(prepared, "reused_network_tensors", contextlib.nullcontext)
    _, again = _network_grid_pair()
    alone = again.register(model, [0.5])[0]
    assert result.verdict == alone.verdict and result.verdict is not None
    np.testing.assert_array_equal(result.moved, alone.moved)


def test_a_network_tensor_changed_in_place_is_made_again() -> None:
    import torch

    from hyperreg.registration.pairs import network_inputs, network_tensor, reused_network_tensors

    model, pair = _network_grid_pair()
    device = torch.device("cpu")
    with reused_network_tensors():
        _, fixed_t, grid = network_inputs(model, pair.aligned, pair.fixed, "robust", device)
        assert grid is not None
        assert network_tensor(pair.fixed, grid.grid, "robust", device) is fixed_t
        kept = fixed_t.clone()
        fixed_t += 1.0
        again = network_tensor(pair.fixed, grid.grid, "robust", device)
        assert again is not fixed_t
        torch.testing.assert_close(again, kept, rtol=0, atol=0)
    assert network_tensor(pair.fixed, grid.grid, "robust", device) is not again  # block ended
