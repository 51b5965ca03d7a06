"""Cost masks of a pair: which voxels the similarity counts (ANTs' ``-x``).

:func:`load_mask` reads a mask (a NIfTI/MGZ file or a :class:`~hyperreg.geometry.io.Volume`
holding only 0 and 1), checks it and brings it onto its image's grid; :func:`masked_image`
sets the voxels outside a mask to the image's background value, which is how the network sees
a masked pair. The affine stage counts only voxels inside both masks
(:func:`hyperreg.geometry.affine.register_affine`'s ``fixed_mask``/``moving_mask``), and
refinement's similarity only voxels inside the fixed mask and the warped moving mask
(:func:`masks_on_fixed_grid`, :func:`mask_tensors`, then
:func:`hyperreg.registration.refine.refine_flow`). Must not import training, apps or cli.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hyperreg._errors import InputError, passed_as
from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.io import Volume, check_same_ndim, same_grid
from hyperreg.geometry.resample import affine_3d, resample_to
from hyperreg.method.model import HyperMorph
from hyperreg.registration.chain import sample_volume
from hyperreg.registration.inputs import load_input
from hyperreg.registration.pairs import PathLike, network_grid

FOV_PARTIAL = 0.9
"""Below this share of the fixed head inside the moving image's field of view, the moving
image's array is its cost mask by default (:func:`field_of_view`)."""

__all__ = [
    "FOV_PARTIAL",
    "check_mask_values",
    "field_of_view",
    "load_mask",
    "load_masks",
    "mask_tensors",
    "masked_image",
    "masks_on_fixed_grid",
]


def load_mask(
    value: PathLike | Volume, image: Volume, *, argument: str = "mask", fn: str = "load_mask"
) -> tuple[Volume, str | None]:
    """Read a cost mask and bring it onto ``image``'s grid.

    Args:
        value: The mask: a file with a header (NIfTI, MGZ) or a Volume, 2D or 3D like
            ``image``, holding only 0 (outside: not counted) and 1 (inside).
        image: The image the mask belongs to (its grid is the mask's on return).
        argument: The caller's name for the mask (errors name it: ``"moving_mask"``).
        fn: The public function named in errors.

    Returns:
        ``(mask, note)``: the mask on ``image``'s grid as a boolean Volume (the mask's path
        kept), and a one-line note when it was resampled onto that grid through the headers
        (nearest neighbour), else None.

    Raises:
        FileNotFoundError: If the file is missing.
        InputError: (``argument``) values other than 0 and 1, a mask with no voxel at 1, a
            mask of another dimensionality than its image, or one on another grid that does
            not overlap its image in world space (nothing of it left on the image's grid).
    """
    with passed_as(path=argument, value=argument):
        volume = load_input(value, warn_constant=False)
    with passed_as(moving=argument):
        check_same_ndim(fn, volume, image)
    check_mask_values(fn, volume.data, volume.path, argument)
    data = volume.data.astype(np.int32)
    note = None
    if not same_grid(volume, image):
        moved = resample_to(dataclasses.replace(volume, data=data), image, label=True).data
        if not moved.any():
            raise InputError(
                fn,
                "the mask '{path}' does not overlap its image '{image}' in world space",
                argument,
                path=volume.path or "<in-memory>",
                image=image.path or "<in-memory>",
            )
        data = moved
        note = (
            f"resampled the {argument.replace('_', ' ')} '{volume.path}' onto the grid of "
            f"'{image.path}' through the headers (nearest)"
        )
    mask = Volume(
        data=data.astype(bool),
        affine=image.affine,
        disk_shape=image.disk_shape,
        path=volume.path,
        codes=image.codes,
    )
    return mask, note


def check_mask_values(fn: str, data: np.ndarray, path: object, argument: str = "mask") -> None:
    """Raise unless ``data`` (a mask's array, any shape) holds only 0 and 1 with at least one
    1: an :class:`InputError` of ``argument`` naming ``path`` (``<in-memory>`` for None) and
    up to three of the other values."""
    values = np.unique(data)
    if not np.isin(values, (0, 1)).all():
        shown = ", ".join(f"{v:g}" for v in values[~np.isin(values, (0, 1))][:3])
        raise InputError(
            fn, "the mask '{path}' holds values other than 0 and 1 ({shown})", argument,
            path=path or "<in-memory>", shown=shown,
        )  # fmt: skip
    if not values.any():
        raise InputError(
            fn, "the mask '{path}' is empty (no voxel at 1)", argument, path=path or "<in-memory>"
        )


