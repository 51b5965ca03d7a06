"""Cost masks (``--fixed-mask``/``--moving-mask``, ANTs' ``-x``): reading and checking a mask
(hyperreg.registration.masks), the affine stage's metric counting only voxels inside, and the
command line's options.

Synthetic images whose answers are known: two ellipsoid "heads" 6 mm apart, the moving one with a
bright block far from the head that drags an unmasked affine stage away.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from lambda_helpers import write_nifti
from shared_paths import data_path, needs_data

from hyperreg._errors import InputError
from hyperreg.geometry.affine import register_affine
from hyperreg.geometry.io import Volume
from hyperreg.registration.masks import load_mask, masked_image
from hyperreg.registration.pipeline import load_pair

SHAPE = (48, 48, 48)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])
AFFINE[:3, 3] = -47.0


def _ellipsoid(centre: tuple[float, float, float], axes: tuple[float, ...]) -> np.ndarray:
    """Boolean ``SHAPE`` array: the voxels inside the ellipsoid (voxel units)."""
    grid = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in SHAPE], indexing="ij")
    return sum(((g - c) / a) ** 2 for g, c, a in zip(grid, centre, axes)) < 1


def _head(centre: tuple[float, float, float]) -> np.ndarray:
    """An ellipsoid "head" (1.0, semi-axes 14, 11, 9 voxels) with an off-centre inner
    ellipsoid (1.6) on none of its axes, so that no rotation is free. Sharp edges: on a pair of
    smooth Gaussian blobs Mattes MI scored a 50° turn better than the true shift, so the stage
    landed on one of several turns (which one was incidental)."""
    head = _ellipsoid(centre, (14, 11, 9)).astype(np.float32)
    head[_ellipsoid((centre[0] + 5, centre[1] - 3, centre[2] + 2), (5, 4, 3))] = 1.6
    return head


def _volume(data: np.ndarray, affine: np.ndarray = AFFINE) -> Volume:
    return Volume(data=data, affine=affine, disk_shape=data.shape, path=None, codes=(1, 1))


def _bright_pair() -> tuple[Volume, Volume, np.ndarray]:
    """``(moving, fixed, block)``: the moving head 3 voxels (6 mm) along x from the fixed one,
    with a block of voxels at 12x the head's peak far from it."""
    moving = _head((27, 24, 24))
    block = np.zeros(SHAPE, dtype=bool)
    block[5:15, 30:44, 30:44] = True
    moving[block] = 20.0
    return _volume(moving), _volume(_head((24, 24, 24))), block


def test_affine_metric_ignores_bright_masked_out_voxels() -> None:
    moving, fixed, block = _bright_pair()
    unmasked = register_affine(moving, fixed, "rigid")
    masked = register_affine(moving, fixed, "rigid", moving_mask=_volume(~block))
    clean = register_affine(_volume(_head((27, 24, 24))), fixed, "rigid")
    # the block drags the unmasked stage away; masked, it finds what the clean pair finds
    assert np.abs(unmasked.matrix[:3, 3] - clean.matrix[:3, 3]).max() > 5.0
    assert np.abs(masked.matrix[:3, 3] - clean.matrix[:3, 3]).max() < 0.5
    assert masked.matrix[0, 3] == pytest.approx(6.0, abs=0.5)


def test_load_pair_masks_reach_the_affine_stage_and_the_network(tmp_path: Path) -> None:
    moving, fixed, block = _bright_pair()
    moving_path = write_nifti(tmp_path / "moving.nii.gz", moving.data, AFFINE)
    fixed_path = write_nifti(tmp_path / "fixed.nii.gz", fixed.data, AFFINE)
    mask_path = write_nifti(tmp_path / "mask.nii.gz", (~block).astype(np.uint8), AFFINE)
    pair = load_pair(moving_path, fixed_path, init="rigid", moving_mask=mask_path)
    assert pair.transform.matrix[0, 3] == pytest.approx(6.0, abs=0.5)
    assert pair.moving_mask is not None and pair.fixed_mask is None
    assert pair.moving_mask.data.dtype == bool and pair.moving_mask.data.sum() == (~block).sum()
    # the network's moving image: the block is background; the outputs come from the file
    assert float(pair.aligned.data.max()) < 2.0
    assert float(pair.moving.data.max()) == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("values", "expected"),
    [((0, 2), "values other than 0 and 1 (2)"), ((0, 0), "is empty")],
)
def test_bad_mask_is_a_one_line_error_naming_the_file(
    tmp_path: Path, values: tuple[int, int], expected: str
) -> None:
    data = np.full(SHAPE, values[0], dtype=np.int16)
    data[10:20, 10:20, 10:20] = values[1]
    path = write_nifti(tmp_path / "bad_mask.nii.gz", data, AFFINE)
    with pytest.raises(InputError) as info:
        load_mask(path, _volume(_head((24, 24, 24))), argument="fixed_mask")
    message = str(info.value)
    assert expected in message and "bad_mask.nii.gz" in message and "\n" not in message
    assert info.value.argument == "fixed_mask"


