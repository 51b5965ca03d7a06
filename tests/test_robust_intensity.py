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
from hyperreg.geometry.io import load_volume
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
    assert winsorize(image) is image  # nothing clipped: the affine stage gets the image itself
    assert DEFAULT_NORMALIZATION == "robust"


def test_a_few_huge_voxels_leave_the_rest_of_the_image_its_range() -> None:
    image = _head()
    spoiled, mask = _with_outliers(image)
    intact = normalize_intensity(image, "robust")
    robust = normalize_intensity(spoiled, "robust")
    minmax = normalize_intensity(spoiled, "minmax")
    # min-max squeezes everything else into the bottom 2 % of [0, 1]
    assert minmax[~mask].max() < 0.021
    # the rule gives the rest of the image the values it has without the outliers
    np.testing.assert_allclose(robust[~mask], intact[~mask], atol=1e-6)
    np.testing.assert_array_equal(robust[mask], 1.0)  # the outliers saturate
    assert robust.min() >= 0.0 and robust.max() <= 1.0


def test_the_affine_stage_input_keeps_the_image_units_and_clips_only_the_outliers() -> None:
    spoiled, mask = _with_outliers(_head())
    clipped = winsorize(spoiled)
    low, high = intensity_window(spoiled)
    np.testing.assert_array_equal(clipped[~mask], spoiled[~mask])  # original units
    np.testing.assert_array_equal(clipped[mask], spoiled[~mask].max())  # the rest's maximum
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
    moving[2:4, 2:4] = 50.0 * moving.max()  # 4 voxels in the corner, far from the tissue
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