def load_masks(
    fn: str,
    moving: tuple[PathLike | Volume | None, Volume],
    fixed: tuple[PathLike | Volume | None, Volume],
) -> tuple[list[tuple[Volume, Volume | None]], list[str]]:
    """A pair's two masks, each ``(mask or None, image)`` (:func:`load_mask`, errors naming
    ``"moving_mask"``/``"fixed_mask"``): ``([(moving image, moving mask on its grid or None),
    (fixed image, fixed mask or None)], notes)``."""
    found, notes = [], []
    for name, (mask, image) in (("moving_mask", moving), ("fixed_mask", fixed)):
        on_grid, note = (
            (None, None) if mask is None else load_mask(mask, image, argument=name, fn=fn)
        )
        found.append((image, on_grid))
        notes += [note] if note else []
    return found, notes


def masked_image(image: Volume, mask: Volume | None) -> Volume:
    """``image`` with the voxels outside ``mask`` (a boolean Volume on its grid) set to its
    background value (the image's minimum), so that the normalisation and the network see
    them as background; ``image`` itself when ``mask`` is None."""
    if mask is None:
        return image
    data = np.array(image.data, dtype=np.float32, copy=True)
    data[~mask.data] = float(np.min(image.data))
    return dataclasses.replace(image, data=data)


def masks_on_fixed_grid(
    fixed: Volume,
    fixed_mask: Volume | None,
    moving_mask: Volume | None,
    transform: AffineTransform,
    chained: bool,
) -> tuple[Volume | None, Volume | None] | None:
    """A pair's cost masks on the fixed grid, as float32 Volumes in [0, 1]: the fixed mask as
    it is, the moving mask sampled (linear) through ``transform`` when ``chained`` (the
    affine stage's chain, :func:`~hyperreg.registration.chain.sample_volume`), else through
    the headers; None without either mask."""
    if fixed_mask is None and moving_mask is None:
        return None
    fixed_f = None
    if fixed_mask is not None:
        fixed_f = dataclasses.replace(fixed_mask, data=fixed_mask.data.astype(np.float32))
    moving_f = None
    if moving_mask is not None:
        as_float = dataclasses.replace(moving_mask, data=moving_mask.data.astype(np.float32))
        moving_f = (
            sample_volume(as_float, transform, None, fixed)
            if chained
            else resample_to(as_float, fixed)
        )
    return fixed_f, moving_f


def mask_tensors(
    model: HyperMorph,
    fixed: Volume,
    masks: tuple[Volume | None, Volume | None] | None,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
    """:func:`masks_on_fixed_grid`'s masks as ``(1, 1, *S)`` float tensors on the network
    grid (:func:`~hyperreg.registration.pairs.network_grid`, linear; the fixed grid for a
    model without one), on ``device``; None for None."""
    if masks is None:
        return None
    grid = network_grid(model, fixed)
    found: list[torch.Tensor | None] = []
    for mask in masks:
        if mask is None:
            found.append(None)
            continue
        on_grid = mask if grid is None else resample_to(mask, grid.grid)
        data = torch.as_tensor(np.asarray(on_grid.data, dtype=np.float32), device=device)
        found.append(data.clamp(0, 1)[None, None])
    return found[0], found[1]


def field_of_view(moving: Volume, fixed: Volume, transform: AffineTransform) -> float:
    """Share of the fixed head whose world points map inside the moving image's array.

    "Has data" is decided by the array bounds: a cut field of view is a smaller array (a
    zero-filled slab inside the array counts as data). The fixed head is its voxels above
    10 % of its 99th intensity percentile (every second voxel per axis for images above a
    million voxels); each maps through ``transform`` (fixed world -> moving world, RAS mm) and
    counts when it lies within half a voxel of the moving array.

    Returns:
        The share in [0, 1]; 1.0 for a fixed image with no such voxel.
    """
    step = 2 if fixed.data.size > 1_000_000 else 1
    data = np.asarray(fixed.data)[(slice(None, None, step),) * fixed.ndim]
    head = data > 0.1 * float(np.percentile(data, 99))
    if not head.any():
        return 1.0
    index = np.argwhere(head).astype(np.float64) * step
    points = np.zeros((len(index), 4))
    points[:, : fixed.ndim], points[:, 3] = index, 1.0
    to_moving = np.linalg.inv(affine_3d(moving)) @ transform.matrix @ affine_3d(fixed)
    voxels = points @ to_moving.T
    shape = np.array(moving.spatial_shape[: moving.ndim], dtype=np.float64)
    inside = np.all(
        (voxels[:, : moving.ndim] >= -0.5) & (voxels[:, : moving.ndim] <= shape - 0.5), axis=1
    )
    return float(inside.mean())
