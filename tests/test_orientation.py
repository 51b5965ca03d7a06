"""Storage orientation does not change the registration: a model records the orientation it was
trained in (ModelConfig.orientation) and sees every 3D pair in it (conformed_grid)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from lambda_helpers import blob, tiny_model
from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import conformed_grid
from hyperreg.registration.lambdas import register_pair

# LIA, 1 mm: the neurite-oasis / FreeSurfer storage order
LIA = np.array([[-1.0, 0, 0, 12], [0, 0, 1, -14], [0, -1, 0, 10], [0, 0, 0, 1]])


def _as_ras(volume: Volume) -> Volume:
    """The same voxels stored RAS (the world position of every voxel kept)."""
    import nibabel as nib

    image = nib.as_closest_canonical(nib.Nifti1Image(volume.data, volume.affine))
    data = np.asarray(image.dataobj)
    return Volume(data, image.affine, data.shape)


def _pair() -> tuple[Volume, Volume]:
    shape = (24, 20, 28)
    moving = blob(shape, (10, 9, 15), 4.0) + 0.5 * blob(shape, (15, 11, 10), 3.0)
    fixed = blob(shape, (12, 10, 13), 4.5) + 0.5 * blob(shape, (14, 9, 12), 3.0)
    moving, fixed = (np.clip(a, 0, 1).astype(np.float32) for a in (moving, fixed))
    return Volume(moving, LIA, shape), Volume(fixed, LIA, shape)


def test_conformed_grid_is_the_same_for_lia_and_ras_storage() -> None:
    moving, _ = _pair()
    a, b = conformed_grid(moving, 1.0, "RAS"), conformed_grid(_as_ras(moving), 1.0, "RAS")
    assert a is not None and b is None  # already RAS at 1 mm: nothing to resample
    np.testing.assert_allclose(a.affine, _as_ras(moving).affine)
    assert a.spatial_shape == _as_ras(moving).spatial_shape


def _moved_in_lia(model, moving: Volume, fixed: Volume) -> tuple[float, float]:
    lia = register_pair(model, moving, fixed, 0.2, normalization="none").moved
    ras = register_pair(model, _as_ras(moving), _as_ras(fixed), 0.2, normalization="none").moved
    import nibabel as nib
    from nibabel.orientations import io_orientation, ornt_transform

    back = nib.orientations.apply_orientation(
        ras, ornt_transform(io_orientation(_as_ras(fixed).affine), io_orientation(LIA))
    )
    return float(np.abs(lia - back).max()), float(np.abs(lia - fixed.data).mean())


def test_same_pair_stored_lia_or_ras_registers_alike() -> None:
    torch.manual_seed(0)
    model = tiny_model(ndim=3)
    moving, fixed = _pair()
    model.config = dataclasses.replace(model.config, orientation="", spacing=0.0)
    plain_gap, _ = _moved_in_lia(model, moving, fixed)
    model.config = dataclasses.replace(model.config, orientation="RAS")
    gap, _ = _moved_in_lia(model, moving, fixed)
    assert plain_gap > 0.05  # without a recorded orientation, storage order changes the result
    assert gap < 1e-3 < plain_gap
