"""TransformChain: applied, composed, written and inverted whole (an affine in the chain)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.ndimage import map_coordinates
from shared_paths import OASIS

from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.io import Volume
from hyperreg.registration.chain import composed_displacement, sample_volume
from hyperreg.registration.transform_chain import TransformChain

SHAPE = (20, 22, 18)


def _at(field: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``field`` ``(N, *S)`` sampled linearly at voxel points ``(N, *T)`` (edge values out)."""
    return np.stack([map_coordinates(c, points, order=1, mode="nearest") for c in field])


def _smooth_chain() -> TransformChain:
    """A rotated, scaled affine between two grids of different spacing and a smooth field."""
    grid = np.stack(np.meshgrid(*(np.arange(n, dtype=np.float64) for n in SHAPE), indexing="ij"))
    disp = np.stack(
        [1.5 * np.sin(2 * np.pi * grid[(a + 1) % 3] / SHAPE[(a + 1) % 3]) for a in range(3)]
    )
    inverse = np.zeros_like(disp)
    for _ in range(40):  # v(y) = -u(y + v(y)), a contraction for this field
        inverse = -_at(disp, grid + inverse)
    fixed_affine = np.diag([1.5, 1.5, 1.5, 1.0])
    fixed_affine[:3, 3] = [-10.0, -12.0, -9.0]
    moving_affine = np.diag([-1.2, 1.4, 1.3, 1.0])
    moving_affine[:3, 3] = [14.0, -13.0, -11.0]
    angle = 0.2
    matrix = np.eye(4)
    matrix[:2, :2] = 1.05 * np.array(
        [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    )
    matrix[:3, 3] = [1.0, -0.5, 0.8]
    fixed = Volume(np.zeros(SHAPE, np.float32), fixed_affine, SHAPE)
    moving = Volume(np.zeros((22, 21, 19), np.float32), moving_affine, (22, 21, 19))
    transform = AffineTransform(matrix, kind="affine")
    return TransformChain(
        transform, disp.astype(np.float32), fixed, moving, inverse.astype(np.float32)
    )


def test_forward_then_inverse_is_identity_through_an_affine() -> None:
    chain = _smooth_chain()
    back = chain.inverse()
    assert back.grid is chain.source and back.source is chain.grid
    assert back.disp is not None and back.disp.shape == (3, *chain.source.spatial_shape)
    # moving voxel m -> (inverse) fixed voxel x -> (forward) moving voxel, which must be m
    moving, fixed = chain.source, chain.grid
    m = np.stack(
        np.meshgrid(*(np.arange(n, dtype=np.float64) for n in moving.spatial_shape), indexing="ij")
    )
    inv = back.displacement().astype(np.float64)  # moving voxels
    to_fixed = np.linalg.inv(fixed.affine) @ moving.affine
    x = np.einsum("rn,n...->r...", to_fixed[:3, :3], m + inv) + to_fixed[:3, 3, None, None, None]
    forward = chain.displacement().astype(np.float64)  # fixed voxels
    to_moving = np.linalg.inv(moving.affine) @ fixed.affine
    y = x + _at(forward, x)
    landed = np.einsum("rn,n...->r...", to_moving[:3, :3], y) + to_moving[:3, 3, None, None, None]
    inside = np.all((x > 1) & (x < np.array(SHAPE)[:, None, None, None] - 2), axis=0)
    assert inside.mean() > 0.3  # the round trip is measured over much of the moving grid
    error = np.linalg.norm(landed - m, axis=0)[inside]
    assert error.mean() < 0.5, error.mean()
    # the same chain without the field inverts its affine alone exactly
    affine_only = TransformChain(chain.affine, None, fixed, moving).inverse()
    assert affine_only.disp is None
    np.testing.assert_allclose(
        affine_only.affine.matrix @ chain.affine.matrix, np.eye(4), atol=1e-12
    )
    assert back.inverse() is chain


def test_apply_displacement_and_write_wrap_the_chain_functions(tmp_path) -> None:
    chain = _smooth_chain()
    rng = np.random.default_rng(0)
    image = Volume(rng.random((22, 21, 19)).astype(np.float32), chain.source.affine, (22, 21, 19))
    expected = sample_volume(image, chain.affine, chain.disp, chain.grid).data
    np.testing.assert_array_equal(chain.apply(image).data, expected)
    labels = Volume(rng.integers(0, 4, (22, 21, 19)).astype(np.int32), image.affine, (22, 21, 19))
    assert chain.apply(labels, label=True).data.dtype == np.int32
    composed = composed_displacement(chain.affine, chain.disp, chain.grid)
    np.testing.assert_array_equal(chain.displacement(), composed)
    for form in ("voxel", "itk"):
        assert chain.write(tmp_path / f"w_{form}.nii.gz", format=form).exists()


def test_inverse_without_an_inverse_field_is_refused() -> None:
    chain = _smooth_chain()
    bare = TransformChain(chain.affine, chain.disp, chain.grid, chain.source)
    with pytest.raises(ValueError, match="no inverse field"):
        bare.inverse()


def _in_plane_turn(volume: Volume, angle: float, shift: float) -> np.ndarray:
    """A world rotation by ``angle`` about the slice's normal through its centre, then a
    ``shift`` mm along its first axis: ``(4, 4)``."""
    axes = volume.affine[:3, :2] / np.linalg.norm(volume.affine[:3, :2], axis=0)
    normal = np.cross(axes[:, 0], axes[:, 1])
    cross = np.array(
        [[0, -normal[2], normal[1]], [normal[2], 0, -normal[0]], [-normal[1], normal[0], 0]]
    )
    rotation = np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * cross @ cross
    centre = volume.affine[:3, :2] @ ((np.array(volume.data.shape) - 1) / 2) + volume.affine[:3, 3]
    turn = np.eye(4)
    turn[:3, :3] = rotation
    turn[:3, 3] = centre - rotation @ centre + shift * axes[:, 0]
    return turn


def _moved_header(volume: Volume, turn: np.ndarray) -> Volume:
    """``volume`` with its voxels placed by ``turn @ affine`` (the data unchanged)."""
    return Volume(volume.data, turn @ volume.affine, volume.disk_shape, None, volume.codes)


REAL = [OASIS / f"OASIS_OAS1_000{i}_MR1" for i in (2, 1)]  # moving, fixed
needs_oasis = pytest.mark.skipif(
    not all((d / "slice_norm.nii.gz").is_file() for d in REAL),
    reason=f"OASIS 2D slices not found under {OASIS} (HYPERREG_DATA)",
)


@needs_oasis
def test_real_2d_pair_round_trip_through_the_affine_stage(tmp_path) -> None:
    """moving -> fixed (forward chain) -> moving (inverse chain): the label maps overlap."""
    from hyperreg import load_pretrained
    from hyperreg.geometry.io import load_volume
    from hyperreg.method.metrics import registration_dice
    from hyperreg.registration.pipeline import load_pair

    model = load_pretrained(ndim=2)
    moving, fixed = (d / "slice_norm.nii.gz" for d in REAL)
    segs = [d / "slice_seg4.nii.gz" for d in REAL]
    # the moving slice's header turned 12° in its plane about its centre and shifted: the
    # affine stage has something to find, so the chain holds an affine
    turn = _in_plane_turn(load_volume(moving), np.deg2rad(12.0), shift=4.0)
    moving_v = _moved_header(load_volume(moving), turn)
    seg_v = _moved_header(load_volume(segs[0], label=True), turn)
    pair = load_pair(moving_v, fixed, model=model, moving_seg=seg_v, fixed_seg=segs[1])
    assert pair.chained and pair.affine is not None  # the affine stage is in the chain
    result = pair.register(model, [0.5], inverse=True)[0]
    assert result.verdict is not None and result.verdict.kept == "registered"
    assert result.inverse_disp is not None
    assert result.inverse_disp.shape == (2, *pair.moving.spatial_shape)
    moved_seg = pair.chain(result).apply(pair.moving_seg, label=True)
    np.testing.assert_array_equal(moved_seg.data, result.moved_seg)  # the result's transform
    identity = AffineTransform.identity()
    back_chain = TransformChain(identity, None, pair.moving, pair.fixed)  # headers only
    inverse = np.asarray(result.inverse_disp)
    # the written inverse (voxel form, moving grid): moving voxel m -> fixed world A_m (m + w)
    field = TransformChain(identity, inverse, pair.moving, pair.fixed)
    round_trip = field.apply(moved_seg, label=True).data
    original = seg_v.data
    dice = registration_dice(round_trip, original, labels=pair.labels)
    mean = float(np.mean(list(dice.values())))
    assert mean > 0.9, dice
    headers_only = back_chain.apply(moved_seg, label=True).data
    without = float(
        np.mean(list(registration_dice(headers_only, original, labels=pair.labels).values()))
    )
    assert mean > without  # the inverse, not the shared grid, brings the labels back
