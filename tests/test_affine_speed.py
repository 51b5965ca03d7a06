"""The fast affine stage (issue 22): early identity test, disjoint headers, initial transforms.

Synthetic phantoms from ``test_native`` (a head-like set of ellipsoids defined in world mm, seen
by the moving grid through a known world affine), so every expected answer is known exactly.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

import hyperreg.geometry.affine as affine_module
from hyperreg.geometry.affine import AffineTransform, register_affine
from hyperreg.geometry.io import Volume, load_volume
from test_native import _pair


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the transform name of every optimisation run of the affine stage."""
    runs: list[str] = []
    original = affine_module._run

    def counted(level, transform, start, seed, iterations, index):  # type: ignore[no-untyped-def]
        runs.append(f"{transform.GetName()}@{index}")
        return original(level, transform, start, seed, iterations, index)

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
    assert len(runs) == 4 and runs[-1] == "AffineTransform@1", runs


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
