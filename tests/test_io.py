"""Tests for hyperreg.geometry.io: NIfTI/MGZ/npz reading, atomic writing, grid checks."""

from __future__ import annotations

import gzip
import logging
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from shared_paths import CASES as CASES_DIR
from shared_paths import DATA
from hyperreg._errors import InputError
from hyperreg.geometry.fields import save_displacement
from hyperreg.geometry.io import (
    Volume,
    check_same_grid,
    has_header,
    load_volume,
    same_grid,
    save_volume,
)

CASES = CASES_DIR / "files"


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def _rotated_affine() -> np.ndarray:
    """A non-trivial affine (rotation about two axes, anisotropic, shifted), float32-exact."""
    a, b = np.deg2rad(20.0), np.deg2rad(-35.0)
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    rz = np.array([[np.cos(b), -np.sin(b), 0], [np.sin(b), np.cos(b), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rz @ rx @ np.diag([0.9, 1.2, 2.5])
    affine[:3, 3] = [-80.5, 112.25, -30.0]
    # NIfTI stores the sform as float32; a float32-exact affine must round-trip bit for bit
    return affine.astype(np.float32).astype(np.float64)


def _asymmetric(shape: tuple[int, ...]) -> np.ndarray:
    """Array whose every voxel value encodes its index, so any transpose/flip is detected."""
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) / 7.0


def _write_nifti(
    path: Path,
    data: np.ndarray,
    affine: np.ndarray | None = None,
    *,
    slope: float | None = None,
) -> Path:
    img = nib.Nifti1Image(data, np.eye(4) if affine is None else affine)
    if slope is not None:
        img.header.set_slope_inter(slope, 0.0)
    img.to_filename(path)
    return path


def _like(shape: tuple[int, ...], disk_shape: tuple[int, ...] | None = None) -> Volume:
    return Volume(
        data=np.zeros(shape, np.float32),
        affine=_rotated_affine(),
        disk_shape=disk_shape or shape,
    )


# ------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_nifti_round_trip_keeps_affine_dtype_and_axis_order(tmp_path: Path, suffix: str) -> None:
    data = _asymmetric((4, 5, 6))
    affine = _rotated_affine()
    src = _write_nifti(tmp_path / f"in{suffix}", data, affine)

    vol = load_volume(str(src))  # str accepted
    assert vol.data.dtype == np.float32
    assert vol.data.shape == (4, 5, 6)
    np.testing.assert_array_equal(vol.data, data)
    assert vol.affine.dtype == np.float64 and vol.affine.shape == (4, 4)
    np.testing.assert_array_equal(vol.affine, affine)
    assert vol.path == src
    assert vol.ndim == 3 and vol.spatial_shape == (4, 5, 6)
    np.testing.assert_allclose(vol.spacing, (0.9, 1.2, 2.5), rtol=1e-6)

    out = save_volume(tmp_path / "sub" / f"out{suffix}", vol.data * 2, vol)
    assert out == tmp_path / "sub" / f"out{suffix}"
    img = nib.load(out)
    assert img.shape == (4, 5, 6)
    assert img.get_data_dtype() == np.float32
    codes = nib.load(src).header
    # outputs keep the input's own codes (nibabel writes sform 2 / qform 0 by default)
    assert vol.codes == (int(codes["sform_code"]), int(codes["qform_code"]))
    assert (int(img.header["sform_code"]), int(img.header["qform_code"])) == vol.codes
    np.testing.assert_array_equal(img.affine, affine)
    back = load_volume(out)
    np.testing.assert_array_equal(back.data, data * 2)
    np.testing.assert_array_equal(back.affine, affine)


def test_2d_slice_loads_as_2d_and_saves_back_as_i_j_1(tmp_path: Path) -> None:
    data = _asymmetric((6, 9, 1))
    src = _write_nifti(tmp_path / "slice.nii.gz", data, _rotated_affine())
    vol = load_volume(src)
    assert vol.ndim == 2
    assert vol.data.shape == (6, 9)
    assert vol.disk_shape == (6, 9, 1)
    assert len(vol.spacing) == 2
    np.testing.assert_array_equal(vol.data, data[:, :, 0])
    np.testing.assert_array_equal(vol.affine, _rotated_affine())  # full 4x4 kept

    out = save_volume(tmp_path / "out.nii.gz", vol.data + 1, vol)
    img = nib.load(out)
    assert img.shape == (6, 9, 1)
    np.testing.assert_array_equal(np.asanyarray(img.dataobj)[:, :, 0], data[:, :, 0] + 1)


@pytest.mark.parametrize(
    ("disk_shape", "spatial_shape"),
    [
        ((4, 5, 1, 1), (4, 5)),
        ((4, 5, 6, 1), (4, 5, 6)),
        ((4, 1, 6), (4, 1, 6)),  # a non-trailing singleton axis is never squeezed
        ((1, 5, 6), (1, 5, 6)),
        ((4, 5), (4, 5)),
    ],
)
def test_only_trailing_singleton_axes_are_dropped(
    tmp_path: Path, disk_shape: tuple[int, ...], spatial_shape: tuple[int, ...]
) -> None:
    data = _asymmetric(disk_shape)
    vol = load_volume(_write_nifti(tmp_path / "x.nii", data))
    assert vol.spatial_shape == spatial_shape
    assert vol.disk_shape == disk_shape
    np.testing.assert_array_equal(vol.data, data.reshape(spatial_shape))


@pytest.mark.parametrize("suffix", [".mgz", ".mgh"])
def test_mgh_loads_with_vox2ras_affine(tmp_path: Path, suffix: str) -> None:
    data = _asymmetric((4, 5, 6))
    affine = np.array(
        [[-1.0, 0, 0, 128], [0, 0, 1, -128], [0, -1, 0, 128], [0, 0, 0, 1]]
    )  # FreeSurfer conformed LIA
    path = tmp_path / f"x{suffix}"
    nib.MGHImage(data, affine).to_filename(path)
    vol = load_volume(path)
    assert vol.data.shape == (4, 5, 6)
    np.testing.assert_array_equal(vol.data, data)
    np.testing.assert_allclose(vol.affine, affine, atol=1e-5)
    np.testing.assert_allclose(vol.affine, nib.load(path).affine)


@pytest.mark.parametrize("key", ["vol", "vol_data", "anything"])
def test_npz_loads_with_identity_affine_when_asked(tmp_path: Path, key: str) -> None:
    data = _asymmetric((4, 5, 6)).astype(np.float64)
    path = tmp_path / "x.npz"
    np.savez_compressed(path, **{key: data})
    vol = load_volume(path, assume_identity=True)
    np.testing.assert_array_equal(vol.affine, np.eye(4))
    np.testing.assert_array_equal(vol.data, data.astype(np.float32))
    assert vol.data.dtype == np.float32
    assert vol.spacing == (1.0, 1.0, 1.0)
    assert vol.codes == (1, 1)


def test_npz_geometry_is_never_assumed_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "moving.npz"
    np.savez(path, vol=_asymmetric((4, 5, 6)))
    assert not has_header(path) and has_header(tmp_path / "x.nii.gz")
    with pytest.raises(
        ValueError, match=r"'.*moving\.npz' has no header.*geometry_from.*assume_identity=True"
    ):
        load_volume(path)
    with pytest.raises(ValueError, match=r"moving\.npz' has no header: pass one of"):
        load_volume(
            path,
            assume_identity=True,
            geometry_from=Volume(np.zeros((4, 5, 6)), np.eye(4), (4, 5, 6)),
        )
    with pytest.raises(TypeError, match="'geometry_from' must be a Volume"):
        load_volume(path, geometry_from=np.eye(4))  # type: ignore[arg-type]
    # the geometry of the fixed image, on the same grid only
    fixed_path = _write_nifti(tmp_path / "fixed.nii.gz", _asymmetric((4, 5, 6)), _rotated_affine())
    fixed = load_volume(fixed_path)
    with caplog.at_level(logging.INFO, logger="hyperreg"):
        vol = load_volume(path, geometry_from=fixed)
        load_volume(path, assume_identity=True)
    np.testing.assert_array_equal(vol.affine, fixed.affine)
    assert vol.codes == fixed.codes and vol.path == path
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]  # nothing printed
    other = load_volume(_write_nifti(tmp_path / "other.nii.gz", _asymmetric((4, 5, 7))))
    with pytest.raises(
        ValueError,
        match=r"moving\.npz' has no header and spatial shape \(4, 5, 6\).*"
        r"other\.nii\.gz' with shape \(4, 5, 7\)",
    ):
        load_volume(path, geometry_from=other)
    # files with a header ignore both options
    np.testing.assert_array_equal(
        load_volume(fixed_path, geometry_from=other, assume_identity=True).affine, fixed.affine
    )


def test_npz_prefers_vol_key_and_rejects_ambiguous_files(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    vol = _asymmetric((3, 4))
    np.savez(path, seg=np.zeros((3, 4)), vol=vol)
    np.testing.assert_array_equal(load_volume(path, assume_identity=True).data, vol)
    path2 = tmp_path / "y.npz"
    np.savez(path2, a=np.zeros((3, 4)), b=np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"'vol' or 'vol_data'.*\['a', 'b'\]"):
        load_volume(path2, assume_identity=True)


def test_sform_is_used_when_its_code_is_positive(tmp_path: Path) -> None:
    sform = _rotated_affine()
    qform = np.diag([2.0, 3.0, 4.0, 1.0])
    img = nib.Nifti1Image(_asymmetric((4, 5, 6)), None)
    img.set_qform(qform, code=1)
    img.set_sform(sform, code=2)
    img.to_filename(tmp_path / "x.nii.gz")
    with pytest.warns(UserWarning, match=r"sform \(code 2\) and a qform \(code 1\) that disagree"):
        vol = load_volume(tmp_path / "x.nii.gz")
    np.testing.assert_array_equal(vol.affine, sform)


def test_agreeing_or_unused_forms_do_not_warn(tmp_path: Path) -> None:
    sform = _rotated_affine()
    for sform_code, qform_code, qform in ((2, 1, sform), (2, 0, np.eye(4)), (0, 1, sform)):
        img = nib.Nifti1Image(_asymmetric((4, 5, 6)), None)
        img.set_qform(qform, code=qform_code)
        img.set_sform(sform, code=sform_code)
        img.to_filename(tmp_path / "x.nii.gz")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_volume(tmp_path / "x.nii.gz")


def test_sheared_affine_is_written_as_sform_only_never_an_orthogonalised_qform(
    tmp_path: Path,
) -> None:
    sheared = np.array([[1.0, 0.3, 0, -10], [0, 1.0, 0, -20], [0, 0, 2.0, 5], [0, 0, 0, 1]])
    for codes in ((2, 1), (1, 1), (0, 1)):
        like = Volume(np.zeros((4, 5, 6), np.float32), sheared, (4, 5, 6), codes=codes)
        path = save_volume(tmp_path / "sheared.nii.gz", _asymmetric((4, 5, 6)), like)
        header = nib.load(path).header
        assert int(header["qform_code"]) == 0, codes  # no silently orthogonalised qform
        assert int(header["sform_code"]) == (codes[0] or 2)
        np.testing.assert_allclose(header.get_sform(), sheared, atol=1e-6)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_allclose(load_volume(path).affine, sheared, atol=1e-6)
    # an affine a qform can hold keeps the reference's codes and a qform equal to the sform
    rotated = _rotated_affine()
    like = Volume(np.zeros((4, 5, 6), np.float32), rotated, (4, 5, 6), codes=(2, 1))
    header = nib.load(save_volume(tmp_path / "r.nii.gz", _asymmetric((4, 5, 6)), like)).header
    assert (int(header["sform_code"]), int(header["qform_code"])) == (2, 1)
    np.testing.assert_allclose(header.get_qform(), header.get_sform(), atol=1e-5)


def test_qform_is_used_when_sform_code_is_zero(tmp_path: Path) -> None:
    sform = _rotated_affine()
    qform = np.diag([2.0, 3.0, 4.0, 1.0])
    qform[:3, 3] = [10, -20, 30]
    img = nib.Nifti1Image(_asymmetric((4, 5, 6)), None)
    img.set_qform(qform, code=1)
    img.set_sform(sform, code=0)
    img.to_filename(tmp_path / "x.nii.gz")
    vol = load_volume(tmp_path / "x.nii.gz")
    np.testing.assert_allclose(vol.affine, qform, atol=1e-6)
    assert vol.spacing == pytest.approx((2.0, 3.0, 4.0))


@pytest.mark.parametrize("shape", [(4, 5, 1, 3), (4, 5, 6, 2), (4, 5, 6, 1, 3)])
def test_series_is_rejected(tmp_path: Path, shape: tuple[int, ...]) -> None:
    path = _write_nifti(tmp_path / "series.nii.gz", _asymmetric(shape))
    with pytest.raises(ValueError, match="a 4D series is not one image") as info:
        load_volume(path)
    assert "series.nii.gz" in str(info.value)
    assert str(shape) in str(info.value)


def test_1d_data_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "line.npz"
    np.savez(path, vol=np.arange(5.0))
    with pytest.raises(ValueError, match=r"2D or 3D image, got shape \(5,\)"):
        load_volume(path)


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii"])
def test_truncated_file_is_a_clear_error(tmp_path: Path, suffix: str) -> None:
    path = _write_nifti(tmp_path / f"t{suffix}", _asymmetric((20, 30, 10)) + 1)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="cannot read .*truncated or not a valid NIfTI") as info:
        load_volume(path)
    assert str(path) in str(info.value)
    assert info.value.__cause__ is not None  # chained


@pytest.mark.parametrize("suffix", [".nii.gz", ".mgz", ".npz"])
def test_garbage_file_is_a_clear_error(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"junk{suffix}"
    path.write_bytes(gzip.compress(b"not an image at all") if suffix != ".npz" else b"junk")
    with pytest.raises(ValueError, match="cannot read .*junk"):
        load_volume(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.nii.gz"
    with pytest.raises(FileNotFoundError, match=r"load_volume\(\): no such file: '.*nope"):
        load_volume(path)


@pytest.mark.parametrize("name", ["x.png", "x.nii.bz2", "x", "x.gz"])
def test_load_rejects_unknown_suffix(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match=r"must end with one of .*'\.nii\.gz'.*'\.npz'"):
        load_volume(path)


def test_nonfinite_voxels_are_counted_and_optionally_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _asymmetric((5, 6, 7)) + 1
    data[0, 0, 0] = np.nan
    data[1, 2, 3] = np.inf
    data[4, 5, 6] = -np.inf
    path = _write_nifti(tmp_path / "nan.nii.gz", data)
    with pytest.raises(ValueError, match=r"has 3 non-finite voxels.*'replace_nonfinite' VALUE"):
        load_volume(path)
    with caplog.at_level(logging.WARNING, logger="hyperreg.geometry.io"):
        vol = load_volume(path, allow_nonfinite=True)
    assert np.isfinite(vol.data).all()
    assert vol.data[0, 0, 0] == 0 and vol.data[1, 2, 3] == 0 and vol.data[4, 5, 6] == 0
    assert vol.data[2, 2, 2] == data[2, 2, 2]
    assert "replaced 3 non-finite" in caplog.text


def test_constant_image_warns(tmp_path: Path) -> None:
    path = _write_nifti(tmp_path / "flat.nii.gz", np.full((4, 5, 1), 2.5, np.float32))
    with pytest.warns(UserWarning, match=r"is constant \(all voxels = 2.5\)") as record:
        vol = load_volume(path)
    assert vol.data.shape == (4, 5)
    assert record[0].filename == __file__  # stacklevel points at the caller


def test_constant_image_warning_can_be_left_to_the_caller(tmp_path: Path) -> None:
    path = _write_nifti(tmp_path / "flat.nii.gz", np.full((4, 5, 1), 2.5, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_volume(path, warn_constant=False).data.shape == (4, 5)


@pytest.mark.parametrize("channels", [3, 4])
@pytest.mark.parametrize("label", [False, True])
def test_a_2d_colour_array_is_refused(tmp_path: Path, channels: int, label: bool) -> None:
    rng = np.random.default_rng(0)
    picture = rng.integers(0, 256, (40, 32, channels)).astype(np.uint8)  # (X, Y, RGB[A])
    path = _write_nifti(tmp_path / "photo.nii.gz", picture)
    pattern = rf"photo\.nii\.gz' has shape \(40, 32, {channels}\): a 2D colour image"
    with pytest.raises(InputError, match=pattern) as err:
        load_volume(path, label=label)
    assert err.value.argument == "path" and "one grey channel" in str(err.value)


def test_an_rgb_nifti_datatype_is_refused(tmp_path: Path) -> None:
    rgb = np.zeros((40, 32), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    rgb["G"][5:20, 5:20] = 200
    img = nib.Nifti1Image(rgb, np.eye(4))
    assert img.header.get_data_dtype().names == ("R", "G", "B")  # NIfTI datatype RGB24
    path = tmp_path / "rgb.nii.gz"
    nib.save(img, path)
    with pytest.raises(InputError, match=r"rgb\.nii\.gz' is a colour image \(RGB voxels\)"):
        load_volume(path)


@pytest.mark.parametrize("shape", [(8, 8, 3), (40, 32, 2), (40, 32, 5)])
def test_thin_volumes_that_are_not_a_colour_image_load(
    tmp_path: Path, shape: tuple[int, ...]
) -> None:
    path = _write_nifti(tmp_path / "x.nii.gz", _asymmetric(shape))
    assert load_volume(path).data.shape == shape


def test_a_series_of_three_slices_is_a_series_not_a_colour_image(tmp_path: Path) -> None:
    path = _write_nifti(tmp_path / "x.nii.gz", _asymmetric((40, 32, 1, 3)))  # time on axis 4
    with pytest.raises(InputError, match="4D series") as err:
        load_volume(path)
    assert "colour" not in str(err.value)


def test_nonconstant_image_does_not_warn(tmp_path: Path) -> None:
    path = _write_nifti(tmp_path / "x.nii.gz", _asymmetric((4, 5, 6)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_volume(path)


# ------------------------------------------------------------------------------------------
# label maps
# ------------------------------------------------------------------------------------------


def test_labels_round_to_nearest_through_scl_slope(tmp_path: Path) -> None:
    labels = np.array([[0, 1, 2], [3, 7, 3]], dtype=np.int16)[:, :, None]
    path = _write_nifti(tmp_path / "seg.nii.gz", labels, slope=0.99997)  # 3 -> 2.99991
    stored = np.asanyarray(nib.load(path).dataobj)
    assert stored.max() < 7 and stored[1, 0, 0] < 3  # truncation would give 2
    vol = load_volume(path, label=True)
    assert vol.data.dtype == np.int32
    np.testing.assert_array_equal(vol.data, labels[:, :, 0])


def test_labels_keep_negative_values_and_reject_nonfinite(tmp_path: Path) -> None:
    labels = np.array([[-3, 0], [5, 1]], dtype=np.float32)
    vol = load_volume(_write_nifti(tmp_path / "neg.nii", labels), label=True)
    np.testing.assert_array_equal(vol.data, labels.astype(np.int32))
    labels[0, 0] = np.nan
    path = _write_nifti(tmp_path / "nan.nii", labels)
    with pytest.raises(ValueError, match="has 1 non-finite voxels"):
        load_volume(path, label=True, allow_nonfinite=True)


def test_labels_far_from_integers_are_an_error_naming_the_file(tmp_path: Path) -> None:
    # a label map holding 2.5 must not become label 2 (or 3) with only a warning
    path = _write_nifti(tmp_path / "half.nii", np.array([[0.0, 2.5], [1.0, 3.0]], np.float32))
    with pytest.raises(
        ValueError, match=r"'.*half\.nii' must hold integer label ids.*1 voxels.*2\.5"
    ):
        load_volume(path, label=True)
    path = _write_nifti(tmp_path / "img.nii", np.array([[0.2, 1.5], [0.0, 3.0]], np.float32))
    with pytest.raises(ValueError, match="img.nii' must hold integer label ids"):
        load_volume(path, label=True)
    # rounding noise of a scale factor is still read as the nearest id, without a warning
    noisy = np.array([[0.0, 2.9999], [1.00004, 2035.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vol = load_volume(_write_nifti(tmp_path / "noisy.nii", noisy), label=True)
    np.testing.assert_array_equal(vol.data, [[0, 3], [1, 2035]])


@pytest.mark.parametrize(
    ("low", "high", "dtype"),
    [(0, 255, np.uint8), (-1, 200, np.int16), (0, 300, np.int16), (0, 70000, np.int32)],
)
def test_label_save_is_unscaled_smallest_integer_type(
    tmp_path: Path, low: int, high: int, dtype: type
) -> None:
    like = _like((3, 4), disk_shape=(3, 4, 1))
    labels = np.zeros((3, 4), np.int64)
    labels[0, 0], labels[2, 3], labels[1, 2] = low, high, 3
    path = save_volume(tmp_path / "seg.nii.gz", labels.astype(np.float64), like, label=True)
    img = nib.load(path)
    assert img.get_data_dtype() == dtype
    assert img.shape == (3, 4, 1)
    assert img.dataobj.slope == 1 and img.dataobj.inter == 0
    stored = np.asanyarray(img.dataobj)
    assert stored.dtype.kind in "iu"
    np.testing.assert_array_equal(stored[:, :, 0], labels)
    np.testing.assert_array_equal(load_volume(path, label=True).data, labels)


def test_label_save_rejects_non_integer_values(tmp_path: Path) -> None:
    like = _like((3, 4))
    with pytest.raises(ValueError, match="'data' must be integer-valued"):
        save_volume(tmp_path / "seg.nii.gz", np.full((3, 4), 1.5), like, label=True)
    assert not any(tmp_path.iterdir())


def test_c02_style_labels_survive_load_save_load(tmp_path: Path) -> None:
    labels = np.arange(24, dtype=np.int16).reshape(4, 6, 1)
    src = _write_nifti(tmp_path / "scaled.nii.gz", labels, slope=0.99997)
    vol = load_volume(src, label=True)
    out = save_volume(tmp_path / "out.nii.gz", vol.data, vol, label=True)
    assert nib.load(out).get_data_dtype() == np.uint8
    np.testing.assert_array_equal(load_volume(out, label=True).data, labels[:, :, 0])


# ------------------------------------------------------------------------------------------
# writing: images, displacements, atomicity
# ------------------------------------------------------------------------------------------


def test_gzipped_outputs_are_one_standard_gzip_stream_that_itk_reads(tmp_path: Path) -> None:
    # .nii.gz is compressed by ISA-L (python-isal), not by nibabel's zlib: the file must still
    # be plain gzip (Python's gzip, nibabel and SimpleITK, the reader ANTs uses, read the same
    # bytes and voxels as the uncompressed .nii written beside it).
    import SimpleITK as sitk

    like = Volume(np.zeros((9, 7, 5), np.float32), _rotated_affine(), (9, 7, 5))
    data = _asymmetric((9, 7, 5)) * 100
    raw = save_volume(tmp_path / "a.nii", data, like)
    packed = save_volume(tmp_path / "a.nii.gz", data, like)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed.read_bytes()) == raw.read_bytes()
    np.testing.assert_array_equal(load_volume(packed).data, data)
    via_itk = sitk.GetArrayFromImage(sitk.ReadImage(str(packed)))  # (k, j, i)
    np.testing.assert_array_equal(via_itk.transpose(2, 1, 0), data)
    field = np.stack([data, -data, 2 * data]).astype(np.float32)
    disp = save_displacement(tmp_path / "warp.nii.gz", field, like, format="itk")
    assert gzip.decompress(disp.read_bytes())[:4] == (348).to_bytes(4, "little")
    assert sitk.ReadImage(str(disp)).GetNumberOfComponentsPerPixel() == 3


def test_save_volume_rejects_wrong_shape_nonfinite_and_suffix(tmp_path: Path) -> None:
    like = _like((4, 5, 6))
    with pytest.raises(ValueError, match=r"\(4, 5, 6\), got \(4, 6, 5\)"):
        save_volume(tmp_path / "x.nii.gz", np.zeros((4, 6, 5)), like)
    bad = np.zeros((4, 5, 6))
    bad[1, 1, 1] = np.nan
    with pytest.raises(ValueError, match="'data' must be finite, got 1 non-finite"):
        save_volume(tmp_path / "x.nii.gz", bad, like)
    with pytest.raises(ValueError, match=r"must end with one of \('\.nii\.gz', '\.nii', '\.mgz'\)"):
        save_volume(tmp_path / "x.mgh", np.zeros((4, 5, 6)), like)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("shape", [(4, 5, 6), (7, 5)])
def test_save_volume_writes_freesurfer_mgz(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """Images (float32) and label maps (smallest integer type) as MGZ, with the affine; a 2D
    slice as (I, J, 1); read back by nibabel and by load_volume alike."""
    like = _like(shape)
    image = np.random.default_rng(0).random(shape).astype(np.float32)
    labels = (image * 3).astype(np.int64)
    save_volume(tmp_path / "i.mgz", image, like)
    save_volume(tmp_path / "s.mgz", labels, like, label=True)
    for name, data, dtype in (("i.mgz", image, np.float32), ("s.mgz", labels, np.uint8)):
        stored = nib.load(tmp_path / name)
        assert isinstance(stored, nib.MGHImage) and stored.get_data_dtype().type is dtype
        assert stored.shape == (*shape, 1)[:3]
        np.testing.assert_allclose(stored.affine, like.affine, atol=1e-5)
        np.testing.assert_array_equal(np.asanyarray(stored.dataobj).reshape(shape), data)
    assert (tmp_path / "i.mgz").read_bytes()[:2] == b"\x1f\x8b"  # gzip, as FreeSurfer writes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.mgz", "s.mgz"]  # no temporary left


def test_save_displacement_3d_is_channel_last_in_voxels(tmp_path: Path) -> None:
    like = _like((4, 5, 6))
    disp = np.stack([_asymmetric((4, 5, 6)) * s for s in (1.0, -2.0, 3.0)])  # (3, 4, 5, 6)
    path = save_displacement(tmp_path / "warp.nii.gz", disp, like)
    img = nib.load(path)
    assert img.shape == (4, 5, 6, 3)
    assert img.get_data_dtype() == np.float32
    np.testing.assert_array_equal(img.affine, like.affine)
    stored = np.asanyarray(img.dataobj)
    np.testing.assert_array_equal(stored[1, 2, 3], disp[:, 1, 2, 3])
    np.testing.assert_array_equal(np.moveaxis(stored, -1, 0), disp)


def test_save_displacement_2d_keeps_the_fixed_disk_layout(tmp_path: Path) -> None:
    like = _like((4, 5), disk_shape=(4, 5, 1))
    disp = np.stack([_asymmetric((4, 5)), -_asymmetric((4, 5)) - 1])  # (2, 4, 5)
    img = nib.load(save_displacement(tmp_path / "warp.nii", disp, like))
    assert img.shape == (4, 5, 1, 2)
    stored = np.asanyarray(img.dataobj)
    np.testing.assert_array_equal(stored[3, 1, 0], disp[:, 3, 1])
    np.testing.assert_array_equal(stored[0, 4, 0], [disp[0, 0, 4], disp[1, 0, 4]])


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 4, 5, 6), (1, 3, 4, 5, 6), (3, 6, 5, 4)])
def test_save_displacement_rejects_wrong_shape(tmp_path: Path, shape: tuple[int, ...]) -> None:
    like = _like((4, 5, 6))
    with pytest.raises(ValueError, match=r"'disp' must have shape \(N, \*S\) = \(3, 4, 5, 6\)"):
        save_displacement(tmp_path / "w.nii.gz", np.zeros(shape), like)
    assert not any(tmp_path.iterdir())


def test_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    like = _like((4, 5, 6))
    save_volume(tmp_path / "a.nii.gz", np.ones((4, 5, 6)), like)
    save_volume(tmp_path / "a.nii.gz", _asymmetric((4, 5, 6)), like)  # overwrite in place
    save_volume(tmp_path / "b.nii", np.ones((4, 5, 6)), like, label=True)
    save_displacement(tmp_path / "c.nii.gz", np.zeros((3, 4, 5, 6)), like)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.nii.gz", "b.nii", "c.nii.gz"]
    # the .nii.gz suffix was kept through the temporary name: the output is really gzipped
    assert (tmp_path / "a.nii.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "b.nii").read_bytes()[:2] != b"\x1f\x8b"
    np.testing.assert_array_equal(load_volume(tmp_path / "a.nii.gz").data, _asymmetric((4, 5, 6)))


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_failed_write_removes_temp_file_and_keeps_old_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    like = _like((4, 5, 6))
    target = save_volume(tmp_path / f"a{suffix}", np.ones((4, 5, 6)), like)
    before = target.read_bytes()

    def broken(self: nib.Nifti1Image, file_map: dict | None = None, dtype: object = None) -> None:
        holder = (file_map or self.file_map)["image"]  # to_filename passes none
        with holder.get_prepare_fileobj(mode="wb") as handle:
            handle.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(nib.Nifti1Image, "to_file_map", broken)
    with pytest.raises(OSError, match="disk full"):
        save_volume(target, np.zeros((4, 5, 6)), like)
    assert [p.name for p in tmp_path.iterdir()] == [f"a{suffix}"]
    assert target.read_bytes() == before


# ------------------------------------------------------------------------------------------
# grids and Volume
# ------------------------------------------------------------------------------------------


def test_same_grid_and_check_same_grid(tmp_path: Path) -> None:
    affine = _rotated_affine()
    fixed = load_volume(_write_nifti(tmp_path / "fixed.nii.gz", _asymmetric((4, 5, 6)), affine))
    moving = load_volume(_write_nifti(tmp_path / "moving.nii.gz", _asymmetric((4, 5, 6)), affine))
    assert same_grid(moving, fixed)
    check_same_grid(moving, fixed)

    shifted = affine.copy()
    shifted[0, 3] += 1e-3
    moved_origin = Volume(moving.data, shifted, moving.disk_shape, moving.path)
    assert not same_grid(moved_origin, fixed)
    assert same_grid(moved_origin, fixed, atol=1e-2)

    aniso = np.diag([1.0, 3.0, 1.0, 1.0])
    other = load_volume(_write_nifti(tmp_path / "other.nii.gz", _asymmetric((4, 2, 6)), aniso))
    with pytest.raises(ValueError, match="are on different grids") as info:
        check_same_grid(other, fixed)
    msg = str(info.value)
    assert "other.nii.gz" in msg and "fixed.nii.gz" in msg
    assert "(4, 2, 6) vs (4, 5, 6)" in msg
    assert "spacing (1.0, 3.0, 1.0) vs (0.9, 1.2, 2.5)" in msg
    assert "affines differ" in msg and "resample" in msg


def test_volume_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="'data' must have shape"):
        Volume(np.zeros(5), np.eye(4), (5,))
    with pytest.raises(ValueError, match="'affine' must be a finite"):
        Volume(np.zeros((2, 3)), np.eye(3), (2, 3))
    with pytest.raises(ValueError, match="'disk_shape'"):
        Volume(np.zeros((2, 3)), np.eye(4), (2, 4, 1))
    vol = Volume(np.zeros((2, 3)), np.diag([2.0, 0.5, 7.0, 1.0]), (2, 3, 1))
    assert vol.spacing == (2.0, 0.5)
    assert "shape=(2, 3)" in repr(vol)


# ------------------------------------------------------------------------------------------
# real shared cases and data (skipped when ../shared is absent)
# ------------------------------------------------------------------------------------------

needs_cases = pytest.mark.skipif(
    not CASES.is_dir(), reason=f"case files not found at {CASES} (HYPERREG_CASES)"
)
needs_data = pytest.mark.skipif(
    not DATA.is_dir(), reason=f"MRI data not found at {DATA} (HYPERREG_DATA)"
)


@needs_cases
def test_case_c01_uses_sform_and_warns(tmp_path: Path) -> None:
    path = CASES / "c01_qform_sform_conflict.nii.gz"
    img = nib.load(path)
    assert int(img.header["sform_code"]) > 0
    with pytest.warns(
        UserWarning, match=r"c01_qform_sform_conflict.*disagree.*17.32 mm apart.*using the sform"
    ):
        vol = load_volume(path)
    np.testing.assert_array_equal(vol.affine, img.get_sform())
    # an output on its grid carries one consistent pair: qform = sform
    out = nib.load(save_volume(tmp_path / "out.nii.gz", vol.data, vol)).header
    np.testing.assert_allclose(out.get_qform(), out.get_sform(), atol=1e-5)


@needs_cases
def test_case_c02_labels_round_up() -> None:
    vol = load_volume(CASES / "c02_labels_scaled.nii.gz", label=True)
    assert vol.data.dtype == np.int32 and vol.data.shape == (160, 192)
    assert vol.data.max() == 23  # stored as 23 * 0.99997 = 22.9993 (make_cases.py)
    # made from OAS1_0002 slice_seg24 (cases/make_cases.py), in which labels 13 and 24 are absent
    assert set(np.unique(vol.data)) == set(range(24)) - {13}
    original = DATA / "neurite-oasis" / "OASIS_OAS1_0002_MR1" / "slice_seg24.nii.gz"
    if original.is_file():
        np.testing.assert_array_equal(vol.data, load_volume(original, label=True).data)


@needs_cases
def test_case_c03_series_error() -> None:
    with pytest.raises(ValueError, match=r"c03_4d_series.*\(160, 192, 1, 3\).*4D series"):
        load_volume(CASES / "c03_4d_series.nii.gz")


@needs_cases
def test_case_c06_nan_count() -> None:
    with pytest.raises(ValueError, match=r"c06_moving_with_nan.* has 16 non-finite voxels"):
        load_volume(CASES / "c06_moving_with_nan.nii.gz")
    assert np.isfinite(
        load_volume(CASES / "c06_moving_with_nan.nii.gz", allow_nonfinite=True).data
    ).all()


@needs_cases
def test_case_c07_constant_warns() -> None:
    with pytest.warns(UserWarning, match=r"c07_fixed_all_zero.* is constant"):
        load_volume(CASES / "c07_fixed_all_zero.nii.gz")


@needs_cases
def test_case_c09_truncated_error() -> None:
    with pytest.raises(ValueError, match=r"cannot read '.*c09_truncated.*truncated"):
        load_volume(CASES / "c09_truncated.nii.gz")


@needs_cases
@pytest.mark.filterwarnings("ignore:.*sform.*qform.*disagree")
def test_case_c04_c12_grid_mismatch_is_reported() -> None:
    fixed = load_volume(CASES / "c01_qform_sform_conflict.nii.gz")
    for name in ("c04_other_grid_150x181.nii.gz", "c12_fixed_aniso.nii.gz"):
        with pytest.raises(ValueError, match=f"'.*{name}' and .* are on different grids"):
            check_same_grid(load_volume(CASES / name), fixed)
    with pytest.raises(ValueError, match=r"spacing \(1.0, 3.0\) vs \(1.0, 1.0\)"):
        check_same_grid(load_volume(CASES / "c12_fixed_aniso.nii.gz"), fixed)


def _shared_files() -> list[Path]:
    folders = [DATA / "neurite-oasis", DATA / "oasis1-freesurfer"]
    return sorted(
        p for f in folders if f.is_dir() for p in f.rglob("*") if p.suffix in {".gz", ".mgz"}
    )


@needs_data
@pytest.mark.parametrize(
    "path",
    _shared_files() or [pytest.param(None, marks=pytest.mark.skip(reason="no shared files"))],
    ids=lambda p: f"{p.parent.name}/{p.name}" if p else "none",
)
def test_shared_data_loads_with_documented_geometry(path: Path) -> None:
    label = "seg" in path.name
    vol = load_volume(path, label=label)
    if path.suffix == ".mgz":
        shape = (256, 256, 256)
    elif path.name.startswith("slice_"):
        shape = (160, 192)
        assert vol.disk_shape == (160, 192, 1)
    else:
        shape = (160, 192, 224)
    assert vol.spatial_shape == shape
    assert vol.spacing == pytest.approx((1.0,) * len(shape), abs=1e-4)
    # LIA orientation (data/README.md): i -> Left, j -> Inferior, k -> Anterior
    assert nib.aff2axcodes(vol.affine) == ("L", "I", "A")
    if label:
        assert vol.data.dtype == np.int32 and vol.data.min() == 0
        if path.name in ("aligned_seg35.nii.gz", "aligned_seg4.nii.gz"):
            assert vol.data.max() == int(path.name.split("seg")[1].split(".")[0])
    else:
        assert vol.data.dtype == np.float32 and vol.data.max() > 0


@needs_data
def test_shared_npz_is_the_same_geometry_as_neurite_oasis() -> None:
    path = DATA / "learn2reg-tutorials2019" / "subject_1_vol.npz"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    vol = load_volume(path, assume_identity=True)
    assert vol.spatial_shape == (160, 192, 224)
    np.testing.assert_array_equal(vol.affine, np.eye(4))
    assert nib.aff2axcodes(vol.affine) == ("R", "A", "S")  # the documented identity rule
    assert 0.87 < float(vol.data.max()) < 0.88
