"""Geometry: resampling through affines, ITK-format fields, and the shared geometry cases.

Known answers on tiny synthetic grids (a linear function of world position is reproduced
exactly by linear resampling; storage flips are undone exactly), the ITK displacement round
trip through SimpleITK (and ANTsPy when installed), then the shared cases c01, c02, c04, c05,
c08, c11 and c12 through the Python API and the CLI, and the done-criterion run (native-space
FreeSurfer ``norm.mgz`` registered to the neurite-oasis grid).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk
import torch

import hyperreg.method.unet
from shared_paths import CASES as CASES_DIR
from shared_paths import DATA
from hyperreg.cli import main
from hyperreg.config import ModelConfig
from hyperreg.apps.register import register_files
from hyperreg.apps.fields import warp_file
from hyperreg.geometry.fields import load_displacement, save_displacement
from hyperreg.geometry.io import Volume, load_volume, same_grid
from hyperreg.method.model import HyperMorph, save_checkpoint
from hyperreg.geometry.resample import describe_grid, resample_to, to_sitk
from hyperreg.method.spatial import warp

CASES = CASES_DIR / "files"
OASIS = DATA / "neurite-oasis"
needs_cases = pytest.mark.skipif(
    not CASES.is_dir(), reason=f"case files not found at {CASES} (HYPERREG_CASES)"
)
needs_data = pytest.mark.skipif(
    not OASIS.is_dir(), reason=f"MRI data not found at {OASIS} (HYPERREG_DATA)"
)

TINY = {"enc_channels": (4, 4, 4, 4), "dec_channels": (4,) * 7, "hyper_hidden": (8, 8)}


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def _rotation(axis: int, degrees: float) -> np.ndarray:
    a = np.deg2rad(degrees)
    c, s = np.cos(a), np.sin(a)
    i, j = [n for n in range(3) if n != axis]
    rot = np.eye(3)
    rot[i, i], rot[i, j], rot[j, i], rot[j, j] = c, -s, s, c
    return rot


def _affine(
    matrix: np.ndarray, spacing: tuple[float, ...], origin: tuple[float, ...]
) -> np.ndarray:
    """float32-exact affine ``[matrix @ diag(spacing) | origin]`` (NIfTI stores float32)."""
    affine = np.eye(4)
    affine[:3, :3] = matrix @ np.diag(spacing)
    affine[:3, 3] = origin
    return affine.astype(np.float32).astype(np.float64)


def _oblique_3d() -> np.ndarray:
    """Rotated about two axes, anisotropic (0.9, 1.2, 2.5) mm: not axis-aligned."""
    return _affine(_rotation(2, -35.0) @ _rotation(0, 20.0), (0.9, 1.2, 2.5), (-8.5, 11.25, -3.0))


def _oblique_2d() -> np.ndarray:
    """In-plane rotation by 30 degrees, anisotropic (0.8, 1.5) mm, slice axis along z."""
    return _affine(_rotation(2, 30.0), (0.8, 1.5, 2.0), (10.0, -20.0, 5.0))


def _world(affine: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """World RAS coordinates ``(3, *shape)`` of every voxel of a grid."""
    grid = np.meshgrid(*[np.arange(s, dtype=np.float64) for s in shape], indexing="ij")
    index = np.stack([*grid] + [np.zeros(shape)] * (3 - len(shape)))
    return np.einsum("rc,c...->r...", affine[:3, :3], index) + affine[:3, 3].reshape(
        3, *([1] * len(shape))
    )


def _linear_image(affine: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A linear function of world position; linear interpolation reproduces it exactly."""
    x, y, z = _world(affine, shape)
    return (0.3 * x - 0.2 * y + 0.1 * z + 50.0).astype(np.float32)