def test_mask_on_another_grid_is_resampled_with_a_note(tmp_path: Path) -> None:
    image = _volume(_head((24, 24, 24)))
    coarse = np.diag([4.0, 4.0, 4.0, 1.0])
    coarse[:3, 3] = -47.0 + 1.0  # 4 mm voxels covering the same box
    data = np.zeros((24, 24, 24), dtype=np.uint8)
    data[6:18, 6:18, 6:18] = 1
    path = write_nifti(tmp_path / "coarse_mask.nii.gz", data, coarse)
    mask, note = load_mask(path, image, argument="moving_mask")
    assert mask.spatial_shape == SHAPE and mask.data.dtype == bool
    assert note is not None and "coarse_mask.nii.gz" in note and "resampled" in note
    # the same world box: 12 coarse voxels of 4 mm = 24 fine voxels of 2 mm per axis
    assert mask.data.sum() == pytest.approx(24**3, rel=0.15)
    same, none = load_mask(_volume(mask.data.astype(np.uint8)), image)
    assert none is None and (same.data == mask.data).all()


def test_mask_that_does_not_overlap_its_image_is_refused(tmp_path: Path) -> None:
    far = AFFINE.copy()
    far[:3, 3] += 500.0
    path = write_nifti(tmp_path / "far_mask.nii.gz", np.ones(SHAPE, dtype=np.uint8), far)
    with pytest.raises(InputError, match="does not overlap"):
        load_mask(path, _volume(_head((24, 24, 24))), argument="moving_mask")


def test_masked_image_sets_the_outside_to_the_minimum() -> None:
    data = _head((24, 24, 24)) + 0.25
    mask = np.zeros(SHAPE, dtype=bool)
    mask[12:36, 12:36, 12:36] = True
    out = masked_image(_volume(data), _volume(mask)).data
    assert (out[~mask] == pytest.approx(float(data.min()))) and (out[mask] == data[mask]).all()
    assert masked_image(_volume(data), None).data is data


def test_weighted_ncc_counts_only_voxels_inside() -> None:
    torch = pytest.importorskip("torch")
    from hyperreg.method.losses import ncc_loss

    generator = torch.Generator().manual_seed(0)
    fixed = torch.rand((1, 1, 40, 40), generator=generator)
    moved = fixed.clone()
    moved[..., 10:20, 10:20] = torch.rand((10, 10), generator=generator)  # a different patch
    weight = torch.ones_like(fixed)
    weight[..., 5:25, 5:25] = 0  # the patch and every window reaching it left out
    plain = float(ncc_loss(moved, fixed, window=9))
    masked = float(ncc_loss(moved, fixed, window=9, weight=weight))
    assert masked == pytest.approx(float(ncc_loss(fixed, fixed, window=9, weight=weight)))
    assert masked < plain - 0.05


