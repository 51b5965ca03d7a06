"""Native-space pairs (issue 14): the affine stage, one-interpolation chains, ITK interop.

A synthetic phantom is defined in world millimetres and sampled on two different grids; the
moving one sees it through a known world affine (rotated, scaled, shifted), so the true
fixed -> moving transform is known. SimpleITK (and ANTsPy when installed) must apply hyperreg's
transform files and composed fields exactly as hyperreg does.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk
import torch

import hyperreg.geometry.affine_frame as affine_frame
from hyperreg.apps.fields import warp_file
from hyperreg.apps.transforms import affine_files, warp_files
from hyperreg.cli import main
from hyperreg.config import ModelConfig
from hyperreg.geometry.affine import (
    AffineTransform,
    load_affine,
    register_affine,
    save_affine,
)
from hyperreg.geometry.fields import save_displacement
from hyperreg.geometry.io import Volume, load_volume
from hyperreg.geometry.resample import resample_to
from hyperreg.method.model import HyperMorph, save_checkpoint
from hyperreg.method.spatial import sample_at, warp
from hyperreg.registration.chain import composed_displacement, sample_volume

LIA = np.array([[-1.0, 0, 0, 0], [0, 0, 1, 0], [0, -1, 0, 0], [0, 0, 0, 1]])


def _rotation(degrees: float, axis: int) -> np.ndarray:
    t = np.deg2rad(degrees)
    c, s = np.cos(t), np.sin(t)
    others = [a for a in range(3) if a != axis]
    r = np.eye(3)
    r[others[0], others[0]], r[others[0], others[1]] = c, -s
    r[others[1], others[0]], r[others[1], others[1]] = s, c
    return r


def _phantom(world: np.ndarray) -> np.ndarray:
    """A head-like phantom, world RAS mm ``(3, ...)`` -> intensity: nested and off-centre
    ellipsoids of constant intensity with 1 mm soft edges (tissue-like, edges for MI)."""
    shapes = [  # centre (mm), radii (mm), intensity added
        ((0, 0, 0), (23, 21, 20), 0.3),
        ((1, 1, 0), (17, 15, 14), 0.4),
        ((6, 4, -2), (5, 3, 4), 0.5),
        ((-6, 5, 3), (3, 5, 3), -0.3),
        ((2, -7, 4), (4, 3, 2.5), 0.6),
    ]
    out = np.zeros(world.shape[1:])
    for centre, radii, weight in shapes:
        r = np.sqrt(sum(((world[n] - centre[n]) / radii[n]) ** 2 for n in range(3)))
        out += weight / (1 + np.exp(np.clip((r - 1) * min(radii), -50, 50)))
    return out.astype(np.float32)


def _grid_world(affine: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    full = shape + (1,) * (3 - len(shape))
    voxels = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float64) for n in full], indexing="ij"))
    world = np.einsum("rc,c...->r...", affine[:3, :3], voxels) + affine[:3, 3].reshape(3, 1, 1, 1)
    return world.reshape((3,) + shape)


def _truth(ndim: int) -> np.ndarray:
    """World map R applied to the moving scanner: moving voxel sees phantom(R @ world)."""
    r = np.eye(4)
    if ndim == 3:
        r[:3, :3] = 1.1 * _rotation(10, 2) @ _rotation(-6, 0)
        r[:3, 3] = [2.5, -3.0, 1.5]
    else:  # in the coronal (x-z) plane of the LIA slices; the normal (y) is left alone
        r[:3, :3] = np.diag([1.1, 1.0, 1.1]) @ _rotation(12, 1)
        r[:3, 3] = [3.0, 0.0, -2.0]
    return r


def _pair(tmp_path: Path, ndim: int) -> tuple[Volume, Volume, np.ndarray]:
    """(moving, fixed, true fixed->moving world matrix), written to tmp_path too."""
    r = _truth(ndim)
    if ndim == 3:
        fixed_affine = np.diag([1.6, 1.6, 1.6, 1.0])
        fixed_affine[:3, 3] = -16 * 1.6
        shape_f = (32, 32, 32)
        moving_affine = LIA @ np.diag([1.8, 1.7, 1.9, 1.0])
        moving_affine[:3, 3] = [27.0, -27.0, 25.0]
        shape_m = (30, 32, 28)
        disk_f, disk_m = shape_f, shape_m
    else:
        fixed_affine = LIA @ np.diag([1.0, 1.0, 1.0, 1.0])
        fixed_affine[:3, 3] = [24.0, 2.0, 24.0]
        shape_f = (48, 48)
        moving_affine = LIA @ np.diag([1.2, 1.1, 1.0, 1.0])
        moving_affine[:3, 3] = [26.0, 2.0, 25.0]
        shape_m = (44, 46)
        disk_f, disk_m = shape_f + (1,), shape_m + (1,)
    fixed_data = _phantom(_grid_world(fixed_affine, shape_f))
    world_m = _grid_world(moving_affine, shape_m)
    seen = np.einsum("rc,c...->r...", r[:3, :3], world_m) + r[:3, 3].reshape((3,) + (1,) * ndim)
    moving_data = _phantom(seen)
    fixed = _save(tmp_path / "fixed.nii.gz", fixed_data, fixed_affine, disk_f)
    moving = _save(tmp_path / "moving.nii.gz", moving_data, moving_affine, disk_m)
    # moving point q sees phantom(R q); the fixed point p sees phantom(p): q = R^-1 p
    return moving, fixed, np.linalg.inv(r)


def _save(path: Path, data: np.ndarray, affine: np.ndarray, disk: tuple[int, ...]) -> Volume:
    nib.save(nib.Nifti1Image(data.reshape(disk), affine), path)
    return load_volume(path)


def _sitk_moved(moving: Path, fixed: Path, transform: sitk.Transform) -> np.ndarray:
    m = sitk.ReadImage(str(moving), sitk.sitkFloat64)
    f = sitk.ReadImage(str(fixed), sitk.sitkFloat64)
    out = sitk.Resample(m, f, transform, sitk.sitkLinear, 0.0, sitk.sitkFloat64)
    return sitk.GetArrayFromImage(out).transpose(2, 1, 0)


def _inside(moving: Volume, fixed: Volume, matrix: np.ndarray, margin: float = 1.0) -> np.ndarray:
    """Fixed voxels whose moving point lies at least ``margin`` voxels inside the moving grid."""
    world = _grid_world(matrix @ fixed.affine, fixed.spatial_shape)
    inv = np.linalg.inv(moving.affine)
    vox = np.einsum("rc,c...->r...", inv[:3, :3], world) + inv[:3, 3].reshape(
        (3,) + (1,) * fixed.ndim
    )
    shape = moving.spatial_shape
    ok = [(vox[n] >= margin) & (vox[n] <= shape[n] - 1 - margin) for n in range(moving.ndim)]
    return np.all(ok, axis=0)


# --- the affine stage ---------------------------------------------------------------------


@pytest.mark.parametrize("ndim", [2, 3])
def test_affine_stage_recovers_a_rotated_scaled_shifted_pair(tmp_path: Path, ndim: int) -> None:
    moving, fixed, truth = _pair(tmp_path, ndim)
    found = register_affine(moving, fixed, "affine")
    assert found.metric_after < found.metric_before
    # linear part within a few percent, translation within a voxel
    np.testing.assert_allclose(found.matrix[:3, :3], truth[:3, :3], atol=0.05)
    centre = fixed.affine @ np.array([*(np.array(fixed.spatial_shape) / 2), *[0] * (3 - ndim), 1])
    np.testing.assert_allclose(found.matrix @ centre, truth @ centre, atol=1.5)


@pytest.mark.parametrize("ndim", [2, 3])
def test_already_aligned_pair_gets_an_affine_near_identity(tmp_path: Path, ndim: int) -> None:
    _, fixed, _ = _pair(tmp_path, ndim)
    noise = np.random.default_rng(0).normal(0, 0.01, fixed.data.shape).astype(np.float32)
    moving = Volume(fixed.data + noise, fixed.affine, fixed.disk_shape)
    found = register_affine(moving, fixed, "affine")
    np.testing.assert_allclose(found.matrix[:3, :3], np.eye(3), atol=0.01)
    np.testing.assert_allclose(found.matrix[:3, 3], 0.0, atol=0.3)


# --- SimpleITK / ANTsPy apply hyperreg's transform as hyperreg does -------------------------


@pytest.mark.parametrize("suffix", [".mat", ".tfm"])
@pytest.mark.parametrize("ndim", [2, 3])
def test_simpleitk_applies_the_affine_file_like_hyperreg(
    tmp_path: Path, ndim: int, suffix: str
) -> None:
    moving, fixed, truth = _pair(tmp_path, ndim)
    path = save_affine(tmp_path / f"a{suffix}", AffineTransform(truth, "affine"))
    np.testing.assert_allclose(load_affine(path).matrix, truth, atol=1e-6)
    ours = sample_volume(moving, load_affine(path), None, fixed).data
    theirs = _sitk_moved(moving.path, fixed.path, sitk.ReadTransform(str(path)))
    inside = _inside(moving, fixed, truth)
    assert inside.mean() > 0.3
    np.testing.assert_allclose(theirs.reshape(ours.shape)[inside], ours[inside], atol=1e-4)
    # and the moved image matches the phantom seen on the fixed grid (interpolation error only,
    # largest at the 1 mm soft edges)
    assert np.mean(np.abs(ours[inside] - fixed.data[inside])) < 0.01


@pytest.mark.parametrize("ndim", [2, 3])
def test_antspy_applies_the_affine_file_like_hyperreg(tmp_path: Path, ndim: int) -> None:
    if importlib.util.find_spec("ants") is None:
        pytest.skip("ANTsPy (antspyx) is not installed; SimpleITK covers the ITK file")
    import ants

    moving, fixed, truth = _pair(tmp_path, ndim)
    path = save_affine(tmp_path / "a.mat", AffineTransform(truth, "affine"))
    ours = sample_volume(moving, AffineTransform(truth), None, fixed).data
    f = ants.image_read(str(fixed.path))
    m = ants.image_read(str(moving.path))
    theirs = ants.apply_transforms(f, m, [str(path)], interpolator="linear").numpy()
    inside = _inside(moving, fixed, truth)
    np.testing.assert_allclose(theirs.reshape(ours.shape)[inside], ours[inside], atol=1e-3)


def _smooth_field(shape: tuple[int, ...]) -> np.ndarray:
    grids = np.meshgrid(*[np.linspace(0, np.pi, n) for n in shape], indexing="ij")
    return np.stack([1.5 * np.sin(g + n) for n, g in enumerate(grids)]).astype(np.float32)


@pytest.mark.parametrize("ndim", [2, 3])
def test_composed_field_equals_affine_then_field(tmp_path: Path, ndim: int) -> None:
    moving, fixed, truth = _pair(tmp_path, ndim)
    transform = AffineTransform(truth, "affine")
    disp = _smooth_field(fixed.spatial_shape)
    composed = composed_displacement(transform, disp, fixed)
    # two steps: the affine onto the fixed grid, then the field (two interpolations)
    aligned = sample_volume(moving, transform, None, fixed).data
    two_steps = warp(torch.from_numpy(aligned)[None, None].double(), torch.from_numpy(disp)[None])
    one_step = sample_volume(moving, transform, disp, fixed).data
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in fixed.spatial_shape], indexing="ij"))
    points = grid + disp
    inner = np.all([(p >= 1) & (p <= n - 2) for p, n in zip(points, fixed.spatial_shape)], 0)
    inside = inner & _inside(moving, fixed, truth, margin=3.0)
    assert inside.mean() > 0.2
    gap = np.abs(one_step[inside] - two_steps[0, 0].numpy()[inside])  # one interpolation less
    assert gap.mean() < 0.005 and gap.max() < 0.1
    # the composed field alone, and the saved chain (affine file + field), give the same image
    files = {}
    for fmt in ("voxel", "itk"):
        files[fmt] = save_displacement(tmp_path / f"w_{fmt}.nii.gz", composed, fixed, format=fmt)
    save_displacement(tmp_path / "field.nii.gz", disp, fixed)
    save_affine(tmp_path / "a.mat", transform)
    outs = [tmp_path / f"o{n}.nii.gz" for n in range(3)]
    warp_files([moving.path], [outs[0]], warp_field=files["voxel"])
    warp_files([moving.path], [outs[1]], warp_field=files["itk"])
    warp_files(
        [moving.path], [outs[2]], warp_field=tmp_path / "field.nii.gz", affine=tmp_path / "a.mat"
    )
    got = [load_volume(p).data for p in outs]
    np.testing.assert_allclose(got[0], one_step, atol=1e-4)
    np.testing.assert_allclose(got[1], one_step, atol=1e-3)
    np.testing.assert_allclose(got[2], one_step, atol=1e-4)
    # SimpleITK applies the composed ITK field (a 2D slice: a 3D field of one slice) in one step
    if ndim == 3:
        field = sitk.ReadImage(str(files["itk"]), sitk.sitkVectorFloat64)
    else:  # SimpleITK's NIfTI reader makes a one-slice vector file 2D; ANTs reads it as 3D
        vectors = np.asanyarray(nib.load(files["itk"]).dataobj)[:, :, :, 0].astype(np.float64)
        field = sitk.GetImageFromArray(vectors.transpose(2, 1, 0, 3), isVector=True)
        field.CopyInformation(sitk.ReadImage(str(fixed.path)))
    assert field.GetDimension() == 3
    theirs = _sitk_moved(moving.path, fixed.path, sitk.DisplacementFieldTransform(field))
    np.testing.assert_allclose(theirs.reshape(one_step.shape)[inside], one_step[inside], atol=2e-3)
    # ANTs reads the file itself in 3D; ITK's NIfTI reader makes a one-slice vector file 2D, so
    # ANTs does not take the 2D slice's field as a 3D one (a known limit, see fields.py)
    if ndim == 3 and importlib.util.find_spec("ants") is not None:
        import ants

        f = ants.image_read(str(fixed.path), dimension=3)
        m = ants.image_read(str(moving.path), dimension=3)
        moved = ants.apply_transforms(f, m, [str(files["itk"])], interpolator="linear").numpy()
        np.testing.assert_allclose(
            moved.reshape(one_step.shape)[inside], one_step[inside], atol=2e-3
        )


def test_sample_at_takes_points_on_another_grid() -> None:
    image = torch.arange(20.0).reshape(1, 1, 4, 5)
    points = torch.tensor([[[[1.0, 3.0]], [[2.0, 4.0]]]])  # (1, 2, 1, 2): (1, 2) and (3, 4)
    out = sample_at(image, points)
    torch.testing.assert_close(out, torch.tensor([[[[7.0, 19.0]]]]))
    outside = sample_at(image, torch.full((1, 2, 1, 1), 10.0))
    assert float(outside) == 0.0
    with pytest.raises(ValueError, match=r"sample_at\(\): 'points' must have shape"):
        sample_at(image, torch.zeros(1, 3, 2, 2))


# --- files and the command line ------------------------------------------------------------


@pytest.fixture()
def model_2d(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    config = ModelConfig(
        ndim=2, enc_channels=(4, 4), dec_channels=(4, 4, 4), hyper_hidden=(8,), int_steps=3
    )
    return save_checkpoint(HyperMorph(config), tmp_path / "model.pt")


def test_register_init_affine_writes_the_chain(tmp_path: Path, model_2d: Path) -> None:
    moving, fixed, truth = _pair(tmp_path, 2)
    out = tmp_path / "out"
    args = ["register", "--model", str(model_2d), "--moving", str(moving.path)]
    args += ["--fixed", str(fixed.path), "--lambda", "0.5", "--device", "cpu"]
    args += ["--moved", str(out / "moved.nii.gz"), "--warp", str(out / "warp.nii.gz")]
    args += ["--affine-out", str(out / "a.mat"), "--field-out", str(out / "field.nii.gz")]
    assert main(args) == 0
    found = load_affine(out / "a.mat")
    np.testing.assert_allclose(found.matrix[:3, :3], truth[:3, :3], atol=0.05)
    # hyperreg warp with the composed field, or with affine + field, gives the registered image
    moved = load_volume(out / "moved.nii.gz").data
    one = ["warp", "--moving", str(moving.path), str(moving.path), "--warp"]
    assert (
        main([*one, str(out / "warp.nii.gz"), "--moved", *(str(out / f"{n}.nii.gz") for n in "ab")])
        == 0
    )
    two = ["warp", "--moving", str(moving.path), "--affine", str(out / "a.mat"), "--warp"]
    assert main([*two, str(out / "field.nii.gz"), "--moved", str(out / "c.nii.gz")]) == 0
    for name in ("a", "b", "c"):
        np.testing.assert_allclose(load_volume(out / f"{name}.nii.gz").data, moved, atol=1e-4)


def test_warp_of_the_register_warp_reproduces_moved_at_the_edges(
    tmp_path: Path, model_2d: Path
) -> None:
    """A moving image on the fixed grid that needs an affine: register samples the chain with 0
    outside the moving image (ITK/ANTs); `hyperreg warp` with the composed warp must too."""
    _, fixed, truth = _pair(tmp_path, 2)
    seen = _grid_world(np.linalg.inv(truth) @ fixed.affine, fixed.spatial_shape)
    background = 0.2  # a non-zero edge, so that edge-value padding would differ from zeros
    moving = _save(
        tmp_path / "on_grid.nii.gz", _phantom(seen) + background, fixed.affine, (48, 48, 1)
    )
    out = tmp_path / "out"
    args = ["register", "--model", str(model_2d), "--moving", str(moving.path)]
    args += ["--fixed", str(fixed.path), "--lambda", "0.5", "--device", "cpu"]
    args += ["--moved", str(out / "moved.nii.gz"), "--warp", str(out / "warp.nii.gz")]
    assert main(args) == 0
    moved = load_volume(out / "moved.nii.gz").data
    assert (moved < background / 2).mean() > 0.01  # fixed voxels whose point leaves the image
    args = ["warp", "--moving", str(moving.path), "--warp", str(out / "warp.nii.gz")]
    assert main([*args, "--moved", str(out / "warped.nii.gz")]) == 0
    np.testing.assert_allclose(load_volume(out / "warped.nii.gz").data, moved, atol=1e-4)


def test_warp_file_samples_a_moving_image_on_another_grid_once(tmp_path: Path) -> None:
    """The field's points are taken straight to the moving file's own grid: one interpolation,
    not a resampling onto the field's grid followed by a warp."""
    moving, fixed, _ = _pair(tmp_path, 2)  # other spacing, shape and origin, the same plane
    disp = _smooth_field(fixed.spatial_shape)
    field = save_displacement(tmp_path / "w.nii.gz", disp, fixed)
    result = warp_file(moving.path, field, tmp_path / "moved.nii.gz")
    assert result.resampled is not None and "once" in result.resampled
    # direct: fixed voxel x + u(x) -> world (fixed affine) -> moving voxel, one bilinear sample
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in fixed.spatial_shape], indexing="ij"))
    voxels = np.concatenate([grid + disp, np.zeros((1, *fixed.spatial_shape))])
    matrix = np.linalg.inv(moving.affine) @ fixed.affine
    points = np.einsum("rc,c...->r...", matrix[:2, :3], voxels) + matrix[:2, 3, None, None]
    image = torch.from_numpy(moving.data.astype(np.float64))[None, None]
    direct = sample_at(image, torch.from_numpy(points)[None])[0, 0].numpy()
    np.testing.assert_allclose(result.moved, direct, atol=1e-5)
    # a second interpolation (onto the fixed grid first, then the warp) differs measurably
    aligned = torch.from_numpy(resample_to(moving, fixed).data.astype(np.float64))[None, None]
    two_steps = warp(aligned, torch.from_numpy(disp.astype(np.float64))[None])[0, 0].numpy()
    assert np.abs(two_steps - direct).max() > 1e-3


