"""Intensities a few outlying voxels cannot dominate (hyperreg.geometry.intensity "robust"): the
network's inputs, the affine stage's inputs and the outputs' units.

Synthetic images whose answers are known: a head-like image with a bright tail, then a handful
of voxels at 50 times its maximum (as metal or an electrode leaves).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from lambda_helpers import blob, tiny_model, write_nifti
from shared_paths import data_path, needs_data
from test_native import _pair

from hyperreg._errors import InputError
from hyperreg.cli.args import add_normalization_argument
from hyperreg.geometry.intensity import (
    DEFAULT_NORMALIZATION,
    NORMALIZATIONS,
    intensity_window,
    normalize_intensity,
    winsorize,
)
from hyperreg.geometry.bias import correct_bias
from hyperreg.geometry.io import Volume, load_volume
from hyperreg.registration.pipeline import load_pair


def _head(shape: tuple[int, ...] = (40, 36, 32), seed: int = 0) -> np.ndarray:
    """Background near 0, tissue of 200-900 units, a sparse bright tail up to about 1500."""
    rng = np.random.default_rng(seed)
    image = 900.0 * blob(shape, tuple(s / 2 for s in shape), sigma=min(shape) / 4)
    image += rng.normal(0, 5, shape)
    tail = rng.random(shape) < 0.002  # vessels, fat: 0.2 % of voxels, up to 1.7x the tissue
    image[tail] += rng.uniform(0, 600, int(tail.sum()))
    return np.clip(image, 0, None).astype(np.float32)


def _with_outliers(image: np.ndarray, count: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """``image`` with ``count`` voxels near a corner of the head at 50x its maximum."""
    spoiled = image.copy()
    mask = np.zeros(image.shape, dtype=bool)
    mask.reshape(-1)[np.arange(count) * 7 + 3 * image.shape[-1] + 5] = True
    spoiled[mask] = 50.0 * image.max()
    return spoiled, mask


def test_an_image_without_outliers_is_scaled_exactly_as_min_max() -> None:
    image = _head()
    np.testing.assert_array_equal(
        normalize_intensity(image, "robust"), normalize_intensity(image, "minmax")
    )
    assert winsorize(image) is image  # nothing changed: the affine stage gets the image itself
    sparse = np.zeros((50, 50), dtype=np.float32)
    sparse[0, 0] = 7.0  # both anchors 0: one voxel cannot be told from an outlier, kept
    np.testing.assert_array_equal(normalize_intensity(sparse), sparse / 7.0)
    assert DEFAULT_NORMALIZATION == "robust"


def test_a_few_huge_voxels_leave_the_rest_of_the_image_its_range() -> None:
    image = _head()
    spoiled, mask = _with_outliers(image)
    intact = normalize_intensity(image, "robust")
    robust = normalize_intensity(spoiled, "robust")
    minmax = normalize_intensity(spoiled, "minmax")
    # min-max squeezes everything else into the bottom 2 % of [0, 1]
    assert minmax[~mask].max() < 0.021
    # the rule gives the rest of the image the values it has without the outliers, and the
    # outliers the value of the image's 99.9th percentile (a bright voxel of the image itself)
    np.testing.assert_allclose(robust[~mask], intact[~mask], atol=1e-6)
    p_hi = np.percentile(spoiled, 99.9)
    np.testing.assert_allclose(robust[mask], p_hi / image.max(), rtol=1e-5)
    assert robust.min() >= 0.0 and robust.max() <= 1.0


def test_the_affine_stage_input_keeps_the_image_units_and_clips_only_the_outliers() -> None:
    spoiled, mask = _with_outliers(_head())
    clipped = winsorize(spoiled)
    low, high = intensity_window(spoiled)
    np.testing.assert_array_equal(clipped[~mask], spoiled[~mask])  # original units
    np.testing.assert_allclose(clipped[mask], np.percentile(spoiled, 99.9), rtol=1e-6)
    assert (low, high) == (spoiled.min(), spoiled[~mask].max())
    for method in ("minmax", "none"):  # the other rules clip nothing
        np.testing.assert_array_equal(winsorize(spoiled, method), spoiled)


def test_an_unknown_rule_is_refused_naming_it() -> None:
    for call in (normalize_intensity, winsorize, intensity_window):
        with pytest.raises(InputError, match="'method' must be one of .*'robust'.*'zscore'"):
            call(np.zeros(3), "zscore")


def test_the_command_line_offers_the_library_rules_and_default() -> None:
    parser = argparse.ArgumentParser()
    add_normalization_argument(parser)
    action = next(a for a in parser._actions if a.dest == "normalization")
    assert tuple(action.choices) == NORMALIZATIONS
    assert action.default == DEFAULT_NORMALIZATION


def test_the_affine_stage_recovers_a_known_transform_with_outliers_in_the_moving_image(
    tmp_path: Path,
) -> None:
    moving, fixed, truth = _pair(tmp_path, 3)  # a phantom seen through a known world affine
    data = np.asarray(nib.load(moving.path).dataobj, dtype=np.float32)
    spoiled, _ = _with_outliers(data, count=8)
    path = tmp_path / "spoiled.nii.gz"
    nib.save(nib.Nifti1Image(spoiled, moving.affine), path)
    centre = fixed.affine @ np.array([*(np.array(fixed.spatial_shape) / 2), 1])
    found = load_pair(path, fixed.path, init="affine").transform
    np.testing.assert_allclose(found.matrix[:3, :3], truth[:3, :3], atol=0.05)
    np.testing.assert_allclose(found.matrix @ centre, truth @ centre, atol=1.5)


def test_outputs_keep_the_moving_image_units(tmp_path: Path) -> None:
    """A moving image in scanner units with a few huge voxels: the moved image is in those
    units (not [0, 1]), and the tissue keeps its values away from the outliers."""
    from hyperreg.apps.register import register_files

    shape = (48, 40)
    moving = 1000.0 * blob(shape, (22, 20), 7.0)
    moving[2, 2] = 50.0 * moving.max()  # 1 voxel (0.05 %) in the corner, far from the tissue
    fixed = blob(shape, (24, 21), 7.5)
    files = {
        name: write_nifti(tmp_path / f"{name}.nii.gz", image[..., None].astype(np.float32))
        for name, image in (("moving", moving), ("fixed", fixed))
    }
    moved_path = tmp_path / "moved.nii.gz"
    register_files(
        tiny_model(flow_scale=0.0),
        files["moving"],
        files["fixed"],
        0.5,
        init="none",
        moved=moved_path,
    )
    moved = load_volume(moved_path).data
    centre = (slice(16, 28), slice(14, 26))
    np.testing.assert_allclose(moved[centre], moving[centre], rtol=1e-4, atol=1e-2)
    assert moved.max() > 900.0  # the moving image's own units, not [0, 1]


@needs_data("ixi-2mm")
def test_clean_ixi_heads_are_scaled_exactly_as_min_max() -> None:
    """The bundled 3D model was trained with min-max: on the IXI heads of the shared data (its
    training people and the held-out ones) the default rule changes nothing."""
    files = sorted(data_path("ixi-2mm").glob("*_T1.nii.gz"))
    assert files
    for file in files:
        data = load_volume(file).data
        assert intensity_window(data) == (float(data.min()), float(data.max())), file.name


# --- opt-in bias-field correction (N4) ----------------------------------------------------------


def _biased_phantom(shape: tuple[int, ...] = (40, 44, 36)) -> tuple[Volume, np.ndarray, np.ndarray]:
    """Two tissues (100 and 60 units) in a head on a 0 background, times a smooth field of
    0.6-1.6: ``(biased volume, tissue label map, field)``."""
    grid = np.meshgrid(*[np.linspace(-1, 1, s) for s in shape], indexing="ij")
    radius = np.sqrt(sum(g**2 for g in grid))
    tissue = np.where(radius < 0.45, 2, np.where(radius < 0.85, 1, 0))
    clean = np.select([tissue == 2, tissue == 1], [60.0, 100.0], 0.0)
    field = np.exp(0.25 * grid[0] - 0.2 * grid[1] + 0.15 * grid[2] ** 2)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    biased = Volume((clean * field).astype(np.float32), affine, shape)
    return biased, tissue, field


def _tissue_spread(data: np.ndarray, tissue: np.ndarray) -> float:
    """Largest std of log intensity within one tissue (0 for a flat, unbiased image)."""
    return max(float(np.std(np.log(data[tissue == t]))) for t in (1, 2))


def test_bias_correction_removes_most_of_a_smooth_field() -> None:
    biased, tissue, _ = _biased_phantom()
    corrected = correct_bias(biased)
    before, after = _tissue_spread(biased.data, tissue), _tissue_spread(corrected.data, tissue)
    assert before > 0.1
    assert after < 0.4 * before, (before, after)
    np.testing.assert_array_equal(corrected.affine, biased.affine)
    assert corrected.data.dtype == np.float32
    # the units are kept on average: the head's mean moves by a few percent at most
    head = tissue > 0
    assert abs(corrected.data[head].mean() / biased.data[head].mean() - 1) < 0.1


def test_bias_correction_refuses_a_constant_image() -> None:
    flat = Volume(np.ones((20, 20, 20), dtype=np.float32), np.eye(4), (20, 20, 20))
    with pytest.raises(InputError, match="constant or holds non-finite values"):
        correct_bias(flat)


def test_bias_correct_option_registers_corrected_copies_and_writes_the_originals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hyperreg affine --bias-correct``: runs, and the moved image is the moving file as read
    (not its corrected copy) sampled through the transform found."""
    from hyperreg.cli import main
    from hyperreg.geometry.affine import load_affine
    from hyperreg.registration.chain import sample_volume

    biased, _, _ = _biased_phantom()
    moving = tmp_path / "moving.nii.gz"
    nib.save(nib.Nifti1Image(biased.data, biased.affine), moving)
    fixed = tmp_path / "fixed.nii.gz"
    shifted = biased.affine.copy()
    shifted[:3, 3] = [3.0, -2.0, 1.0]
    nib.save(nib.Nifti1Image(biased.data, shifted), fixed)
    moved, transform = tmp_path / "moved.nii.gz", tmp_path / "affine.mat"
    args = ["affine", "--moving", str(moving), "--fixed", str(fixed), "--bias-correct"]
    assert main([*args, "--moved", str(moved), "--affine-out", str(transform)]) == 0
    capsys.readouterr()
    fixed_v, moving_v = load_volume(fixed), load_volume(moving)
    expected = sample_volume(moving_v, load_affine(transform), None, fixed_v).data
    np.testing.assert_allclose(load_volume(moved).data, expected, rtol=1e-5, atol=1e-4)
    pair = load_pair(moving, fixed, init="none", bias_correct=True)
    assert pair.moving.data is not pair.aligned.data
    np.testing.assert_array_equal(pair.moving.data, moving_v.data)  # outputs from the file
    assert any("bias field corrected" in note for note in pair.notes)


