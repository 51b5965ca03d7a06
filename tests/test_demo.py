"""The demo end to end, with a handful of training steps (the real run is `hyperreg demo`)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from shared_paths import OASIS, needs_data
from hyperreg.apps.demo import DEMO_LAMBDAS, _slice_affine, run_demo
from hyperreg.figures.backend import pyplot


def test_slice_affine_maps_slice_voxels_to_volume_world() -> None:
    affine = np.array([[1.0, 0, 0, -98], [0, 1, 0, -134], [0, 0, 1, -72], [0, 0, 0, 1]])
    sliced = _slice_affine(affine, axis=1, index=40)
    # slice voxel (i, k, 0) is volume voxel (i, 40, k)
    np.testing.assert_allclose(sliced @ [3, 5, 0, 1], affine @ [3, 40, 5, 1])


def _check_outputs(out: Path, pairs: int) -> None:
    assert (out / "demo_figure.png").stat().st_size > 10_000
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == pairs * len(DEMO_LAMBDAS)
    assert all(np.isfinite(float(r["dice"])) and 0 <= float(r["dice"]) <= 1 for r in rows)
    fixed = nib.load(out / "nifti" / "fixed.nii.gz")
    for lam in DEMO_LAMBDAS:
        moved = nib.load(out / "nifti" / f"moved_lambda{lam:.1f}.nii.gz")
        disp = nib.load(out / "nifti" / f"disp_lambda{lam:.1f}.nii.gz")
        seg = nib.load(out / "nifti" / f"moved_seg_lambda{lam:.1f}.nii.gz")
        assert moved.shape == fixed.shape and disp.shape == (*fixed.shape, 2)
        np.testing.assert_allclose(moved.affine, fixed.affine)
        assert np.issubdtype(seg.get_data_dtype(), np.integer)
    assert "| λ |" in (out / "results.md").read_text()


def _record_titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Panel and figure titles of every figure saved from now on."""
    plt = pyplot()
    titles: list[str] = []
    real_save = plt.Figure.savefig

    def record(fig, *args, **kwargs):  # type: ignore[no-untyped-def]
        titles.extend(ax.get_title() for ax in fig.axes if ax.get_title())
        titles.append(fig._suptitle.get_text() if fig._suptitle else "")
        return real_save(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", record)
    return titles


def _check_figure_titles(titles: list[str]) -> None:
    # the alignment can be judged by eye: edges, checkerboards and label borders, all titled
    joined = " | ".join(titles)
    assert "moving (input, no registration)" in joined
    assert "red: fixed edges" in joined
    assert "checkerboard moving / fixed" in joined and "checkerboard moved" in joined
    assert "labels before: fixed yellow" in joined
    assert sum("moved cyan, both green" in t for t in titles) == len(DEMO_LAMBDAS)


@pytest.mark.slow  # a training run, subprocesses or benchmark runs: CI's slow step
@pytest.mark.skipif(importlib.util.find_spec("nilearn") is None, reason="nilearn not installed")
def test_demo_on_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    titles = _record_titles(monkeypatch)
    report = run_demo(tmp_path, steps=2, eval_pairs=2, progress=False, device="cpu")
    _check_figure_titles(titles)
    _check_outputs(tmp_path, pairs=2)
    assert "MNI152" in report
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert all(float(r["field_error_before"]) > 0 for r in rows)
    assert "field_error" in rows[0] and "field_error: mean end-point error" in report


@needs_data("neurite-oasis")
def test_demo_on_oasis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    titles = _record_titles(monkeypatch)
    report = run_demo(tmp_path, data=str(OASIS), steps=2, progress=False, device="cpu")
    _check_figure_titles(titles)
    _check_outputs(tmp_path, pairs=2)
    # real pairs have no true field: neither the columns nor the legend name a field error
    columns = next(csv.reader((tmp_path / "results.csv").open()))
    assert not [c for c in columns if c.startswith("field_error")]
    assert "field_error" not in report and "log_jacobian_std:" in report