@needs_data("neurite-oasis")
def test_cut_2d_moving_gets_the_field_of_view_note_and_verdict() -> None:
    import hyperreg
    from hyperreg.geometry.io import load_volume

    oasis = data_path("neurite-oasis")
    moving = load_volume(oasis / "OASIS_OAS1_0002_MR1" / "slice_norm.nii.gz")
    fixed = load_volume(oasis / "OASIS_OAS1_0001_MR1" / "slice_norm.nii.gz")
    model = hyperreg.load_pretrained(ndim=2)
    intact = load_pair(moving, fixed, model=model)
    assert intact.fov_fraction == pytest.approx(1.0, abs=0.02) and intact.moving_mask is None
    # a smaller array: the first 55 % of the second axis kept, its header unchanged (a cut FOV)
    keep = int(0.55 * moving.spatial_shape[1])
    cut = dataclasses.replace(
        moving, data=moving.data[:, :keep], disk_shape=(moving.spatial_shape[0], keep, 1)
    )
    with pytest.warns(UserWarning, match="partial field of view"):
        pair = load_pair(cut, fixed, model=model)
    assert pair.fov_fraction is not None and 0.3 < pair.fov_fraction < 0.8
    assert pair.moving_mask is not None and pair.moving_mask.data.all()  # its array: the mask
    # the network sees the cut slice, and the fixed slice beyond the cut; outputs come from
    # the file as read (chained)
    from hyperreg.registration.masks import moving_footprint

    inside = moving_footprint(pair.fixed, pair.moving, pair.transform, True)
    assert pair.remapped is not None and pair.chained and 0 < inside.mean() < 0.9
    assert np.array_equal(pair.remapped.data[inside], pair.aligned.data[inside])
    assert not pair.aligned.data[~inside].any()  # nothing of the moving slice there
    beyond = pair.remapped.data[~inside] / pair.fixed.data[~inside].clip(1e-6)
    assert np.ptp(beyond[pair.fixed.data[~inside] > 0.05]) < 1e-3  # the fixed slice, scaled
    result = pair.register(model, [0.05])[0]
    assert result.verdict is not None and not result.verdict.ok
    assert any("partial field of view" in r for r in result.verdict.reasons)


@pytest.mark.parametrize("command", ["register", "affine", "sweep"])
def test_cli_bad_mask_is_one_line_naming_the_option(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hyperreg.cli import main

    moving, fixed, _ = _bright_pair()
    paths = {}
    for name, data in (("moving", moving.data), ("fixed", fixed.data)):
        paths[name] = str(write_nifti(tmp_path / f"{name}.nii.gz", data, AFFINE))
    mask = np.zeros(SHAPE, dtype=np.int16)
    mask[10:20, 10:20, 10:20] = 2
    bad = str(write_nifti(tmp_path / "bad_mask.nii.gz", mask, AFFINE))
    out = tmp_path / "out" / "moved.nii.gz"
    args = [command, "--moving", paths["moving"], "--fixed", paths["fixed"], "--moved", str(out)]
    if command == "sweep":  # its outputs go to a folder
        out = tmp_path / "sweep"
        args = [command, "--moving", paths["moving"], "--fixed", paths["fixed"], "--out", str(out)]
    assert main([*args, "--moving-mask", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hyperreg {command}: error: argument --moving-mask: ")
    assert "bad_mask.nii.gz" in err and "\n" not in err
    assert not out.exists()


def test_sweep_passes_its_masks_to_the_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sweep --fixed-mask/--moving-mask`` reach load_pair (the pair's cost masks)."""
    import hyperreg.apps.sweep as sweep_module
    from hyperreg.cli import main

    moving, fixed, _ = _bright_pair()
    paths = {}
    for name, data in (("moving", moving.data), ("fixed", fixed.data)):
        paths[name] = str(write_nifti(tmp_path / f"{name}.nii.gz", data, AFFINE))
    mask = np.ones(SHAPE, dtype=np.uint8)
    paths["mask"] = str(write_nifti(tmp_path / "mask.nii.gz", mask, AFFINE))
    seen: dict[str, object] = {}

    class Seen(Exception):
        pass

    def load_pair(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise Seen

    monkeypatch.setattr(sweep_module, "load_pair", load_pair)
    args = ["sweep", "--moving", paths["moving"], "--fixed", paths["fixed"]]
    args += ["--out", str(tmp_path / "sweep"), "--fixed-mask", paths["mask"]]
    with pytest.raises(Seen):
        main([*args, "--moving-mask", paths["mask"], "--debug"])
    assert seen["fixed_mask"] == paths["mask"] and seen["moving_mask"] == paths["mask"]


def test_2d_mask_in_another_world_plane_is_refused_as_not_overlapping(tmp_path: Path) -> None:
    from hyperreg.geometry.io import load_volume

    plane = np.eye(4)
    image = load_volume(write_nifti(tmp_path / "image.nii.gz", np.ones((20, 24, 1)), plane))
    far = plane.copy()
    far[2, 3] = 1000.0  # the same slice shape 1000 mm away along its normal
    path = write_nifti(tmp_path / "far_slice_mask.nii.gz", np.ones((20, 24, 1), np.uint8), far)
    with pytest.raises(InputError, match="does not overlap its image") as err:
        load_mask(path, image, argument="fixed_mask")
    assert "far_slice_mask.nii.gz" in str(err.value) and "resample_to" not in str(err.value)
