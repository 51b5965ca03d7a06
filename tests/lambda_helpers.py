"""Helpers shared by test_sweep.py and test_batch.py: tiny 2D files and a tiny model whose flow
layer is scaled up so that its fields are non-trivial (a few voxels) and change with λ."""

from __future__ import annotations

import math
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from hyperreg.config import ModelConfig
from hyperreg.geometry.io import Volume
from hyperreg.method.model import HyperMorph, save_checkpoint

AFFINE = np.array(
    [[-1.0, 0, 0, 80], [0, 0, 1, -112], [0, -1, 0, 96], [0, 0, 0, 1]], dtype=np.float64
)
SHAPE = (24, 20)


def write_nifti(path: Path, data: np.ndarray, affine: np.ndarray = AFFINE) -> Path:
    """Write ``data`` with sform and qform ``affine`` (code 1)."""
    img = nib.Nifti1Image(data, affine)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    nib.save(img, path)
    return path


def blob(shape: tuple[int, ...], centre: tuple[float, ...], sigma: float = 4.0) -> np.ndarray:
    """Gaussian blob in [0, 1], float32."""
    grid = np.meshgrid(*[np.arange(s, dtype=np.float32) for s in shape], indexing="ij")
    dist = sum((g - c) ** 2 for g, c in zip(grid, centre))
    return np.exp(-dist / (2 * sigma**2)).astype(np.float32)


def labels_of(image: np.ndarray) -> np.ndarray:
    """Two nested labels: 3 where image > 0.5, 4 where image > 0.8."""
    return ((image > 0.5).astype(np.uint8) * 3 + (image > 0.8).astype(np.uint8)).astype(np.uint8)


def tiny_model(ndim: int = 2, flow_scale: float = 3e4, seed: int = 0) -> HyperMorph:
    """Untrained tiny HyperMorph, flow layer θ0 scaled by ``flow_scale``, its Δθ rows random."""
    torch.manual_seed(seed)
    model = HyperMorph(
        ModelConfig(
            ndim=ndim, enc_channels=(4, 4, 4, 4), dec_channels=(4,) * 7, hyper_hidden=(8, 8)
        )
    )
    shapes = model.unet.param_shapes()
    count = math.prod(shapes["flow.weight"]) + math.prod(shapes["flow.bias"])
    names = list(shapes)
    assert names[-2:] == ["flow.weight", "flow.bias"], names[-2:]  # flow is last in the flat vector
    with torch.no_grad():
        base = model.hypernet.base_weights[-count:]
        base *= flow_scale
        rows = model.hypernet.weight_delta.weight[-count:]
        # The compact head starts the flow rows at zero (Δθ = 0 at every λ); give them about
        # θ0's scale so the field depends on λ through the flow layer too.
        rows.copy_(torch.randn_like(rows) * 2.0 * float(base.std()))
    return model.eval()


def write_blob_pair(folder: Path) -> dict[str, Path]:
    """Moving and fixed 64 x 64 blobs (slightly shifted and of other sizes) as 2D NIfTI, no
    label maps: a pair the bundled 2D model registers in milliseconds."""
    shape = (64, 64)
    return {
        "moving": write_nifti(folder / "m.nii.gz", blob(shape, (30, 34), 8.0).astype(np.float32)),
        "fixed": write_nifti(folder / "f.nii.gz", blob(shape, (33, 31), 9.0).astype(np.float32)),
    }


def write_pair(folder: Path, tag: str, offset: float = 0.0) -> dict[str, Path]:
    """Moving/fixed images and label maps of one pair, stored as (I, J, 1) NIfTI."""
    folder.mkdir(parents=True, exist_ok=True)
    moving = blob(SHAPE, (11 + offset, 9))
    fixed = blob(SHAPE, (13, 10 + offset))
    return {
        "moving": write_nifti(folder / f"{tag}_moving.nii.gz", moving[..., None]),
        "fixed": write_nifti(folder / f"{tag}_fixed.nii.gz", fixed[..., None]),
        "moving_seg": write_nifti(
            folder / f"{tag}_moving_seg.nii.gz", labels_of(moving)[..., None]
        ),
        "fixed_seg": write_nifti(folder / f"{tag}_fixed_seg.nii.gz", labels_of(fixed)[..., None]),
    }


def save_tiny_model(path: Path, ndim: int = 2) -> Path:
    """Save :func:`tiny_model` as a checkpoint."""
    return save_checkpoint(tiny_model(ndim), path)


def volume_pair(ndim: int = 2) -> dict[str, Volume]:
    """In-memory moving/fixed blobs two voxels apart per axis, with their label maps
    (identity affine): a pair the tiny model moves a few voxels."""
    shape = SHAPE if ndim == 2 else (12, 10, 14)
    moving = blob(shape, tuple(s / 2 - 1 for s in shape), sigma=3.0)
    fixed = blob(shape, tuple(s / 2 + 1 for s in shape), sigma=3.0)
    affine = np.eye(4)
    return {
        "moving": Volume(moving, affine, shape),
        "fixed": Volume(fixed, affine, shape),
        "moving_seg": Volume(labels_of(moving).astype(np.int32), affine, shape),
        "fixed_seg": Volume(labels_of(fixed).astype(np.int32), affine, shape),
    }