def test_affine_command_and_warp_of_labels(tmp_path: Path) -> None:
    moving, fixed, _ = _pair(tmp_path, 3)
    seg = (moving.data > 1.0).astype(np.int16) + (moving.data > 1.4)
    nib.save(nib.Nifti1Image(seg, moving.affine), tmp_path / "seg.nii.gz")
    fseg = (fixed.data > 1.0).astype(np.int16) + (fixed.data > 1.4)
    nib.save(nib.Nifti1Image(fseg, fixed.affine), tmp_path / "fseg.nii.gz")
    none = affine_files(
        moving.path,
        fixed.path,
        init="none",
        moving_seg=tmp_path / "seg.nii.gz",
        fixed_seg=tmp_path / "fseg.nii.gz",
    )
    out = tmp_path / "out"
    args = ["affine", "--moving", str(moving.path), "--fixed", str(fixed.path)]
    args += [
        "--moving-seg",
        str(tmp_path / "seg.nii.gz"),
        "--fixed-seg",
        str(tmp_path / "fseg.nii.gz"),
    ]
    args += ["--moved", str(out / "m.nii.gz"), "--affine-out", str(out / "a.tfm")]
    args += ["--moved-seg", str(out / "s.nii.gz")]
    assert main(args) == 0
    result = affine_files(
        moving.path,
        fixed.path,
        moving_seg=tmp_path / "seg.nii.gz",
        fixed_seg=tmp_path / "fseg.nii.gz",
    )
    assert result.mean_dice > none.mean_dice + 0.1
    # one call warps an image and a label map; the label map stays integer ids
    warp_args = ["warp", "--affine", str(out / "a.tfm"), "--fixed", str(fixed.path), "--moving"]
    warp_args += [str(moving.path), str(tmp_path / "seg.nii.gz"), "--labels"]
    warp_args += [str(tmp_path / "seg.nii.gz"), "--moved", str(out / "i.nii.gz")]
    assert main([*warp_args, str(out / "l.nii.gz")]) == 0
    labels = np.asanyarray(nib.load(out / "l.nii.gz").dataobj)
    assert labels.dtype.kind in "iu" and set(np.unique(labels)) <= {0, 1, 2}
    np.testing.assert_array_equal(labels, np.asanyarray(nib.load(out / "s.nii.gz").dataobj))
    np.testing.assert_allclose(
        load_volume(out / "i.nii.gz").data, load_volume(out / "m.nii.gz").data
    )