def _smooth(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A smooth image and a smooth, non-trivial displacement (up to 1.5 voxels)."""
    grid = np.meshgrid(*[np.arange(s, dtype=np.float64) for s in shape], indexing="ij")
    image = sum(
        np.sin(2 * np.pi * (n + 1) * g / (3 * s) + n) for n, (g, s) in enumerate(zip(grid, shape))
    )
    ndim = len(shape)
    disp = np.stack(
        [
            1.5 * np.sin(2 * np.pi * grid[(n + 1) % ndim] / shape[(n + 1) % ndim] + n)
            for n in range(ndim)
        ]
    )
    return image.astype(np.float32), disp.astype(np.float32)


def _write(path: Path, data: np.ndarray, affine: np.ndarray) -> Path:
    img = nib.Nifti1Image(data, affine)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    nib.save(img, path)
    return path


@pytest.fixture()
def model_2d(monkeypatch: pytest.MonkeyPatch) -> HyperMorph:
    """A tiny untrained 2D model whose flow layer is scaled up to give ~1-2 voxel fields."""
    monkeypatch.setattr(hyperreg.method.unet, "FLOW_INIT_STD", 0.2)
    torch.manual_seed(0)
    return HyperMorph(ModelConfig(ndim=2, **TINY))


# ------------------------------------------------------------------------------------------
# resample_to on synthetic grids
# ------------------------------------------------------------------------------------------


def test_to_sitk_geometry_is_the_affine_in_lps() -> None:
    affine = _oblique_3d()
    volume = Volume(np.arange(60, dtype=np.float32).reshape(3, 4, 5), affine, (3, 4, 5))
    image = to_sitk(volume)
    assert image.GetSize() == (3, 4, 5)
    for index in [(0, 0, 0), (2, 1, 4), (1, 3, 2)]:
        expected = (affine @ [*index, 1])[:3] * [-1, -1, 1]
        np.testing.assert_allclose(image.TransformIndexToPhysicalPoint(index), expected, atol=1e-9)
        assert image.GetPixel(index) == volume.data[index]


@pytest.mark.parametrize("ndim", [2, 3])
def test_same_grid_resample_is_identity(ndim: int) -> None:
    affine = _oblique_3d() if ndim == 3 else _oblique_2d()
    shape = (6, 7, 5)[:ndim]
    volume = Volume(_smooth(shape)[0], affine, shape)
    np.testing.assert_allclose(resample_to(volume, volume).data, volume.data, atol=1e-5)


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("axis", [0, 1])
def test_flipped_storage_is_undone_exactly(ndim: int, axis: int) -> None:
    affine = _oblique_3d() if ndim == 3 else _oblique_2d()
    shape = (6, 7, 5)[:ndim]
    image, _ = _smooth(shape)
    flip = np.eye(4)
    flip[axis, axis], flip[axis, 3] = -1.0, shape[axis] - 1
    flipped = Volume(np.flip(image, axis).copy(), affine @ flip, shape)
    fixed = Volume(np.zeros(shape, np.float32), affine, shape + (1,) * (3 - ndim))
    out = resample_to(flipped, fixed)
    assert out.data.dtype == np.float32 and out.disk_shape == fixed.disk_shape
    np.testing.assert_array_equal(out.affine, fixed.affine)
    np.testing.assert_allclose(out.data, image, atol=1e-5)
    labels = Volume(np.flip(image > 0, axis).astype(np.int32) * 7, affine @ flip, shape)
    np.testing.assert_array_equal(resample_to(labels, fixed, label=True).data, (image > 0) * 7)


@pytest.mark.parametrize("ndim", [2, 3])
def test_oblique_anisotropic_resampling_follows_world_coordinates(ndim: int) -> None:
    """Moving on a fine axis-aligned grid, fixed oblique and anisotropic (e.g. 1 x 3 mm)."""
    m_shape = (80, 84, 76)[:ndim]
    m_affine = _affine(np.eye(3), (0.5, 0.5, 0.5 if ndim == 3 else 1.0), (-20.0, -21.0, -18.0))
    moving = Volume(_linear_image(m_affine, m_shape), m_affine, m_shape)
    f_shape = (6, 5, 4)[:ndim]
    if ndim == 3:
        f_affine = _oblique_3d()
        f_affine[:3, 3] = (-2.0, 1.0, -3.0)
    else:  # 1 x 3 mm in-plane, rotated, in the moving slice's plane z = -18
        f_affine = _affine(_rotation(2, 30.0), (1.0, 3.0, 1.0), (-4.0, -5.0, -18.0))
    fixed = Volume(np.zeros(f_shape, np.float32), f_affine, f_shape)
    out = resample_to(moving, fixed)
    assert out.spatial_shape == f_shape
    np.testing.assert_allclose(out.data, _linear_image(f_affine, f_shape), atol=1e-3)


def test_labels_keep_their_ids_and_outside_is_zero() -> None:
    rng = np.random.default_rng(0)
    ids = np.array([2, 17, 41, 1000])
    moving = Volume(rng.choice(ids, size=(9, 8, 7)).astype(np.int32), _oblique_3d(), (9, 8, 7))
    fixed = Volume(
        np.zeros((12, 11, 10), np.float32),
        _affine(np.eye(3), (1, 1, 1), (-8, -4, -6)),
        (12, 11, 10),
    )
    out = resample_to(moving, fixed, label=True)
    assert out.data.dtype == np.int32
    assert set(np.unique(out.data)) <= {0, *ids.tolist()} and 0 in out.data
    assert len(set(np.unique(out.data)) - {0}) >= 3


def test_resample_to_rejects_bad_input() -> None:
    fixed3 = Volume(np.zeros((4, 5, 6), np.float32), np.eye(4), (4, 5, 6))
    moving2 = Volume(np.zeros((4, 5), np.float32), np.eye(4), (4, 5, 1))
    with pytest.raises(ValueError, match=r"resample_to\(\): 'moving' and 'fixed' must both be 2D"):
        resample_to(moving2, fixed3)
    with pytest.raises(ValueError, match=r"label map must be integer-typed"):
        resample_to(fixed3, fixed3, label=True)
    other_plane = np.eye(4)
    other_plane[2, 3] = 5.0  # the same in-plane axes, 5 slices away
    with pytest.raises(ValueError, match=r"different world planes"):
        resample_to(Volume(np.zeros((4, 5), np.float32), other_plane, (4, 5)), moving2)
    singular = np.eye(4)
    singular[1, 1] = 0.0
    with pytest.raises(ValueError, match=r"affine .* must be invertible"):
        resample_to(Volume(np.zeros((4, 5, 6), np.float32), singular, (4, 5, 6)), fixed3)


def test_describe_grid() -> None:
    affine = np.diag([-1.0, 3.0, 1.0, 1.0])
    text = describe_grid(Volume(np.zeros((4, 5), np.float32), affine, (4, 5, 1)))
    assert text == "shape (4, 5), spacing (1.0, 3.0), orientation LAS"


# ------------------------------------------------------------------------------------------
# ITK-format displacement fields, applied by SimpleITK (and ANTsPy when installed)
# ------------------------------------------------------------------------------------------


def _itk_case(tmp_path: Path, ndim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Path, Path]:
    shape = (14, 16, 12) if ndim == 3 else (24, 20)
    affine = _oblique_3d() if ndim == 3 else _oblique_2d()
    image, disp = _smooth(shape)
    like = Volume(image, affine, shape)  # 2D stored (I, J): a 2D ITK field
    field = save_displacement(tmp_path / "itk.nii.gz", disp, like, format="itk")
    moving = _write(tmp_path / "moving.nii.gz", image, affine)  # 2D stored as (I, J): 2D for ITK
    expected = warp(torch.from_numpy(image)[None, None], torch.from_numpy(disp)[None])[0, 0]
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"))
    points = grid + disp
    inside = np.all([(points[n] >= 0) & (points[n] <= shape[n] - 1) for n in range(ndim)], axis=0)
    assert inside.mean() > 0.6
    return expected.numpy(), inside, disp, field, moving


@pytest.mark.parametrize("ndim", [2, 3])
def test_itk_field_applied_by_simpleitk_matches_hyperreg_warp(tmp_path: Path, ndim: int) -> None:
    expected, inside, _, field_path, moving_path = _itk_case(tmp_path, ndim)
    header = nib.load(field_path).header
    assert int(header["intent_code"]) == 1007
    assert header.get_data_shape() == ((14, 16, 12, 1, 3) if ndim == 3 else (24, 20, 1, 1, 2))
    field = sitk.ReadImage(str(field_path), sitk.sitkVectorFloat64)
    assert field.GetDimension() == ndim and field.GetNumberOfComponentsPerPixel() == ndim
    transform = sitk.DisplacementFieldTransform(field)
    moving = sitk.ReadImage(str(moving_path), sitk.sitkFloat64)
    assert moving.GetDimension() == ndim
    moved = sitk.Resample(moving, moving, transform, sitk.sitkLinear, 0.0, sitk.sitkFloat64)
    got = sitk.GetArrayFromImage(moved).transpose(*reversed(range(ndim)))
    # same points, both linear interpolation: only float32 storage of the field differs
    np.testing.assert_allclose(got[inside], expected[inside], atol=1e-4)


@pytest.mark.parametrize("ndim", [2, 3])
def test_written_outputs_match_simpleitk_also_at_the_edge_of_the_moving_image(
    tmp_path: Path, ndim: int
) -> None:
    """The outputs' sampling (registration.chain.sample_volume) follows ITK's rule outside the
    moving image: the edge value up to half a voxel beyond it, 0 further out; so every voxel
    matches SimpleITK's resampling, not only those whose points fall inside."""
    from hyperreg.geometry.affine import AffineTransform
    from hyperreg.registration.chain import sample_volume

    _, inside, disp, field_path, moving_path = _itk_case(tmp_path, ndim)
    transform = sitk.DisplacementFieldTransform(
        sitk.ReadImage(str(field_path), sitk.sitkVectorFloat64)
    )
    moving = sitk.ReadImage(str(moving_path), sitk.sitkFloat64)
    moved = sitk.Resample(moving, moving, transform, sitk.sitkLinear, 0.0, sitk.sitkFloat64)
    itk = sitk.GetArrayFromImage(moved).transpose(*reversed(range(ndim)))
    volume = load_volume(moving_path)
    ours = sample_volume(volume, AffineTransform.identity(), disp, volume).data
    assert (~inside).sum() > 50  # many points fall outside the image or in its last voxel
    points = np.stack(np.meshgrid(*[np.arange(n) for n in volume.spatial_shape], indexing="ij"))
    points = points + disp
    edge = [
        np.abs(np.abs(points[n] - (n_ - 1) / 2) - n_ / 2) for n, n_ in enumerate(disp.shape[1:])
    ]
    tie = np.any([e < 1e-3 for e in edge], axis=0)  # exactly half a voxel out: float rounding
    assert tie.mean() < 0.05
    np.testing.assert_allclose(ours[~tie], itk[~tie], atol=1e-3)


@pytest.mark.parametrize("ndim", [2, 3])
def test_itk_field_applied_by_antspy_matches_hyperreg_warp(tmp_path: Path, ndim: int) -> None:
    if importlib.util.find_spec("ants") is None:
        pytest.skip("ANTsPy (antspyx) is not installed; SimpleITK covers the ITK format")
    import ants

    expected, inside, _, field_path, moving_path = _itk_case(tmp_path, ndim)
    moving = ants.image_read(str(moving_path))
    moved = ants.apply_transforms(moving, moving, [str(field_path)], interpolator="linear")
    np.testing.assert_allclose(moved.numpy()[inside], expected[inside], atol=1e-3)


def test_itk_field_round_trips_through_load_displacement(tmp_path: Path) -> None:
    _, _, disp, field_path, _ = _itk_case(tmp_path, 3)
    loaded = load_displacement(field_path)
    assert loaded.format == "itk" and loaded.grid.spatial_shape == (14, 16, 12)
    np.testing.assert_allclose(loaded.disp, disp, atol=1e-5)
    np.testing.assert_allclose(loaded.grid.affine, _oblique_3d(), atol=1e-6)


def test_itk_vectors_are_lps_millimetres(tmp_path: Path) -> None:
    """Known answer: u = (1, 1, 1) voxels, affine diag(-1, 2, 3): RAS (-1, 2, 3), LPS (1, -2, 3)."""
    like = Volume(np.zeros((3, 4, 5), np.float32), np.diag([-1.0, 2.0, 3.0, 1.0]), (3, 4, 5))
    path = save_displacement(tmp_path / "w.nii", np.ones((3, 3, 4, 5)), like, format="itk")
    stored = np.asanyarray(nib.load(path).dataobj)
    assert stored.shape == (3, 4, 5, 1, 3) and stored.dtype == np.float32
    np.testing.assert_array_equal(stored[2, 1, 0, 0], [1.0, -2.0, 3.0])
    like2 = Volume(np.zeros((3, 4), np.float32), np.diag([2.0, -3.0, 1.0, 1.0]), (3, 4))
    path = save_displacement(tmp_path / "w2.nii", np.ones((2, 3, 4)), like2, format="itk")
    stored = np.asanyarray(nib.load(path).dataobj)
    assert stored.shape == (3, 4, 1, 1, 2)
    np.testing.assert_array_equal(stored[1, 2, 0, 0], [-2.0, 3.0])
    # stored (I, J, 1) in the x-y plane: the same 2D field (ANTs's 2D warp)
    like3 = Volume(np.zeros((3, 4), np.float32), np.diag([2.0, -3.0, 1.0, 1.0]), (3, 4, 1))
    path = save_displacement(tmp_path / "w3.nii", np.ones((2, 3, 4)), like3, format="itk")
    stored = np.asanyarray(nib.load(path).dataobj)
    assert stored.shape == (3, 4, 1, 1, 2)
    np.testing.assert_array_equal(stored[1, 2, 0, 0], [-2.0, 3.0])
    # stored (I, J, 1) outside the x-y plane (coronal LIA): a 3D field of one slice, in-plane
    lia = np.array([[-2.0, 0, 0, 0], [0, 0, 1, 0], [0, 3.0, 0, 0], [0, 0, 0, 1]])
    like4 = Volume(np.zeros((3, 4), np.float32), lia, (3, 4, 1))
    path = save_displacement(tmp_path / "w4.nii", np.ones((2, 3, 4)), like4, format="itk")
    stored = np.asanyarray(nib.load(path).dataobj)
    assert stored.shape == (3, 4, 1, 1, 3)
    np.testing.assert_array_equal(stored[1, 2, 0, 0], [2.0, 0.0, 3.0])


@pytest.mark.parametrize("disk_shape", [(24, 20), (24, 20, 1)])
def test_itk_field_of_a_2d_slice_keeps_the_fixed_layout(
    tmp_path: Path, disk_shape: tuple[int, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """A slice stored (I, J) (no third axis) or (I, J, 1): the 2D ITK field (I, J, 1, 1, 2) is
    read back on a grid of that layout, and `hyperreg warp` writes its output in it."""
    image, disp = _smooth(disk_shape[:2])
    fixed = load_volume(_write(tmp_path / "fixed.nii.gz", image.reshape(disk_shape), _oblique_2d()))
    field = save_displacement(tmp_path / "itk.nii.gz", disp, fixed, format="itk")
    assert nib.load(field).shape == (24, 20, 1, 1, 2)
    loaded = load_displacement(field)
    assert loaded.grid.disk_shape == disk_shape and loaded.grid.spatial_shape == (24, 20)
    np.testing.assert_allclose(loaded.disp, disp, atol=1e-5)
    moved = tmp_path / "moved.nii.gz"
    args = ["warp", "--moving", str(fixed.path), "--warp", str(field), "--moved", str(moved)]
    assert main(args) == 0, capsys.readouterr().err
    assert nib.load(moved).shape == disk_shape
    jacobian = tmp_path / "jacobian.nii.gz"
    assert main(["jacobian", "--warp", str(field), "--out", str(jacobian)]) == 0
    assert nib.load(jacobian).shape == disk_shape


def test_antspy_reads_the_itk_field_of_a_one_slice_file_as_a_2d_warp(tmp_path: Path) -> None:
    """A slice in the world x-y plane stored (I, J, 1): ANTs reads its field as a 2D warp (2
    components) and applies it to the slice (as a 2D image) as hyperreg warps."""
    ants = pytest.importorskip("ants")
    shape = (24, 20)
    image, disp = _smooth(shape)
    fixed = load_volume(_write(tmp_path / "fixed.nii.gz", image[..., None], _oblique_2d()))
    field = save_displacement(tmp_path / "itk.nii.gz", disp, fixed, format="itk")
    read = ants.image_read(str(field))
    assert (read.dimension, read.components) == (2, 2)
    # ITK reads an (I, J, 1) file into a 2D image without its direction: ANTs users hold 2D
    # slices as (I, J) files
    moving = ants.image_read(str(_write(tmp_path / "moving.nii.gz", image, _oblique_2d())))
    moved = ants.apply_transforms(moving, moving, [str(field)], interpolator="linear").numpy()
    expected = warp(torch.from_numpy(image)[None, None], torch.from_numpy(disp)[None])[0, 0]
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")) + disp
    inside = np.all([(grid[n] >= 0) & (grid[n] <= shape[n] - 1) for n in range(2)], axis=0)
    np.testing.assert_allclose(moved[inside], expected.numpy()[inside], atol=1e-3)


@pytest.mark.parametrize("fmt", ["voxel", "itk"])
@pytest.mark.parametrize("ndim", [2, 3])
def test_load_displacement_round_trips_both_formats(tmp_path: Path, fmt: str, ndim: int) -> None:
    shape = (5, 6, 4)[:ndim]
    affine = _oblique_3d() if ndim == 3 else _oblique_2d()
    disk_shape = shape + ((1,) if ndim == 2 else ())
    like = Volume(np.zeros(shape, np.float32), affine, disk_shape)
    disp = _smooth(shape)[1]
    loaded = load_displacement(save_displacement(tmp_path / "w.nii.gz", disp, like, format=fmt))
    assert loaded.format == fmt and loaded.grid.spatial_shape == shape
    assert loaded.disp.dtype == np.float32 and loaded.grid.disk_shape == disk_shape
    np.testing.assert_allclose(loaded.disp, disp, atol=1e-5)
    np.testing.assert_allclose(loaded.grid.affine, affine, atol=1e-6)


def test_load_displacement_detects_5d_without_intent(tmp_path: Path) -> None:
    vectors = np.zeros((3, 4, 5, 1, 3), np.float32)
    vectors[..., 0] = -2.0  # LPS x = -2 mm = RAS +2 mm = +1 voxel along i with 2 mm voxels
    path = _write(tmp_path / "w.nii.gz", vectors, np.diag([2.0, 1.0, 1.0, 1.0]))
    loaded = load_displacement(path)
    assert loaded.format == "itk"
    np.testing.assert_allclose(loaded.disp[:, 1, 1, 1], [1.0, 0.0, 0.0])


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((4, 5, 6), "voxel displacement field of shape"),
        ((4, 5, 6, 2), "voxel displacement field of shape"),
        ((4, 5, 6, 2, 3), "ITK vector field of shape"),
    ],
)
def test_load_displacement_rejects_other_arrays(
    tmp_path: Path, shape: tuple[int, ...], match: str
) -> None:
    path = _write(tmp_path / "bad.nii.gz", np.zeros(shape, np.float32), np.eye(4))
    with pytest.raises(
        ValueError, match=rf"load_displacement\(\): '.*bad.nii.gz' must hold an? {match}"
    ):
        load_displacement(path)


def test_load_displacement_rejects_missing_nonfinite_and_truncated(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_displacement(tmp_path / "nope.nii.gz")
    field = np.zeros((4, 5, 6, 3), np.float32)
    field[1, 1, 1, 0] = np.nan
    with pytest.raises(ValueError, match="got 1 non-finite values"):
        load_displacement(_write(tmp_path / "nan.nii.gz", field, np.eye(4)))
    noise = np.random.default_rng(0).random((4, 5, 6, 3)).astype(np.float32)
    good = _write(tmp_path / "good.nii.gz", noise, np.eye(4))
    (tmp_path / "cut.nii.gz").write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated"):
        load_displacement(tmp_path / "cut.nii.gz")


def test_itk_format_rejects_a_2d_grid_outside_the_xy_plane(tmp_path: Path) -> None:
    """A slice stored (I, J) is a 2D image for ITK: its field must be 2D, in the x-y plane."""
    lia = np.array([[-1.0, 0, 0, 80], [0, 0, 1, -112], [0, -1, 0, 96], [0, 0, 0, 1]])
    like = Volume(np.zeros((4, 5), np.float32), lia, (4, 5), path=Path("slice.nii.gz"))
    with pytest.raises(
        ValueError,
        match=r"check_itk_grid\(\): the 2D grid of 'slice.nii.gz' \(orientation LIA, stored",
    ):
        save_displacement(tmp_path / "w.nii.gz", np.zeros((2, 4, 5)), like, format="itk")
    with pytest.raises(ValueError, match=r"'format' must be one of \('voxel', 'itk'\)"):
        save_displacement(tmp_path / "w.nii.gz", np.zeros((2, 4, 5)), like, format="ants")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------
# shared cases through the Python API and the CLI
# ------------------------------------------------------------------------------------------


def _case_path(name: str) -> Path:
    return CASES / name


def _slice(subject: int, name: str = "slice_norm") -> Path:
    return OASIS / f"OASIS_OAS1_000{subject}_MR1" / f"{name}.nii.gz"


def _cli(model: Path, moving: Path, fixed: Path, out: Path, *extra: str) -> list[str]:
    return [
        "register",
        "--model",
        str(model),
        "--moving",
        str(moving),
        "--fixed",
        str(fixed),
        "--lambda",
        "0.5",
        "--moved",
        str(out / "moved.nii.gz"),
        "--warp",
        str(out / "warp.nii.gz"),
        "--init",
        "none",  # world-space resampling as the headers say (the affine stage: test_native)
        "--device",
        "cpu",
        *extra,
    ]


@needs_cases
@needs_data
@pytest.mark.parametrize(
    ("moving", "fixed", "resampled", "shape"),
    [
        pytest.param("c04_other_grid_150x181.nii.gz", None, True, (160, 192), id="c04"),
        pytest.param(
            "c05_moving_150x181.nii.gz", "c05_fixed_150x181.nii.gz", False, (150, 181), id="c05"
        ),
        pytest.param("c08_moving_flipped_storage.nii.gz", None, True, (160, 192), id="c08"),
        pytest.param(None, "c12_fixed_aniso.nii.gz", True, (160, 64), id="c12-fixed"),
        pytest.param("c12_fixed_aniso.nii.gz", None, True, (160, 192), id="c12-moving"),
        pytest.param("c11_moving_uint8.nii.gz", None, False, (160, 192), id="c11"),
        pytest.param(None, "c01_qform_sform_conflict.nii.gz", False, (160, 192), id="c01"),
    ],
)
def test_cases_register_on_the_fixed_grid_via_cli_and_api(
    tmp_path: Path,
    model_2d: HyperMorph,
    capsys: pytest.CaptureFixture[str],
    moving: str | None,
    fixed: str | None,
    resampled: bool,
    shape: tuple[int, int],
) -> None:
    moving_path = CASES / moving if moving else _slice(2)
    fixed_path = CASES / fixed if fixed else _slice(1)
    fixed_v = load_volume(fixed_path)
    model_path = save_checkpoint(model_2d, tmp_path / "model.pt")
    # CLI
    out = tmp_path / "cli"
    assert main(_cli(model_path, moving_path, fixed_path, out)) == 0
    printed = capsys.readouterr().out
    note = f"hyperreg register: resampled moving '{moving_path}'"
    assert (note in printed) == resampled, printed
    if resampled:
        assert f"onto the fixed grid ({describe_grid(fixed_v)})" in printed
    for name in ("moved", "warp"):
        img = nib.load(out / f"{name}.nii.gz")
        assert img.shape[:3] == (*shape, 1)
        np.testing.assert_array_equal(img.affine, fixed_v.affine)  # the fixed affine, exactly
        np.testing.assert_array_equal(img.header.get_sform(), fixed_v.affine)
        np.testing.assert_allclose(img.header.get_qform(), fixed_v.affine, atol=1e-5)
    # Python API
    result = register_files(model_2d, moving_path, fixed_path, 0.5, moved=tmp_path / "api.nii.gz")
    assert bool(result.resampled) == resampled
    assert result.moved.shape == result.disp.shape[1:] == shape
    np.testing.assert_allclose(
        nib.load(tmp_path / "api.nii.gz").get_fdata()[..., 0], result.moved, atol=1e-6
    )
    if resampled:
        # --no-resample: the grids differ, so a one-line error and no outputs
        out = tmp_path / "strict"
        assert main(_cli(model_path, moving_path, fixed_path, out, "--no-resample")) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "are on different grids" in err
        assert moving_path.name in err and not out.exists()
        with pytest.raises(ValueError, match="are on different grids"):
            register_files(model_2d, moving_path, fixed_path, 0.5, resample=False)


@needs_cases
@needs_data
def test_c08_flipped_storage_matches_the_original(model_2d: HyperMorph) -> None:
    original = register_files(model_2d, _slice(2), _slice(1), 0.5)
    flipped = register_files(model_2d, CASES / "c08_moving_flipped_storage.nii.gz", _slice(1), 0.5)
    assert float(np.abs(original.disp).max()) > 0.5  # a non-trivial field
    np.testing.assert_allclose(flipped.moved, original.moved, atol=1e-5)
    np.testing.assert_allclose(flipped.disp, original.disp, atol=1e-4)


@needs_cases
@needs_data
def test_c11_uint8_matches_the_float_original(model_2d: HyperMorph) -> None:
    original = register_files(model_2d, _slice(2), _slice(1), 0.5)
    uint8 = register_files(model_2d, CASES / "c11_moving_uint8.nii.gz", _slice(1), 0.5)
    uint8_input = load_volume(CASES / "c11_moving_uint8.nii.gz").data
    float_input = load_volume(_slice(2)).data
    assert uint8_input.max() == 255
    # moved images are in each input's own units: compare them on the min-max scale the model
    # saw; uint8 quantisation is 1/510 at most
    assert 0.0 <= uint8.moved.min() and uint8.moved.max() <= 255 + 1e-3
    scaled_uint8 = (uint8.moved - uint8_input.min()) / np.ptp(uint8_input)
    scaled_float = (original.moved - float_input.min()) / np.ptp(float_input)
    np.testing.assert_allclose(scaled_uint8, scaled_float, atol=0.02)
    assert float(np.abs(scaled_uint8 - scaled_float).mean()) < 3e-3
    np.testing.assert_allclose(uint8.disp, original.disp, atol=0.05)


@needs_cases
@needs_data
def test_c12_spacing_is_resampled_not_ignored() -> None:
    aniso = load_volume(CASES / "c12_fixed_aniso.nii.gz")
    fine = load_volume(_slice(2))
    assert aniso.spacing == pytest.approx((1.0, 3.0)) and not same_grid(aniso, fine)
    down = resample_to(fine, aniso)  # every third row of the 1 mm slice, as make_cases.py cut it
    np.testing.assert_allclose(down.data, fine.data[:, ::3], atol=1e-6)
    up = resample_to(aniso, fine)  # back to 1 mm: the sampled rows are exact
    np.testing.assert_allclose(up.data[:, ::3][:, :-1], aniso.data[:, :-1], atol=1e-6)


@needs_cases
@needs_data
def test_c02_labels_keep_their_ids_through_register_and_warp(
    tmp_path: Path, model_2d: HyperMorph, capsys: pytest.CaptureFixture[str]
) -> None:
    c02 = CASES / "c02_labels_scaled.nii.gz"
    ids = set(np.unique(load_volume(_slice(2, "slice_seg24"), label=True).data).tolist())
    model_path = save_checkpoint(model_2d, tmp_path / "model.pt")
    out = tmp_path / "cli"
    args = _cli(model_path, _slice(2), _slice(1), out, "--moving-seg", str(c02))
    args += ["--moved-seg", str(out / "moved_seg.nii.gz")]
    assert main(args) == 0
    # the same labels through `hyperreg warp --nearest` with the saved field
    warped = [out / "moved_seg.nii.gz", tmp_path / "warped_seg.nii.gz"]
    field = str(out / "warp.nii.gz")
    assert (
        main(
            ["warp", "--moving", str(c02), "--warp", field, "--moved", str(warped[1]), "--nearest"]
        )
        == 0
    )
    capsys.readouterr()
    for path in warped:
        img = nib.load(path)
        data = np.asanyarray(img.dataobj)
        assert np.issubdtype(data.dtype, np.integer) and img.get_data_dtype().kind in "iu"
        slope, inter = img.header.get_slope_inter()
        assert slope in (None, 1.0) and inter in (None, 0.0)
        assert set(np.unique(data).tolist()) <= ids and len(np.unique(data)) > 10
    np.testing.assert_array_equal(
        np.asanyarray(nib.load(warped[0]).dataobj), np.asanyarray(nib.load(warped[1]).dataobj)
    )
    api = warp_file(c02, out / "warp.nii.gz", tmp_path / "api_seg.nii.gz", nearest=True)
    np.testing.assert_array_equal(api.moved, np.asanyarray(nib.load(warped[0]).dataobj)[..., 0])


# ------------------------------------------------------------------------------------------
# done criterion: native FreeSurfer space onto the neurite-oasis grid (3D)
# ------------------------------------------------------------------------------------------


@needs_data
@pytest.mark.slow  # a whole 256³ registration on real data: CI's slow step
def test_native_mgz_registers_onto_the_neurite_oasis_grid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moving = DATA / "oasis1-freesurfer" / "OAS1_0002_MR1" / "norm.mgz"
    fixed = OASIS / "OASIS_OAS1_0001_MR1" / "aligned_norm.nii.gz"
    if not moving.is_file() or not fixed.is_file():
        pytest.skip(f"{moving} or {fixed} not found")
    torch.manual_seed(0)
    model = save_checkpoint(HyperMorph(ModelConfig(ndim=3, **TINY)), tmp_path / "model3d.pt")
    out = tmp_path / "out"
    args = _cli(model, moving, fixed, out)
    args[args.index("--moved") + 1] = str(out / "moved.nii")  # uncompressed: faster
    args[args.index("--warp") + 1] = str(out / "warp.nii")
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"resampled moving '{moving}' (shape (256, 256, 256)" in printed
    assert (
        "onto the fixed grid (shape (160, 192, 224), spacing (1.0, 1.0, 1.0), orientation LIA)"
        in printed
    )
    fixed_affine = load_volume(fixed).affine
    moved = nib.load(out / "moved.nii")
    assert moved.shape == (160, 192, 224)
    assert nib.load(out / "warp.nii").shape == (160, 192, 224, 3)
    np.testing.assert_array_equal(moved.affine, fixed_affine)
    data = np.asanyarray(moved.dataobj)
    assert np.isfinite(data).all() and data.max() > 0.5  # the brain landed on the fixed grid
