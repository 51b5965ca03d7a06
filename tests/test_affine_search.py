"""The affine stage's global start (issue 35): tilted heads recovered, the same at any thread count.

A synthetic head (an anisotropic ellipsoid with asymmetric inner structures) is defined in world
millimetres; the moving copy sees it rotated about the grid centre, so the true fixed -> moving
world matrix is the rotation itself and every expected answer is known exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import SimpleITK as sitk

import hyperreg.geometry.affine as affine_module
from hyperreg.geometry.affine import register_affine
from hyperreg.geometry.affine_search import looks_turned, search_rotations
from hyperreg.geometry.io import Volume

_SHAPES = [  # centre (mm, RAS), radii (mm), intensity added
    ((0, 0, 0), (52, 68, 48), 0.3),  # the head: long front to back, flat top to bottom
    ((0, 2, 3), (44, 60, 40), 0.3),  # the brain
    ((6, 12, 8), (6, 18, 7), -0.35),  # a dark "ventricle" right of the midline
    ((-18, -30, -8), (10, 12, 8), 0.4),  # bright blobs, none symmetric to another
    ((22, 34, 18), (8, 6, 6), 0.5),
    ((0, -50, 20), (12, 6, 6), 0.25),
]


def _head(world: np.ndarray) -> np.ndarray:
    """World RAS mm ``(3, ...)`` -> intensity, with 2 mm soft edges."""
    out = np.zeros(world.shape[1:])
    for centre, radii, weight in _SHAPES:
        r = np.sqrt(sum(((world[n] - centre[n]) / radii[n]) ** 2 for n in range(3)))
        out += weight / (1 + np.exp(np.clip((r - 1) * min(radii) / 2, -50, 50)))
    return out.astype(np.float32)


def _rotation(pitch: float, roll: float, yaw: float) -> np.ndarray:
    """RAS rotation ``(4, 4)``: about x (left-right) by ``pitch``, then y by ``roll``, then z
    by ``yaw`` (degrees)."""
    out = np.eye(4)
    for axis, degrees in ((0, pitch), (1, roll), (2, yaw)):
        t = math.radians(degrees)
        a, b = [n for n in range(3) if n != axis]
        step = np.eye(4)
        step[a, a], step[a, b], step[b, a], step[b, b] = (
            math.cos(t),
            -math.sin(t),
            math.sin(t),
            math.cos(t),
        )
        out = step @ out
    return out


def _pair(rotation: np.ndarray, ndim: int = 3) -> tuple[Volume, Volume]:
    """(moving, fixed) on the same grid centred on the world origin (48³ of 3.4 mm, or a 64²
    axial slice of 2.6 mm); the moving scanner sees the head turned by ``rotation``."""
    n, mm = (48, 3.4) if ndim == 3 else (64, 2.6)
    shape = (n,) * ndim
    affine = np.diag([mm, mm, mm, 1.0])
    affine[:3, 3] = -(n - 1) / 2 * mm
    if ndim == 2:
        affine[2, 3] = 0.0
    full = shape + (1,) * (3 - ndim)
    voxels = np.stack(np.meshgrid(*[np.arange(k, dtype=np.float64) for k in full], indexing="ij"))
    world = np.einsum("rc,c...->r...", affine[:3, :3], voxels) + affine[:3, 3].reshape(3, 1, 1, 1)
    world = world.reshape((3,) + shape)
    inverse = np.linalg.inv(rotation)[:3, :3]
    disk = shape + ((1,) if ndim == 2 else ())
    fixed = Volume(_head(world), affine, disk)
    moving = Volume(_head(np.einsum("rc,c...->r...", inverse, world)), affine, disk)
    return moving, fixed


def _error_mm(found: np.ndarray, truth: np.ndarray, ndim: int = 3) -> float:
    """Largest distance (mm) between where ``found`` and ``truth`` send a point of the brain's
    bounding box (its 8 corners; a slice: 4)."""
    corners = np.array(np.meshgrid(*[[-44.0, 44.0]] * 3, indexing="ij")).reshape(3, -1)
    if ndim == 2:
        corners = corners[:, corners[2] > 0]
        corners[2] = 0.0
    points = np.vstack([corners, np.ones(corners.shape[1])])
    return float(np.max(np.linalg.norm((found - truth)[:3] @ points, axis=0)))


@pytest.mark.parametrize(
    "angles", [(45.0, 0.0, 0.0), (-60.0, 0.0, 0.0), (-25.0, 10.0, 30.0)], ids=str
)
def test_a_tilted_head_is_recovered(angles: tuple[float, float, float]) -> None:
    truth = _rotation(*angles)
    moving, fixed = _pair(truth)
    before = _error_mm(np.eye(4), truth)
    found = register_affine(moving, fixed, "affine")
    # about one voxel (3.4 mm) at the corners of a 88 mm box, from tens of millimetres
    assert _error_mm(found.matrix, truth) < 4.0 < before / 10, (before, found.matrix)


def test_a_slice_turned_in_plane_is_recovered() -> None:
    truth = _rotation(0.0, 0.0, 60.0)
    moving, fixed = _pair(truth, ndim=2)
    found = register_affine(moving, fixed, "rigid")
    assert _error_mm(found.matrix, truth, 2) < 3.0 < _error_mm(np.eye(4), truth, 2) / 10


def test_the_same_transform_at_one_and_two_threads() -> None:
    moving, fixed = _pair(_rotation(20.0, 15.0, 20.0))
    threads = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()
    found = []
    try:
        for count in (1, 2, 1):
            sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(count)
            found.append(register_affine(moving, fixed, "affine"))
    finally:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(threads)
    for other in found[1:]:
        np.testing.assert_array_equal(other.matrix, found[0].matrix)
        assert other.metric_after == found[0].metric_after


def test_an_aligned_pair_keeps_the_identity_without_a_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    moving, fixed = _pair(np.eye(4))
    noise = np.random.default_rng(0).normal(0, 0.01, fixed.data.shape).astype(np.float32)
    moving = Volume(moving.data + noise, moving.affine, moving.disk_shape)
    searches: list[int] = []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        searches.append(1)
        return search_rotations(*args, **kwargs)

    monkeypatch.setattr(affine_module, "search_rotations", counted)
    found = register_affine(moving, fixed, "affine")
    np.testing.assert_array_equal(found.matrix, np.eye(4))
    assert found.metric_after == found.metric_before and not searches


def _coarse(moving: Volume, fixed: Volume) -> tuple[sitk.Image, sitk.Image, sitk.Transform]:
    """(fixed, moving) as SimpleITK images of 3.4 mm voxels (axes as stored, no LPS flip) and
    an identity Euler transform centred on the grid."""
    images = []
    for volume in (fixed, moving):
        image = sitk.GetImageFromArray(np.ascontiguousarray(volume.data.T))
        image.SetSpacing((3.4,) * 3)
        images.append(image)
    start = sitk.Euler3DTransform()
    start.SetCenter(images[0].TransformContinuousIndexToPhysicalPoint([23.5] * 3))
    return images[0], images[1], start


def test_search_ranks_the_true_orientation_first() -> None:
    truth = _rotation(60.0, 0.0, 0.0)
    found = search_rotations(*_coarse(*_pair(truth)), keep=3)
    assert 1 <= len(found) <= 3
    best = np.array(found[0].GetMatrix()).reshape(3, 3)
    # the images' axes are RAS here (no LPS flip): the search sees the rotation as it is
    cosine = (np.trace(best.T @ truth[:3, :3]) - 1) / 2
    assert math.degrees(math.acos(min(1.0, cosine))) < 20.0  # within the 30° grid's reach


@pytest.mark.parametrize(("angles", "turned"), [((0.0, 0.0, 0.0), False), ((0.0, 25.0, 0.0), True)])
def test_looks_turned_tells_a_rolled_head_from_an_aligned_one(
    angles: tuple[float, float, float], turned: bool
) -> None:
    assert looks_turned(*_coarse(*_pair(_rotation(*angles)))) is turned
