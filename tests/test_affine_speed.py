"""The fast affine stage (issue 22): early identity test, disjoint headers, initial transforms.

Synthetic phantoms from ``test_native`` (a head-like set of ellipsoids defined in world mm, seen
by the moving grid through a known world affine), so every expected answer is known exactly.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk
import test_native
from test_native import _inside, _pair, _sitk_moved

import hyperreg.geometry.affine as affine_module
from hyperreg.geometry.affine import (
    AffineTransform,
    load_initial_affine,
    register_affine,
    save_affine,
)
from hyperreg.geometry.io import Volume, load_volume
from hyperreg.registration.chain import sample_volume


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the transform name of every optimisation run of the affine stage."""
    runs: list[str] = []
    original = affine_module._run

    def counted(level, transform, start, seed, iterations, index, *masks):  # type: ignore[no-untyped-def]
        runs.append(f"{transform.GetName()}@{index}")
        return original(level, transform, start, seed, iterations, index, *masks)

    monkeypatch.setattr(affine_module, "_run", counted)
    return runs


@pytest.mark.parametrize("ndim", [2, 3])
def test_early_test_keeps_the_identity_after_one_coarse_rigid_run(
    tmp_path: Path, ndim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, fixed, _ = _pair(tmp_path, ndim)
    noise = np.random.default_rng(0).normal(0, 0.01, fixed.data.shape).astype(np.float32)
    moving = Volume(fixed.data + noise, fixed.affine, fixed.disk_shape)
    runs = _count_runs(monkeypatch)
    found = register_affine(moving, fixed, "affine")
    np.testing.assert_array_equal(found.matrix, np.eye(4))
    assert found.kind == "affine" and found.metric_after == found.metric_before
    assert len(runs) == 1 and runs[0].startswith("Euler"), runs  # the rest was not run


@pytest.mark.parametrize("ndim", [2, 3])
def test_a_misaligned_pair_runs_every_level(
    tmp_path: Path, ndim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    moving, fixed, _ = _pair(tmp_path, ndim)
    runs = _count_runs(monkeypatch)
    register_affine(moving, fixed, "affine")
    # the early rigid run, up to 3 rigid runs from the rotation search's orientations, then
    # the affine at both levels (no rigid run at the fine level before it)
    assert runs[0].startswith("Euler") and runs[0].endswith("@0"), runs
    assert all(r.startswith("Euler") and r.endswith("@0") for r in runs[1:-2]), runs
    assert 3 <= len(runs) <= 6, runs
    assert runs[-2:] == ["AffineTransform@0", "AffineTransform@1"], runs
    runs.clear()
    register_affine(moving, fixed, "rigid")  # a rigid stage ends with the fine level
    assert runs[0].endswith("@0") and runs[-1].startswith("Euler") and runs[-1].endswith("@1")
    assert all(r.startswith("Euler") for r in runs), runs


def test_disjoint_headers_start_from_the_centres_of_mass(tmp_path: Path) -> None:
    moving, fixed, truth = _pair(tmp_path, 3)
    far = moving.affine.copy()
    far[:3, 3] += [400.0, -300.0, 250.0]  # the moving box lies far outside the fixed one
    nib.save(nib.Nifti1Image(moving.data, far), tmp_path / "far.nii.gz")
    moved_far = load_volume(tmp_path / "far.nii.gz")
    assert not affine_module.world_overlap(moved_far, fixed)
    found = register_affine(moved_far, fixed, "affine")
    shift = np.eye(4)
    shift[:3, 3] = [400.0, -300.0, 250.0]
    expected = shift @ truth  # a fixed point goes to the true moving point, then 'far' away
    np.testing.assert_allclose(found.matrix[:3, :3], expected[:3, :3], atol=0.05)
    centre = fixed.affine @ np.array([*(np.array(fixed.spatial_shape) / 2), 1])
    np.testing.assert_allclose(found.matrix @ centre, expected @ centre, atol=1.5)
    assert np.isnan(found.metric_before) and np.isfinite(found.metric_after)


# --- an initial affine from a file (--initial-affine) ----------------------------------------

_LPS = np.diag([-1.0, -1.0, 1.0])


def _sitk_file(path: Path, matrix: np.ndarray, centre: tuple[float, ...]) -> Path:
    """Write the RAS fixed -> moving ``matrix`` as SimpleITK would: an LPS ``AffineTransform``
    with a centre, by ``sitk.WriteTransform`` (``.mat``: ITK's MATLAB format, as ANTs writes)."""
    linear = _LPS @ matrix[:3, :3] @ _LPS
    offset = _LPS @ matrix[:3, 3]
    centre_a = np.asarray(centre, dtype=np.float64)
    transform = sitk.AffineTransform(3)
    transform.SetCenter(tuple(centre_a))
    transform.SetMatrix(tuple(linear.ravel()))
    # p -> A (p - c) + c + t must equal A p + offset
    transform.SetTranslation(tuple(offset - centre_a + linear @ centre_a))
    sitk.WriteTransform(transform, str(path))
    return path


@pytest.mark.parametrize("suffix", [".mat", ".tfm"])
def test_simpleitk_initial_affine_round_trips_and_moves_like_simpleitk(
    tmp_path: Path, suffix: str
) -> None:
    moving, fixed, truth = _pair(tmp_path, 3)
    path = _sitk_file(tmp_path / f"init{suffix}", truth, (3.0, -7.0, 11.0))
    read = load_initial_affine(path, moving, fixed)
    np.testing.assert_allclose(read.matrix, truth, atol=1e-9)
    ours = sample_volume(moving, read, None, fixed).data
    theirs = _sitk_moved(moving.path, fixed.path, sitk.ReadTransform(str(path)))
    inside = _inside(moving, fixed, truth)
    assert inside.mean() > 0.3
    np.testing.assert_allclose(theirs.reshape(ours.shape)[inside], ours[inside], atol=1e-4)
    # the moved image is the phantom on the fixed grid (truth known analytically), up to linear
    # interpolation of its 1 mm soft edges from the 1.7-1.9 mm moving grid
    error = np.abs(ours[inside] - fixed.data[inside])
    assert error.mean() < 0.005 and error.max() < 0.1, (error.mean(), error.max())


@pytest.mark.parametrize("ndim", [2, 3])
def test_register_affine_uses_the_initial_affine(tmp_path: Path, ndim: int) -> None:
    moving, fixed, truth = _pair(tmp_path, ndim)
    initial = AffineTransform(truth, "affine")
    assert register_affine(moving, fixed, "none", initial=initial) is initial  # used as is
    kept = register_affine(moving, fixed, "affine", initial=initial)  # nothing to refine
    np.testing.assert_array_equal(kept.matrix, truth)
    shifted = truth.copy()  # 6 mm off in-plane: refined back to the truth
    shifted[:3, 3] += [4.0, 0.0, 4.5] if ndim == 2 else [4.0, -3.0, 3.0]
    found = register_affine(moving, fixed, "affine", initial=AffineTransform(shifted, "affine"))
    centre = fixed.affine @ np.array([*(np.array(fixed.spatial_shape) / 2), *[0] * (3 - ndim), 1])
    np.testing.assert_allclose(found.matrix[:3, :3], truth[:3, :3], atol=0.05)
    np.testing.assert_allclose(found.matrix @ centre, truth @ centre, atol=1.5)
    assert found.metric_after < found.metric_before


def test_initial_affine_written_by_hyperreg_fits_a_2d_pair(tmp_path: Path) -> None:
    moving, fixed, truth = _pair(tmp_path, 2)  # coronal slices: saved as a 3D ITK affine
    path = save_affine(tmp_path / "a.mat", AffineTransform(truth, "affine"), ndim=2)
    np.testing.assert_allclose(load_initial_affine(path, moving, fixed).matrix, truth, atol=1e-9)


def test_bad_initial_affines_are_one_line_errors_naming_the_file(tmp_path: Path) -> None:
    moving, fixed, truth = _pair(tmp_path, 3)
    (tmp_path / "two").mkdir()
    moving2, fixed2, _ = _pair(tmp_path / "two", 2)
    not_a_transform = tmp_path / "bad.tfm"
    not_a_transform.write_text("#Insight Transform File V1.0\nnot a transform\n")
    field = sitk.DisplacementFieldTransform(sitk.Image([4, 4, 4], sitk.sitkVectorFloat64, 3))
    sitk.WriteTransform(field, str(tmp_path / "field.tfm"))
    flat = sitk.AffineTransform(2)
    sitk.WriteTransform(flat, str(tmp_path / "flat.tfm"))
    far = truth.copy()
    far[:3, 3] += 500.0
    tilt = np.eye(4)
    tilt[:3, :3] = test_native._rotation(30, 0)  # about x: out of the coronal (x-z) plane
    mirror = np.diag([-1.0, 1.0, 1.0, 1.0])
    cases = [
        (not_a_transform, moving, fixed, "is not an affine transform file"),
        (tmp_path / "field.tfm", moving, fixed, "is not an affine transform file"),
        (tmp_path / "flat.tfm", moving, fixed, "holds a 2D transform, but the pair is 3D"),
        (_sitk_file(tmp_path / "far.tfm", far, (0, 0, 0)), moving, fixed, "field of view"),
        (_sitk_file(tmp_path / "m.tfm", mirror, (0, 0, 0)), moving, fixed, "not a usable"),
        (_sitk_file(tmp_path / "t.tfm", tilt, (0, 0, 0)), moving2, fixed2, "out of the plane"),
    ]
    for path, m, f, expected in cases:
        with pytest.raises(ValueError, match="load_initial_affine") as info:
            load_initial_affine(path, m, f)
        message = str(info.value)
        assert expected in message and str(path) in message and "\n" not in message, message
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_initial_affine(tmp_path / "missing.mat", moving, fixed)