def test_outputs_keep_the_fixed_header_codes(tmp_path: Path) -> None:
    moving, fixed, _ = _pair(tmp_path, 2)
    img = nib.load(fixed.path)
    img.set_sform(img.affine, code=2)
    img.set_qform(None, code=0)
    nib.save(img, tmp_path / "f2.nii.gz")
    affine_files(moving.path, tmp_path / "f2.nii.gz", moved=tmp_path / "m.nii.gz")
    header = nib.load(tmp_path / "m.nii.gz").header
    assert (int(header["sform_code"]), int(header["qform_code"])) == (2, 0)


# --- bad input: one line, exit 2, nothing written -------------------------------------------


def _affine_cli(moving: Path, fixed: Path, out: Path) -> list[str]:
    args = ["affine", "--moving", str(moving), "--fixed", str(fixed)]
    return [*args, "--moved", str(out / "m.nii.gz"), "--affine-out", str(out / "a.mat")]


def test_bad_inputs_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    moving, fixed, _ = _pair(tmp_path, 3)
    out = tmp_path / "out"
    nib.save(nib.Nifti1Image(np.ones((8, 9, 1), np.float32), np.eye(4)), tmp_path / "s2.nii.gz")
    (tmp_path / "bad.tfm").write_text("#Insight Transform File V1.0\nnot a transform\n")
    cases = [
        (_affine_cli(tmp_path / "s2.nii.gz", fixed.path, out), "both must be 2D or both 3D"),
        (
            ["warp", "--moving", str(moving.path), "--affine", str(tmp_path / "bad.tfm")]
            + ["--fixed", str(fixed.path), "--moved", str(out / "w.nii.gz")],
            "is not an affine transform file",
        ),
        (
            ["warp", "--moving", str(moving.path), "--affine", str(fixed.path)]
            + ["--fixed", str(fixed.path), "--moved", str(out / "w.nii.gz")],
            "is not an affine transform file",
        ),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args, expected in cases:
            assert main(args) == 2, args
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and expected in err, err
    # a diverging stage (degenerate matrix) is caught before anything is written
    monkeypatch.setattr(affine_frame, "lift_lps", lambda transform: np.diag([9.0, 1, 1, 1]))
    assert main(_affine_cli(moving.path, fixed.path, out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the affine stage diverged" in err
    assert not out.exists()


def test_sweep_tune_and_batch_take_init(tmp_path: Path, model_2d: Path) -> None:
    """The affine stage runs once per pair; the λ work then sees the aligned pair."""
    moving, fixed, _ = _pair(tmp_path, 2)
    for volume, name in ((moving, "mseg"), (fixed, "fseg")):
        seg = (volume.data > 0.35).astype(np.int16) + (volume.data > 0.65)
        nib.save(
            nib.Nifti1Image(seg.reshape(volume.disk_shape), volume.affine),
            tmp_path / f"{name}.nii.gz",
        )
    csv = tmp_path / "pairs.csv"
    csv.write_text(
        "moving,fixed,moving_seg,fixed_seg\nmoving.nii.gz,fixed.nii.gz,mseg.nii.gz,fseg.nii.gz\n"
    )
    common = ["--model", str(model_2d), "--device", "cpu"]
    sweep = ["sweep", *common, "--moving", str(moving.path), "--fixed", str(fixed.path)]
    sweep += [
        "--moving-seg",
        str(tmp_path / "mseg.nii.gz"),
        "--fixed-seg",
        str(tmp_path / "fseg.nii.gz"),
    ]
    dice = {}
    for init in ("none", "affine"):
        assert (
            main([*sweep, "--lambdas", "0.5,1", "--init", init, "--out", str(tmp_path / init)]) == 0
        )
        rows = (tmp_path / init / "sweep.csv").read_text().splitlines()
        dice[init] = float(rows[-1].split(",")[1])  # λ = 1: (nearly) no deformation
    assert dice["affine"] > dice["none"] + 0.1
    tune = ["tune", *common, "--pairs", str(csv), "--lambdas", "0,1", "--refine-rounds", "0"]
    assert main([*tune, "--out", str(tmp_path / "tune")]) == 0
    # tune scores the chain as sweep and register write it (one interpolation), same Dice
    import json

    grid = json.loads((tmp_path / "tune" / "tune.json").read_text())["grid"]
    at_one = next(row for row in grid if row["lambda"] == 1.0)
    assert at_one["mean_dice"] == pytest.approx(dice["affine"], abs=2e-6)
    batch = ["batch", *common, "--pairs", str(csv), "--lambda", "0.5", "--no-progress"]
    assert main([*batch, "--out", str(tmp_path / "batch")]) == 0
    folder = tmp_path / "batch" / "pairs"
    (pair,) = list(folder.iterdir())
    assert (pair / "affine.mat").is_file() and load_affine(pair / "affine.mat").kind == "affine"


def test_affine_of_slices_in_different_planes_is_a_clear_error() -> None:
    """An axial 2D slice against a coronal one: one line naming the file, no ITK exception."""
    from hyperreg.geometry.affine import register_affine
    from hyperreg.geometry.io import Volume

    grid = np.meshgrid(np.arange(32.0), np.arange(40.0), indexing="ij")
    image = np.exp(-((grid[0] - 15) ** 2 + (grid[1] - 19) ** 2) / 50.0).astype(np.float32)
    axial = Volume(image, np.eye(4), (32, 40, 1))
    coronal_affine = np.array([[-1.0, 0, 0, 16], [0, 0, 1, 10], [0, -1, 0, 20], [0, 0, 0, 1]])
    coronal = Volume(image, coronal_affine, (32, 40, 1))
    with pytest.raises(ValueError, match=r"different world planes \(90° apart"):
        register_affine(axial, coronal, "affine")


def test_warp_count_mismatch_names_only_what_was_given(tmp_path: Path) -> None:
    """Two moving files and one moved: the message says so and invents no --nearest flags."""
    paths = [tmp_path / f"{n}.nii.gz" for n in "ab"]
    with pytest.raises(ValueError, match=r"got 2 and 1$"):
        warp_files(
            paths,
            [tmp_path / "out.nii.gz"],
            warp_field=tmp_path / "w.nii.gz",
            nearest=[False, False],
        )


def test_tune_dice_under_the_affine_stage_is_registers(tmp_path: Path) -> None:
    """Real pair (Mindboggle 9 -> 3): tune's Dice at a λ is that of the label map register
    writes (sampled once through affine and field), not of the aligned map warped again."""
    import json

    from shared_paths import DATA

    from hyperreg.method.metrics import registration_dice

    root = DATA / "mindboggle-trt20-2d"
    if not root.is_dir():
        pytest.skip(f"shared data not found at {root} (set HYPERREG_DATA)")
    files = {}
    for role, person in (("moving", "OASIS-TRT-20-9"), ("fixed", "OASIS-TRT-20-3")):
        files[role] = root / person / f"{person}_slice118.nii.gz"
        files[f"{role}_seg"] = root / person / f"{person}_DKT31_CMA_labels_slice118.nii.gz"
    csv = tmp_path / "pairs.csv"
    csv.write_text(
        "moving,fixed,moving_seg,fixed_seg\n"
        + ",".join(str(files[k]) for k in ("moving", "fixed", "moving_seg", "fixed_seg"))
        + "\n"
    )
    common = ["--device", "cpu"]
    tune = ["tune", *common, "--pairs", str(csv), "--lambdas", "0.1,0.9", "--refine-rounds", "0"]
    assert main([*tune, "--out", str(tmp_path / "tune")]) == 0
    grid = json.loads((tmp_path / "tune" / "tune.json").read_text())["grid"]
    reg = ["register", *common, "--moving", str(files["moving"]), "--fixed", str(files["fixed"])]
    reg += ["--moving-seg", str(files["moving_seg"]), "--lambda", "0.1"]
    reg += ["--moved-seg", str(tmp_path / "moved_seg.nii.gz")]
    assert main(reg) == 0
    moved = np.asanyarray(nib.load(tmp_path / "moved_seg.nii.gz").dataobj).squeeze()
    moving_seg, fixed_seg = (
        np.rint(nib.load(files[k]).get_fdata()).astype(np.int32).squeeze()
        for k in ("moving_seg", "fixed_seg")
    )
    # hyperreg's one convention: labels of the inputs, an erased label counts 0
    expected = float(np.mean(list(registration_dice(moved, fixed_seg, moving_seg).values())))
    at = next(row for row in grid if abs(row["lambda"] - 0.1) < 1e-6)
    assert at["mean_dice"] == pytest.approx(expected, abs=1e-4)


def test_x_y_plane_2d_affine_is_written_as_a_2d_itk_transform(tmp_path: Path) -> None:
    """A 2D registration of x-y plane slices is saved as AffineTransform_double_2_2, which
    SimpleITK (and ANTs) apply to 2D images as hyperreg does; it reads back as the same map."""
    grid = np.meshgrid(np.arange(48.0), np.arange(44.0), indexing="ij")
    blob = np.exp(-((grid[0] - 22) ** 2 / 60 + (grid[1] - 20) ** 2 / 30)).astype(np.float32)
    paths = {}
    grids = (("fixed", (1.0, 1.0), (-24, -22)), ("moving", (1.1, 1.2), (-22, -21)))
    for name, spacing, origin in grids:
        affine = np.diag([*spacing, 1.0, 1.0])
        affine[:2, 3] = origin
        paths[name] = tmp_path / f"{name}.nii.gz"
        nib.save(nib.Nifti1Image(blob, affine), paths[name])  # stored (I, J): a 2D file
    angle = np.deg2rad(8.0)
    truth = np.eye(4)
    truth[:2, :2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    truth[:2, 3] = [1.5, -2.0]
    path = save_affine(tmp_path / "a.mat", AffineTransform(truth, "affine"), ndim=2)
    read = sitk.ReadTransform(str(path))
    assert read.GetDimension() == 2
    np.testing.assert_allclose(load_affine(path).matrix, truth, atol=1e-9)
    moving, fixed = load_volume(paths["moving"]), load_volume(paths["fixed"])
    ours = sample_volume(moving, AffineTransform(truth), None, fixed).data
    theirs = sitk.GetArrayFromImage(
        sitk.Resample(
            sitk.ReadImage(str(paths["moving"])),
            sitk.ReadImage(str(paths["fixed"])),
            read,
            sitk.sitkLinear,
            0.0,
        )
    ).T
    assert float(np.abs(ours).max()) > 0.5
    np.testing.assert_allclose(theirs, ours, atol=5e-4)  # edge voxels: ITK's inside test