def test_init_none_with_outliers_samples_outputs_from_the_file_and_keeps_the_inverse(
    tmp_path: Path,
) -> None:
    """Without an affine stage the network gets the clipped copy while the moved image comes
    from the file as read; the inverse field stays available and no 'affine alone' is made up."""
    shape = (48, 40)
    moving = 1000.0 * blob(shape, (22, 20), 7.0)
    moving[2, 2] = 50.0 * moving.max()  # 0.05 % of the voxels: an outlier
    fixed = blob(shape, (24, 21), 7.5)
    files = {
        name: write_nifti(tmp_path / f"{name}.nii.gz", image[..., None].astype(np.float32))
        for name, image in (("moving", moving), ("fixed", fixed))
    }
    seg = {
        name: write_nifti(
            tmp_path / f"{name}_seg.nii.gz", (image > 0.5 * image.max())[..., None].astype(np.uint8)
        )
        for name, image in (("moving", np.where(moving > 1000, 0, moving)), ("fixed", fixed))
    }
    pair = load_pair(
        files["moving"],
        files["fixed"],
        init="none",
        moving_seg=seg["moving"],
        fixed_seg=seg["fixed"],
    )
    assert pair.aligned.data.max() < 1001.0  # the network's copy: the outliers are gone
    assert pair.dice_affine is None and pair.affine is None
    result = pair.register(tiny_model(flow_scale=0.0), [0.5], inverse=True)[0]
    assert result.inverse_disp is not None
    # the file as read: its outlier voxel included, its tissue in its own units
    assert result.moved[2, 2] > 1000.0
    np.testing.assert_allclose(result.moved[8:, 8:], moving[8:, 8:], rtol=1e-4, atol=1e-2)


def test_register_and_sweep_take_bias_correct_on_a_2d_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lambda_helpers import save_tiny_model

    from hyperreg.cli import main

    shape = (48, 40)
    x = np.linspace(0.6, 1.6, shape[0])[:, None]  # a smooth bias across the moving image
    images = {"moving": 800.0 * blob(shape, (22, 20), 8.0) * x, "fixed": blob(shape, (24, 21), 8.5)}
    files = {
        k: write_nifti(tmp_path / f"{k}.nii.gz", v[..., None].astype(np.float32))
        for k, v in images.items()
    }
    model = save_tiny_model(tmp_path / "model.pt")
    pair = ["--moving", str(files["moving"]), "--fixed", str(files["fixed"]), "--model", str(model)]
    common = [*pair, "--device", "cpu", "--init", "none", "--bias-correct"]
    moved = tmp_path / "moved.nii.gz"
    assert main(["register", *common, "--lambda", "0.5", "--moved", str(moved)]) == 0
    assert load_volume(moved).data.max() > 100.0  # the moving file's units
    assert main(["sweep", *common, "--lambdas", "0.5", "--out", str(tmp_path / "sweep")]) == 0
    capsys.readouterr()
