"""Cost masks of a pair: which voxels the similarity counts (ANTs' ``-x``).

:func:`load_mask` reads a mask (a NIfTI/MGZ file or a :class:`~hyperreg.geometry.io.Volume`
holding only 0 and 1), checks it and brings it onto its image's grid; :func:`masked_image`
is how the affine stage and the network see a masked image: the voxels outside the mask that
reach the array's edge set to the image's background value, the holes enclosed by it (a
lesion, a cavity) filled from the tissue around them (:func:`inpainted`). The affine stage
counts only voxels inside both masks (:func:`hyperreg.geometry.affine.register_affine`'s
``fixed_mask``/``moving_mask``), and refinement's similarity only voxels inside the fixed
mask and the warped moving mask (:func:`masks_on_fixed_grid`, :func:`mask_tensors`, then
:func:`hyperreg.registration.refine.refine_flow`). Must not import training, apps or cli.
"""

from __future__ import annotations

import dataclasses
from typing import Any

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
    "cut_view",
    "field_of_view",
    "filled_view",
    "inpainted",
    "load_mask",
    "load_masks",
    "mask_holes",
    "mask_tensors",
    "masked_image",
    "masks_on_fixed_grid",
    "moving_footprint",
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
        missed = InputError(
            fn,
            "the mask '{path}' does not overlap its image '{image}' in world space",
            argument,
            path=volume.path or "<in-memory>",
            image=image.path or "<in-memory>",
        )
        try:
            moved = resample_to(dataclasses.replace(volume, data=data), image, label=True).data
        except ValueError as err:  # a 2D mask in another world plane than its image's
            raise missed from err
        if not moved.any():
            raise missed
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
    """``image`` as the affine stage and the network see it with its cost ``mask`` (a boolean
    Volume on its grid): the voxels outside the mask that reach the array's edge (what lies
    outside a brain or head mask) take the image's background value (its minimum); those
    enclosed by the mask (a lesion, a resection cavity: :func:`mask_holes`) are filled from the
    tissue around them (:func:`inpainted`), so that no intensity edge at the hole pulls the
    network's field or the affine stage and the hole is not squeezed shut. ``image`` itself
    when ``mask`` is None."""
    if mask is None:
        return image
    data = np.array(image.data, dtype=np.float32, copy=True)
    outside = ~np.asarray(mask.data, dtype=bool)
    holes = mask_holes(outside)
    data[outside & ~holes] = float(np.min(image.data))
    if holes.any():
        data = inpainted(data, holes, ~outside)
    return dataclasses.replace(image, data=data)


def mask_holes(outside: np.ndarray) -> np.ndarray:
    """The voxels of ``outside`` (boolean, any dimensionality) in connected parts (faces
    touching) that do not reach the array's edge: holes enclosed by the mask."""
    from scipy import ndimage

    parts, count = ndimage.label(outside)
    if count == 0:
        return np.zeros_like(outside)
    edge = np.zeros(count + 1, dtype=bool)
    for axis in range(outside.ndim):
        for end in (0, -1):
            edge[np.unique(np.take(parts, end, axis=axis))] = True
    return outside & ~edge[parts]


INPAINT_SIGMAS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""Gaussian widths (voxels) of :func:`inpainted`'s normalised convolutions, narrowest first."""


