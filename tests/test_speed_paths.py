"""The faster output paths (issue 22) agree with the float64 algorithms they replace.

Each reference below is the code path before the change, written out in float64 on a small 3D
(and 2D) pair: the chain's moving points (``moving_points``, below) sampled by ``sample_at`` in
float64, the composed field as ``A_f^-1 q(x) - x`` from those points, the network field brought
to the fixed grid in float64, and Dice as one comparison per label.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import affine_3d, isotropic_grid
from hyperreg.method.metrics import dice_per_label, registration_dice
from hyperreg.method.spatial import identity_grid, sample_at
from hyperreg.registration.chain import composed_displacement, sample_volume
from hyperreg.registration.pairs import NetworkGrid


# the float64 reference: every fixed voxel's world point in the moving image, whole grid
def moving_points(
    transform: AffineTransform,
    disp: np.ndarray | None,
    fixed: Volume,
    rows: slice | None = None,
) -> np.ndarray:
    """World RAS points (mm) in the moving image of every fixed voxel: ``M A_f (x + u(x))``.

    Args:
        transform: Fixed-world to moving-world affine (identity for ``--init none``).
        disp: Displacement ``(N, *S)`` in voxels of the fixed grid (i/j/k order), defined on the
            affinely aligned moving image, or None (the affine alone).
        fixed: The fixed grid (``S = fixed.spatial_shape``).
        rows: Optional slice of fixed axis 0 (the points of a slab only).

    Returns:
        ``(3, *S')`` float64 RAS mm, ``S'`` = ``S`` with axis 0 cut to ``rows``.
    """
    shape = fixed.spatial_shape
    rows = rows if rows is not None else slice(0, shape[0])
    axes = [np.arange(shape[0], dtype=np.float64)[rows]] + [
        np.arange(n, dtype=np.float64) for n in shape[1:]
    ]
    voxels = np.stack(np.meshgrid(*axes, indexing="ij"), 0)
    if disp is not None:
        voxels += disp[:, rows].astype(np.float64)
    matrix = transform.matrix @ affine_3d(fixed)
    linear = matrix[:3, : fixed.ndim]
    return np.einsum("rn,n...->r...", linear, voxels) + matrix[:3, 3].reshape(
        (3,) + (1,) * fixed.ndim
    )


def _pair(ndim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    fixed_shape = (21, 18, 16)[:ndim]
    moving_shape = (19, 20, 17)[:ndim]
    fixed_affine = np.eye(4)
    fixed_affine[:3, 3] = (-10.0, -9.0, -8.0)
    moving_affine = np.diag([1.1, 0.9, 1.2, 1.0])
    moving_affine[:3, 3] = (-9.5, -9.2, -9.7)
    if ndim == 2:
        fixed_affine[2, 3] = moving_affine[2, 3] = 0.0
    smooth = rng.random(moving_shape).astype(np.float32)
    for axis in range(ndim):
        smooth = (smooth + np.roll(smooth, 1, axis) + np.roll(smooth, -1, axis)) / 3
    moving = Volume(100 * smooth, moving_affine, moving_shape)
    labels = (smooth * 12).astype(np.int32)
    moving_seg = Volume(labels, moving_affine, moving_shape)
    fixed = Volume(np.zeros(fixed_shape, np.float32), fixed_affine, fixed_shape)
    angle = np.deg2rad(7.0)
    matrix = np.eye(4)
    matrix[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    matrix[:3, 3] = (0.7, -0.4, 0.3) if ndim == 3 else (0.7, -0.4, 0.0)
    disp = (1.5 * rng.standard_normal((ndim, *fixed_shape))).astype(np.float32)
    return moving, moving_seg, fixed, AffineTransform(matrix), disp


def _reference(volume: Volume, transform, disp, fixed: Volume, label: bool, padding="zeros"):
    """The float64 chain: moving points, then ``sample_at`` in float64 (the old path)."""
    world = moving_points(transform, disp, fixed)
    to_voxel = np.linalg.inv(affine_3d(volume))
    voxels = np.einsum("rc,c...->r...", to_voxel[:3, :3], world)
    voxels += to_voxel[:3, 3].reshape((3,) + (1,) * fixed.ndim)
    data = torch.from_numpy(volume.data.astype(np.float64))[None, None]
    points = torch.from_numpy(np.ascontiguousarray(voxels[: volume.ndim]))[None]
    if padding == "zeros" and not label:  # sample_volume's "zeros" is ITK's rule for images
        padding = "itk"
    out = sample_at(data, points, "nearest" if label else "bilinear", padding)[0, 0].numpy()
    return np.rint(out).astype(np.int32) if label else out.astype(np.float32)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_sample_volume_matches_the_float64_chain(ndim, padding):
    moving, moving_seg, fixed, transform, disp = _pair(ndim)
    for field in (None, disp):
        ours = sample_volume(moving, transform, field, fixed, padding=padding).data
        ref = _reference(moving, transform, field, fixed, False, padding)
        assert ours.dtype == np.float32
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-3)  # intensities up to 100
        seg = sample_volume(moving_seg, transform, field, fixed, label=True, padding=padding)
        ref_seg = _reference(moving_seg, transform, field, fixed, True, padding)
        assert seg.data.dtype == np.int32
        np.testing.assert_array_equal(seg.data, ref_seg)


@pytest.mark.parametrize("ndim", [2, 3])
def test_composed_displacement_matches_the_float64_formula(ndim):
    _, _, fixed, transform, disp = _pair(ndim)
    for field in (None, disp):
        world = moving_points(transform, field, fixed)
        affine = affine_3d(fixed)
        offset = world - affine[:3, 3].reshape((3,) + (1,) * ndim)
        voxels = np.einsum("nr,r...->n...", np.linalg.pinv(affine[:3, :ndim]), offset)
        grid = identity_grid(fixed.spatial_shape, dtype=torch.float64)[0].numpy()
        ref = (voxels - grid).astype(np.float32)
        ours = composed_displacement(transform, field, fixed)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)


def test_label_map_outside_and_non_finite_points_take_zero():
    _, moving_seg, fixed, transform, disp = _pair(3)
    far = np.full_like(disp, 1000.0)
    assert not sample_volume(moving_seg, transform, far, fixed, label=True).data.any()
    bad = disp.copy()
    bad[0, 0, 0, 0] = np.nan
    seg = sample_volume(moving_seg, transform, bad, fixed, label=True).data
    assert seg[0, 0, 0] == 0


@pytest.mark.parametrize("ndim", [2, 3])
def test_to_fixed_matches_float64_sampling(ndim):
    _, _, fixed, _, _ = _pair(ndim)
    grid = NetworkGrid(fixed, isotropic_grid(fixed, 2.0))
    rng = np.random.default_rng(3)
    field = torch.from_numpy(
        rng.standard_normal((1, ndim, *grid.grid.spatial_shape)).astype(np.float32)
    )
    ours = grid.to_fixed(field)
    voxel_map = np.linalg.inv(grid.grid.affine) @ fixed.affine
    linear = torch.as_tensor(voxel_map[:ndim, :ndim])
    offset = torch.as_tensor(voxel_map[:ndim, 3]).view((1, -1) + (1,) * ndim)
    points = identity_grid(fixed.spatial_shape, dtype=torch.float64)
    points = torch.einsum("ij,bj...->bi...", linear, points) + offset
    ref = sample_at(field.double(), points, padding="border")
    ref = torch.einsum("ij,bj...->bi...", torch.linalg.inv(linear), ref).float()
    assert ours.dtype == field.dtype and ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


def _dice_loop(a, b, labels, empty):
    out = {}
    for label in labels:
        in_a, in_b = a == label, b == label
        total = int(in_a.sum()) + int(in_b.sum())
        out[int(label)] = empty if total == 0 else 2.0 * int((in_a & in_b).sum()) / total
    return out


@pytest.mark.parametrize("offset", [0, -5, 3_000_000])
def test_dice_counts_match_one_comparison_per_label(offset):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 6, (12, 13, 14)).astype(np.int32)
    b = np.where(rng.random(a.shape) < 0.7, a, rng.integers(0, 6, a.shape)).astype(np.int32)
    a, b = a + offset * (a > 0), b + offset * (b > 0)
    labels = sorted({*np.unique(a).tolist(), *np.unique(b).tolist(), 7 + offset} - {0})
    assert registration_dice(a, b, labels=labels) == _dice_loop(a, b, labels, 0.0)
    ours = dice_per_label(a, b, labels)
    ref = _dice_loop(a, b, labels, float("nan"))
    assert list(ours) == list(ref)
    for label in ref:
        assert ours[label] == ref[label] or (np.isnan(ours[label]) and np.isnan(ref[label]))
    assert registration_dice(a, b) == _dice_loop(
        a, b, sorted({*np.unique(a).tolist(), *np.unique(b).tolist()} - {0}), 0.0
    )


def test_label_ids_match_np_unique():
    from hyperreg.method.metrics import input_labels, labels_in_both

    rng = np.random.default_rng(2)
    a = rng.choice([0, 2, 41, 1000], (9, 10, 11)).astype(np.int16)
    b = rng.choice([0, 2, 17], (9, 10, 11)).astype(np.uint8)
    union = sorted(({*np.unique(a).tolist()} | {*np.unique(b).tolist()}) - {0})
    assert input_labels(a, b) == union == [2, 17, 41, 1000]
    assert labels_in_both(a, b) == [2]
    assert input_labels(a - 5, b) == sorted(({*np.unique(a - 5).tolist()} | {2, 17}) - {0})


def test_result_statistics_match_field_summary():
    from hyperreg.method.metrics import field_summary
    from hyperreg.method.model import RegistrationOutput
    from hyperreg.registration.pairs import result_from_output

    rng = np.random.default_rng(4)
    _, _, fixed, _, _ = _pair(3)
    disp = torch.from_numpy(1.2 * rng.standard_normal((1, 3, *fixed.spatial_shape))).float()
    moved = torch.zeros(1, 1, *fixed.spatial_shape)
    out = RegistrationOutput(moved=moved, disp=disp, velocity=None)
    result = result_from_output(out, 0, 0.3, None, None, [], moving=fixed)
    summary = field_summary(disp)
    assert 0 < summary["folding_fraction"] < 1  # a field that folds somewhere
    assert result.folding_fraction == summary["folding_fraction"]
    assert result.log_jacobian_std == summary["log_jacobian_std"]
