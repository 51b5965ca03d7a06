"""Other contrasts, what the network sees and how the result is judged: the intensity map
(:mod:`hyperreg.geometry.intensity_map`), normalised gradient fields
(:func:`hyperreg.method.losses.ngf_loss`), the gain a field must show
(:func:`hyperreg.registration.verdict.judge` ``min_gain``), the λ of other contrasts, and the
two targets on the shared data (an aligned T2 -> T1 slice barely moves; a T2-like slice of
another person reaches a T1's Dice)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from shared_paths import data_path, needs_data
from test_contrast import T1, T2, phantom
from hyperreg._errors import InputError
from hyperreg.geometry.intensity_map import intensity_map
from hyperreg.method.losses import ngf_loss
from hyperreg.registration.contrast import OTHER_MIN_LAMBDA, contrast_lambda
from hyperreg.registration.verdict import MIN_GAINS, judge

MC_T1 = "structInSpaceOfTemplateCoronalSlice.nii.gz"  # multicontrast-2d, one person's T1
MC_T2 = "T2_" + MC_T1  # and their T2, in the same template space


def test_intensity_map_draws_a_t2_in_t1_intensities() -> None:
    moving, fixed = phantom(T2, seed=1), phantom(T1)
    mapping = intensity_map(moving, fixed)
    drawn = mapping.apply(moving)
    assert drawn.shape == moving.shape and drawn.dtype == np.float32
    # each tissue takes the fixed image's value (noise 0.02; blur-free phantoms)
    before = np.abs(moving - fixed).mean()
    assert np.abs(drawn - fixed).mean() < 0.02 < before
    # the map is not monotone: bright CSF (T2 1.0) lands on the T1's dark CSF (0.25)
    assert mapping.apply(np.array([1.0]))[0] == pytest.approx(0.25, abs=0.03)
    assert mapping.apply(np.array([0.35]))[0] == pytest.approx(0.85, abs=0.03)
    # constant beyond the ends, non-finite stays non-finite
    ends = mapping.apply(np.array([-5.0, 50.0, np.nan]))
    assert ends[0] == pytest.approx(mapping.fixed[0])
    assert ends[1] == pytest.approx(mapping.fixed[-1])
    assert np.isnan(ends[2])


def test_intensity_map_bad_input() -> None:
    with pytest.raises(InputError, match="shape"):
        intensity_map(np.zeros((4, 4)), np.zeros((4, 5)))
    with pytest.raises(InputError, match="bins"):
        intensity_map(phantom(T2), phantom(T1), bins=1)
    with pytest.raises(InputError, match="intensity levels"):
        intensity_map(np.ones((8, 8)), phantom(T1)[:8, :8])


def _t(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32))[None, None]


def test_ngf_compares_edges_whatever_the_contrast() -> None:
    t1, t2 = _t(phantom(T1)), _t(phantom(T2, seed=1))
    shifted = _t(phantom(T2, 3.0, seed=1))
    aligned = -float(ngf_loss(t2, t1))
    assert 0 < -float(ngf_loss(shifted, t1)) < aligned <= 1
    # either edge sign, any intensity units
    assert -float(ngf_loss(-t2, t1)) == pytest.approx(aligned, rel=1e-5)
    assert -float(ngf_loss(300 * t2, t1)) == pytest.approx(aligned, rel=1e-4)
    # differentiable, per sample, 3D
    moving = shifted.clone().requires_grad_(True)
    ngf_loss(moving, t1).backward()
    assert moving.grad is not None and torch.isfinite(moving.grad).all()
    assert moving.grad.abs().sum() > 0
    batch = torch.cat([t2, shifted])
    assert ngf_loss(batch, torch.cat([t1, t1]), reduction="none").shape == (2,)
    volume = torch.from_numpy(gaussian_filter(np.random.default_rng(0).random((12, 13, 14)), 1.5))
    volume = volume.float()[None, None]
    moved = torch.roll(volume, 2, dims=2)
    assert -float(ngf_loss(volume, volume)) > -float(ngf_loss(moved, volume)) > 0
    with pytest.raises(ValueError, match="edge"):
        ngf_loss(t2, t1, edge=0.0)
    with pytest.raises(ValueError):
        ngf_loss(t2, t1[..., :10])


def test_a_field_must_raise_ngf_by_the_gain_to_be_kept() -> None:
    gain = MIN_GAINS["ngf"]
    small = judge(0.10, 0.10, 0.10 * (1 + gain / 2), min_gain=gain)
    assert small.kept == "affine" and "raised similarity only" in small.text
    kept_anyway = judge(0.10, 0.10, 0.10 * (1 + gain / 2), min_gain=gain, never_worse=False)
    assert kept_anyway.kept == "registered" and "never-worse rule off" in kept_anyway.text
    big = judge(0.10, 0.10, 0.10 * (1 + 2 * gain), min_gain=gain)
    assert big.kept == "registered" and big.ok
    assert judge(0.10, 0.10, 0.10 * (1 + gain / 2)).ok  # no gain asked: the old rule
    with pytest.raises(ValueError, match="min_gain"):
        judge(0.1, 0.1, 0.1, min_gain=-0.1)


def test_other_contrasts_raise_a_low_default_lambda() -> None:
    assert contrast_lambda(0.05, "ngf") == OTHER_MIN_LAMBDA
    assert contrast_lambda(0.5, "ngf") is None
    assert contrast_lambda(0.05, None) is None


def _mean_displacement(path: Path) -> float:
    field = np.asarray(nib.load(path).dataobj, dtype=np.float64)
    return float(np.linalg.norm(field.reshape(-1, field.shape[-1]), axis=1).mean())


@needs_data("multicontrast-2d")
def test_an_aligned_t2_slice_barely_moves(tmp_path: Path) -> None:
    from hyperreg.apps.models import resolve_model
    from hyperreg.apps.register import register_files

    person = data_path("multicontrast-2d", "S3")
    model = resolve_model("hypermorph-2d").model
    warp = tmp_path / "warp.nii.gz"
    args = (model, person / MC_T2, person / MC_T1)
    result = register_files(*args, warp_out=warp)
    assert result.verdict is not None and result.verdict.similarity_before < 1
    assert _mean_displacement(warp) <= 1.0
    register_files(*args, warp_out=warp, contrast="same")  # the code before: ~3 voxels
    assert _mean_displacement(warp) > 1.0


@needs_data("neurite-oasis")
def test_a_t2_like_slice_of_another_person_reaches_t1_dice(tmp_path: Path) -> None:
    from hyperreg.apps.models import resolve_model
    from hyperreg.apps.register import register_files

    oasis = data_path("neurite-oasis")
    s1, s2 = oasis / "OASIS_OAS1_0001_MR1", oasis / "OASIS_OAS1_0002_MR1"
    image = nib.load(s2 / "slice_norm.nii.gz")
    seg4 = np.asarray(nib.load(s2 / "slice_seg4.nii.gz").dataobj)
    # T2-like: CSF bright, grey above white (the T1 order inverted in the brain), blurred
    # and noisy as an image is (a sharp, noise-free rendering is not reached: see
    # benchmarks/RESULTS_contrast.md)
    t2 = np.asarray((0.0, 0.6, 0.55, 0.35, 1.0))[seg4[..., 0].astype(int)]
    t2 = gaussian_filter(t2, 0.7)
    t2 = t2 + np.random.default_rng(0).normal(0.0, 0.02, t2.shape) * (t2 > 0.01)
    t2 = np.clip(t2, 0.0, None).astype(np.float32)[..., None]
    moving = tmp_path / "t2.nii.gz"
    nib.save(nib.Nifti1Image(t2, image.affine), moving)
    model = resolve_model("hypermorph-2d").model
    segs = dict(moving_seg=s2 / "slice_seg24.nii.gz", fixed_seg=s1 / "slice_seg24.nii.gz")
    fixed = s1 / "slice_norm.nii.gz"
    t1_dice = register_files(model, s2 / "slice_norm.nii.gz", fixed, **segs).mean_dice
    t2_result = register_files(model, moving, fixed, **segs)
    assert t2_result.verdict is not None and t2_result.verdict.kept == "registered"
    assert t2_result.mean_dice >= t1_dice - 0.05


def test_a_cut_moving_image_is_mapped_inside_its_footprint_and_filled_beyond() -> None:
    from types import SimpleNamespace

    from hyperreg.geometry.affine import AffineTransform
    from hyperreg.geometry.io import Volume
    from hyperreg.registration.contrast import remap_pair

    def volume(data: np.ndarray) -> Volume:
        return Volume(data=data, affine=np.eye(4), disk_shape=data.shape, path=None)

    fixed = np.repeat(phantom(T1)[..., None], 4, axis=2)  # a 64 x 64 x 4 head
    t2 = np.repeat(phantom(T2, seed=1)[..., None], 4, axis=2)
    moving = volume(np.ascontiguousarray(t2[:40]))  # cut: the first 40 rows only
    aligned = np.where(np.arange(64)[:, None, None] < 40, t2, 0.0).astype(np.float32)
    pair = SimpleNamespace(
        aligned=volume(aligned), fixed=volume(fixed), moving=moving, fov_fraction=0.5,
        transform=AffineTransform.identity(), chained=True, remapped=None,
    )  # fmt: skip
    remap_pair(pair)
    out = pair.remapped.data
    # beyond the cut: the fixed head itself (the map draws the moving image in its units)
    assert np.allclose(out[41:], fixed[41:], rtol=0.05, atol=0.02)
    # inside: the T2 drawn in T1 intensities, with the map found there only (the cut-off rows'
    # zeros would otherwise pull the dark end of the map toward the fixed head's tissue)
    inside = np.abs(out[:39] - fixed[:39])
    assert inside[fixed[:39] > 0.1].mean() < 0.1
    assert np.abs(out[:39][fixed[:39] == 0]).max() < 0.05  # the background stays dark