def inpainted(data: np.ndarray, holes: np.ndarray, known: np.ndarray) -> np.ndarray:
    """``data`` (float32, any dimensionality) with the ``holes`` voxels filled from the
    ``known`` ones by normalised convolution (Knutsson and Westin, 1993): a hole voxel takes
    the Gaussian-weighted mean of the known voxels around it at the narrowest width of
    :data:`INPAINT_SIGMAS` that reaches it with at least 1 % weight (so the rim takes its
    neighbours' values, the middle a wider mean); the mean of every known voxel where none
    does. Only the holes' bounding box (plus three widest widths) is filtered. Returns a
    new array."""
    from scipy import ndimage

    out = np.array(data, dtype=np.float32, copy=True)
    where = np.argwhere(holes)
    pad = int(3 * INPAINT_SIGMAS[-1])
    box = tuple(
        slice(max(int(lo) - pad, 0), min(int(hi) + pad + 1, size))
        for lo, hi, size in zip(where.min(0), where.max(0), holes.shape)
    )
    values = np.where(known[box], out[box], 0.0).astype(np.float32)
    weights = known[box].astype(np.float32)
    todo, fill = holes[box].copy(), np.zeros(values.shape, dtype=np.float32)
    for sigma in INPAINT_SIGMAS:
        weight = ndimage.gaussian_filter(weights, sigma, mode="constant")
        reached = todo & (weight > 0.01)
        if reached.any():
            mean = ndimage.gaussian_filter(values, sigma, mode="constant")
            fill[reached] = mean[reached] / weight[reached]
            todo &= ~reached
        if not todo.any():
            break
    if todo.any():
        fill[todo] = float(out[known].mean()) if known.any() else 0.0
    out[box] = np.where(holes[box], fill, out[box])
    return out


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


def moving_footprint(
    fixed: Volume, moving: Volume, transform: AffineTransform, chained: bool
) -> np.ndarray:
    """Boolean array on ``fixed``'s grid: the voxels inside the moving image's array (mapped
    through ``transform`` when ``chained``, else the headers; half a voxel beyond the array's
    edge counts as inside, :func:`~hyperreg.registration.chain.sample_volume`'s rule)."""
    whole = dataclasses.replace(moving, data=np.ones(moving.spatial_shape, dtype=np.float32))
    footprint = masks_on_fixed_grid(fixed, None, whole, transform, chained)[1]
    return np.asarray(footprint.data) > 0.5


def filled_view(moving: Volume, fixed: Volume, inside: np.ndarray) -> Volume:
    """``moving`` (the moving image the network sees, on ``fixed``'s grid) with its voxels
    outside ``inside`` (boolean on that grid: the moving array's footprint,
    :func:`moving_footprint`) taken from ``fixed``, scaled by the ratio of the two images'
    99th head percentiles inside (head: above 10 % of the image's 99th percentile there). For
    a moving scan with a cut field of view the network and refinement then see a whole head
    whose missing part is the fixed image's own, so that no edge of background at the cut
    pulls the field (refinement's similarity still counts only the moving array, its cost
    mask; outputs come from the moving file). ``moving`` itself when every voxel is inside.
    """
    if inside.all():
        return moving
    data = np.array(moving.data, dtype=np.float32, copy=True)
    known, reference = data[inside], np.asarray(fixed.data, dtype=np.float32)[inside]
    low, high = _head_top(known), _head_top(reference)
    scale = low / high if low > 0 and high > 0 else 1.0
    data[~inside] = np.asarray(fixed.data, dtype=np.float32)[~inside] * scale
    return dataclasses.replace(moving, data=data)


def _head_top(values: np.ndarray) -> float:
    """The 99th percentile of the finite ``values`` above 10 % of their 99th (0 for none)."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return 0.0
    head = values[values > 0.1 * float(np.percentile(values, 99))]
    return float(np.percentile(head, 99)) if head.size else 0.0


def cut_view(pair: Any) -> np.ndarray | None:
    """A prepared pair's (:class:`~hyperreg.registration.prepared.PreparedPair`) moving
    footprint on the fixed grid (:func:`moving_footprint` of its ``fixed``, ``moving``,
    ``transform`` and ``chained``) when its moving image covers under :data:`FOV_PARTIAL` of
    the fixed head (its ``fov_fraction``: a cut field of view), else None."""
    if pair.fov_fraction is None or pair.fov_fraction >= FOV_PARTIAL:
        return None
    return moving_footprint(pair.fixed, pair.moving, pair.transform, pair.chained)


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
