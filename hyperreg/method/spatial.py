"""Spatial transforms on dense fields: warping, integration, resizing, Jacobians.

This module owns every operation on displacement and velocity fields. Fields are
``(B, N, *S)`` tensors in voxels of the grid they live on, channel ``n`` along array axis ``n``
(i, j, k order). The conversion to ``grid_sample``'s normalised, x-first coordinates happens in
exactly one place, :func:`_to_grid_sample_coords`. Pure functions first; the ``nn.Module``
classes at the end are thin wrappers. Must not import nibabel, argparse or any hyperreg module
other than ``_checks``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperreg._checks import check_field, check_float_tensor, check_image, check_option

__all__ = [
    "SpatialTransformer",
    "VelocityIntegrator",
    "compose_displacements",
    "identity_grid",
    "integrate_velocity",
    "jacobian_determinant",
    "resize_field",
    "sample_at",
    "warp",
]

WARP_MODES = ("bilinear", "nearest")
# "itk": ITK's (and ANTs') resampler: the edge value up to half a voxel beyond the edge, 0 further
# out (for written outputs: they then match SimpleITK's resampling at the field of view's edge)
PADDING_MODES = ("border", "zeros", "itk")


def identity_grid(
    spatial_shape: Sequence[int],
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Voxel coordinates of every grid point.

    Args:
        spatial_shape: ``S``, the grid size, length 2 or 3.
        device: Device of the result.
        dtype: Floating dtype of the result.

    Returns:
        Tensor of shape ``(1, N, *S)``; channel ``n`` holds the index along array axis ``n``.
    """
    axes = [torch.arange(s, device=device, dtype=dtype) for s in spatial_shape]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0).unsqueeze(0)


def _to_grid_sample_coords(points: Tensor, grid_shape: Sequence[int] | None = None) -> Tensor:
    """Convert voxel coordinates to ``grid_sample``'s normalised, x-first layout.

    Args:
        points: ``(B, N, *S)`` voxel coordinates, channel ``n`` along array axis ``n``.
        grid_shape: Spatial shape of the image that is sampled (length ``N``); default
            ``points.shape[2:]`` (the points lie on the image's own grid, as in :func:`warp`).

    Returns:
        ``(B, *S, N)`` with values in [-1, 1] at the first/last voxel centres of the sampled
        image (``align_corners=True``) and the channels reversed (last array axis first), as
        ``torch.nn.functional.grid_sample`` expects.
    """
    shape = tuple(points.shape[2:]) if grid_shape is None else tuple(grid_shape)
    scale = torch.tensor(
        [2.0 / max(s - 1, 1) for s in shape], device=points.device, dtype=points.dtype
    ).view(1, -1, *([1] * (points.ndim - 2)))
    normalised = points * scale - 1.0
    return normalised.movedim(1, -1).flip(-1)


def warp(
    moving: Tensor,
    disp: Tensor,
    mode: str = "bilinear",
    padding: str = "border",
    *,
    exact: bool = True,
) -> Tensor:
    """Resample ``moving`` at voxel locations shifted by ``disp`` (backward warping).

    Output voxel ``x`` takes the value of ``moving`` interpolated at ``x + disp[:, :, x]``.
    ``disp`` therefore lives on the fixed-image grid and points into the moving image.

    With ``exact`` (default, for outputs) sampling runs in float64, so a zero displacement
    returns a float32 image bit for bit. ``exact=False`` (the model's own warp, in training and
    inference) samples in the inputs' dtype (at least float32) on a cached identity grid: about
    2× faster on a CPU, positions within ~1e-6 voxels of the float64 ones.

    Args:
        moving: Image to resample, shape ``(B, C, *S)`` with ``S`` = ``(H, W)`` or ``(D, H, W)``.
            Any floating dtype (label maps: cast to float and use ``mode="nearest"``).
        disp: Displacement field, shape ``(B, N, *S)`` or ``(1, N, *S)`` with ``N = len(S)``.
            Channel ``n`` is the shift along array axis ``n`` (i, j, k order), in voxels.
        mode: ``"bilinear"`` (trilinear in 3D) for intensities or ``"nearest"`` for label maps.
        padding: Value taken outside the image: ``"border"`` (edge value), ``"zeros"``
            (``grid_sample``'s: the value falls linearly to 0 over the voxel beyond the edge) or
            ``"itk"`` (ITK's and ANTs' rule, for written outputs: the edge value up to half a
            voxel beyond the edge, 0 further out).
        exact: Sample in float64 (see above).

    Returns:
        The moved image, shape ``(B, C, *S)``, with the dtype and device of ``moving``.

    Raises:
        TypeError: If ``moving`` or ``disp`` is not a floating-point tensor.
        ValueError: If ``disp`` has ``!= N`` channels, if its spatial shape differs from
            ``moving``'s, if its batch size is neither 1 nor B, or if ``mode``/``padding``
            is not one of the listed options.
        RuntimeError: If a 2D warp on a CPU would sample at NaN or inf positions (PyTorch's 2D
            CPU sampler crashes on them, pytorch/pytorch#24823).

    References:
        Spatial transformer as used in VoxelMorph (Balakrishnan et al., IEEE TMI 2019);
        Jaderberg et al., Spatial Transformer Networks, NeurIPS 2015.
    """
    check_image("warp", "moving", moving)
    check_field("warp", "disp", disp, moving.shape[2:])
    check_option("warp", "mode", mode, WARP_MODES)
    check_option("warp", "padding", padding, PADDING_MODES)
    if disp.shape[0] not in (1, moving.shape[0]):
        raise ValueError(
            f"warp(): 'disp' must have batch size 1 or {moving.shape[0]}, got {disp.shape[0]}"
        )
    if not exact:
        return _warp_fast(moving, disp, mode, padding)
    return _warp(moving, disp, mode, padding)


@functools.lru_cache(maxsize=16)
def _identity_coords(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """The identity grid in ``grid_sample`` layout ``(1, *S, N)``, cached per shape."""
    return _to_grid_sample_coords(identity_grid(shape, device, dtype))


def _warp_fast(moving: Tensor, disp: Tensor, mode: str, padding: str) -> Tensor:
    """Unchecked :func:`warp` with ``exact=False``: in the inputs' dtype, cached identity."""
    work = torch.promote_types(torch.promote_types(moving.dtype, disp.dtype), torch.float32)
    shape = tuple(disp.shape[2:])
    scale = torch.tensor(
        [2.0 / max(s - 1, 1) for s in reversed(shape)], device=disp.device, dtype=work
    )
    shift = disp.to(work).movedim(1, -1).flip(-1) * scale
    grid = _identity_coords(shape, disp.device, work) + shift
    if grid.shape[0] != moving.shape[0]:
        grid = grid.expand(moving.shape[0], *grid.shape[1:])
    return _grid_sample(moving.to(work), grid, mode, padding).to(moving.dtype)


def _warp(moving: Tensor, disp: Tensor, mode: str, padding: str) -> Tensor:
    """Unchecked :func:`warp` for inner loops."""
    # Sampling runs in float64: the round trip voxel -> [-1, 1] -> voxel inside grid_sample is
    # then exact for float32 data, so a zero displacement returns the image bit for bit.
    points = identity_grid(disp.shape[2:], disp.device, torch.float64) + disp.to(torch.float64)
    grid = _to_grid_sample_coords(points)
    if grid.shape[0] != moving.shape[0]:
        grid = grid.expand(moving.shape[0], *grid.shape[1:])
    return _grid_sample(moving.to(torch.float64), grid, mode, padding).to(moving.dtype)


def _grid_sample(moving: Tensor, grid: Tensor, mode: str, padding: str, fn: str = "warp") -> Tensor:
    """``F.grid_sample`` (align_corners=True); refuses a non-finite 2D grid on a CPU.

    PyTorch's vectorised 2D CPU kernel reads outside the image for a NaN coordinate and crashes
    the process (pytorch/pytorch#24823, open; the backward pass too, seen here when a training
    step made the field NaN). The check is one sum over the 2D grid (NaN or inf anywhere makes it
    non-finite; about 6 µs at 160 × 192); 3D and CUDA kernels do not crash (a NaN field then gives
    a non-finite smoothness loss, which training reports).

    Raises:
        RuntimeError: If the grid of a 2D CPU warp holds NaN or inf.
    """
    if grid.ndim == 4 and grid.device.type == "cpu" and not bool(torch.isfinite(grid.sum())):
        raise RuntimeError(
            f"{fn}(): the sampling positions hold non-finite values (NaN or inf), e.g. from a "
            "diverged training or refinement"
        )
    if padding != "itk":
        return _sample(moving, grid, mode, padding)
    out = _sample(moving, grid, mode, "border")
    # voxel -0.5 and S - 0.5 are -1 - 1/(S-1) and 1 + 1/(S-1) in grid_sample's coordinates
    sizes = [max(s - 1, 1) for s in reversed(moving.shape[2:])]
    limit = torch.tensor([1.0 + 1.0 / s for s in sizes], dtype=grid.dtype, device=grid.device)
    outside = (grid.abs() > limit).any(-1) | ~torch.isfinite(grid).all(-1)
    return out.masked_fill(outside[:, None], 0.0)


_SPLIT_POINTS = 1 << 15  # fewest output points of a 3D CPU sampling split into batch items
_GRADIENT_PARTS = 4  # most items of a split whose input needs a gradient (any thread count)


def _split_parts(moving: Tensor, grid: Tensor) -> int:
    """How many batch items :func:`_sample` splits a sampling into (1: none).

    Without a gradient for ``moving`` the items' results are the unsplit ones bitwise, so the
    thread count may choose: the largest divisor of the output depth up to it. With one, the
    items' gradients of the shared input are summed, whose rounding depends on their number:
    that number is the output shape's alone (the largest divisor of the depth up to
    :data:`_GRADIENT_PARTS`), so a result does not depend on the thread count.
    """
    if grid.ndim != 5 or moving.device.type != "cpu" or moving.shape[0] != 1:
        return 1
    if grid.shape[0] != 1 or grid.shape[1:-1].numel() < _SPLIT_POINTS:
        return 1
    most = torch.get_num_threads()
    if moving.requires_grad and torch.is_grad_enabled():
        most = _GRADIENT_PARTS
    depth = grid.shape[1]
    return max(p for p in range(1, most + 1) if depth % p == 0)


def _sample(moving: Tensor, grid: Tensor, mode: str, padding: str) -> Tensor:
    """``F.grid_sample`` (align_corners=True), a 3D CPU one split across threads.

    PyTorch's 3D CPU sampler runs its batch items in parallel and each on one thread, so a
    single volume is sampled on one core whatever the thread count. A volume (any channels) of
    at least :data:`_SPLIT_POINTS` output points is sampled as ``p`` batch items of ``D / p``
    output planes each (``p`` from :func:`_split_parts`): the same volume read by every item (a
    stride-0 view), the grid reshaped as a view. Each output point and its grid gradient are
    the unsplit ones, bitwise; the gradient of ``moving`` is the sum of the items' (rounding
    only). A one-channel result is a view, a multi-channel one a copy.
    """
    parts = _split_parts(moving, grid)
    if parts == 1:
        return F.grid_sample(moving, grid, mode=mode, padding_mode=padding, align_corners=True)
    # views, any strides (grid[0] would cost its backward a zero-filled copy of the grid)
    items = grid.squeeze(0).unflatten(0, (parts, grid.shape[1] // parts))
    out = F.grid_sample(
        moving.expand(parts, *moving.shape[1:]), items, mode=mode, padding_mode=padding,
        align_corners=True,
    )  # fmt: skip
    # (parts, C, D / parts, H, W) -> (1, C, D, H, W)
    return out.transpose(0, 1).reshape(1, moving.shape[1], *grid.shape[1:-1])


def sample_at(
    moving: Tensor,
    points: Tensor,
    mode: str = "bilinear",
    padding: str = "zeros",
    *,
    exact: bool = True,
) -> Tensor:
    """Sample ``moving`` at arbitrary voxel coordinates of its own grid (one interpolation).

    Output location ``x`` takes ``moving`` interpolated at ``points[:, :, x]``. Unlike
    :func:`warp`, the points may form a grid of another shape than ``moving``'s (e.g. the fixed
    grid, with ``points`` the moving-voxel position of every fixed voxel through an affine and a
    displacement), so a chain of transforms costs a single interpolation.

    Args:
        moving: Image to sample, shape ``(B, C, *S)`` with ``S`` = ``(H, W)`` or ``(D, H, W)``.
            Any floating dtype (label maps: cast to float and use ``mode="nearest"``).
        points: Voxel coordinates in ``moving``'s grid, shape ``(B, N, *T)`` or ``(1, N, *T)``
            with ``N = len(S)`` and ``T`` any spatial shape of the same length; channel ``n``
            is the (fractional) index along array axis ``n`` (i, j, k order).
        mode: ``"bilinear"`` (trilinear in 3D) for intensities or ``"nearest"`` for label maps.
        padding: Value taken outside the image, as :func:`warp`'s: ``"zeros"`` (default),
            ``"border"`` or ``"itk"`` (what written outputs use).
        exact: Sample in float64 (default). ``False``: the positions are converted to
            ``grid_sample`` coordinates in float64 and sampling runs in ``moving``'s dtype (at
            least float32), 2-3x faster on a CPU; positions within ~1e-7 of the image size
            (about 3e-5 voxels at 256) of the float64 ones.

    Returns:
        The sampled image, shape ``(B, C, *T)``, with the dtype and device of ``moving``
        (sampling itself runs in float64 with ``exact``).

    Raises:
        TypeError: If ``moving`` or ``points`` is not a floating-point tensor.
        ValueError: If ``points`` does not have ``N`` channels and ``N`` spatial axes, if its
            batch size is neither 1 nor B, or if ``mode``/``padding`` is not a listed option.
        RuntimeError: If 2D ``points`` on a CPU hold NaN or inf (as :func:`warp`).

    References:
        ``torch.nn.functional.grid_sample`` (``align_corners=True``); coordinate conversion in
        ``_to_grid_sample_coords``.
    """
    check_image("sample_at", "moving", moving)
    check_float_tensor("sample_at", "points", points)
    ndim = moving.ndim - 2
    if points.ndim != ndim + 2 or points.shape[1] != ndim:
        raise ValueError(
            f"sample_at(): 'points' must have shape (B, {ndim}, *T) with {ndim} spatial axes "
            f"for a {ndim}D image, got {tuple(points.shape)}"
        )
    if points.shape[0] not in (1, moving.shape[0]):
        raise ValueError(
            f"sample_at(): 'points' must have batch size 1 or {moving.shape[0]}, "
            f"got {points.shape[0]}"
        )
    check_option("sample_at", "mode", mode, WARP_MODES)
    check_option("sample_at", "padding", padding, PADDING_MODES)
    work = torch.float64 if exact else torch.promote_types(moving.dtype, torch.float32)
    grid = _to_grid_sample_coords(points.to(torch.float64), moving.shape[2:]).to(work)
    if grid.shape[0] != moving.shape[0]:
        grid = grid.expand(moving.shape[0], *grid.shape[1:])
    return _grid_sample(moving.to(work), grid, mode, padding, "sample_at").to(moving.dtype)


def compose_displacements(first: Tensor, second: Tensor, *, exact: bool = True) -> Tensor:
    """The displacement of ``first`` then ``second``: ``second(x) + first(x + second(x))``.

    With ``moved[x] = moving(x + u(x))``: when ``second`` registers the image ``first`` moved to
    the fixed image, the result warps the original moving image there in one interpolation
    (the composition of scaling and squaring, and of a recursive cascade's stages: Zhao et
    al., Recursive Cascaded Networks, ICCV 2019).

    Args:
        first: ``(B, N, *S)`` displacement in voxels, channel ``n`` along array axis ``n``.
        second: ``(B, N, *S)`` displacement on the same grid (batch 1 or B).
        exact: Sample ``first`` in float64 (:func:`warp`); False: the model's faster warp.

    Returns:
        ``(B, N, *S)``: one field doing both. ``first`` is sampled linearly and keeps its edge
        value outside the grid.

    Raises:
        TypeError, ValueError: As :func:`warp` (non-float tensors, shapes that do not match).
    """
    return second + warp(first, second, padding="border", exact=exact)


def integrate_velocity(velocity: Tensor, steps: int = 7) -> Tensor:
    """Integrate a stationary velocity field by scaling and squaring.

    ``disp = exp(velocity)``: the field is divided by ``2**steps`` and composed with itself
    ``steps`` times (``u ← u + u∘(x + u)``). Each composition samples in the velocity's dtype
    (at least float32) on a cached identity grid, as :func:`warp` with ``exact=False`` does,
    with the border's value outside the grid. The field is held in ``grid_sample``'s
    normalised, x-first layout from the first composition to the last (the compositions are
    linear in it), so a step makes no layout copies: the result is the voxel-unit loop's to
    float32 rounding (about 1e-6 voxels at a few voxels of displacement; tested).

    Args:
        velocity: Stationary velocity field, shape ``(B, N, *S)``, voxels per unit time,
            channel ``n`` along array axis ``n``.
        steps: Number of squaring steps, ``>= 0``; 0 returns ``velocity`` unchanged.

    Returns:
        Displacement field, shape ``(B, N, *S)``, in voxels.

    Raises:
        TypeError: If ``velocity`` is not a floating-point tensor.
        ValueError: If ``velocity`` is not a field or ``steps < 0``.

    References:
        Arsigny et al., MICCAI 2006; Dalca et al., Unsupervised learning of probabilistic
        diffeomorphic registration, MedIA 2019.
    """
    check_field("integrate_velocity", "velocity", velocity)
    if steps < 0:
        raise ValueError(f"integrate_velocity(): 'steps' must be >= 0, got {steps}")
    if steps == 0:
        return velocity / 1
    shape = tuple(velocity.shape[2:])
    work = torch.promote_types(velocity.dtype, torch.float32)
    unit = torch.ones(1, len(shape), *[1] * len(shape), dtype=torch.float64)
    scale = _to_grid_sample_coords(unit, shape).view(-1)
    scale = (scale + 1.0).to(device=velocity.device, dtype=work)  # 2 / (s - 1), x first
    # u / 2**steps in grid_sample's coordinates, channels last: (B, *S, N)
    field = velocity.to(work).movedim(1, -1).flip(-1) * (scale / 2**steps)
    identity = _identity_coords(shape, velocity.device, work)
    for _ in range(steps):
        sampled = _grid_sample(
            field.movedim(-1, 1).contiguous(), identity + field, "bilinear", "border",
            "integrate_velocity",
        )  # fmt: skip
        field = field + sampled.movedim(1, -1)
    return (field / scale).flip(-1).movedim(-1, 1).contiguous().to(velocity.dtype)


def resize_field(
    field: Tensor,
    factor: float,
    size: Sequence[int] | None = None,
    *,
    crop: Sequence[int] | None = None,
) -> Tensor:
    """Resample a field to a finer or coarser grid and rescale its vectors.

    Values are interpolated (bi/trilinear, ``align_corners=False``, so voxel centres of a grid
    ``factor`` times finer line up as for strided pooling) and then **multiplied by ``factor``**,
    because a displacement of ``d`` voxels on the old grid is ``d · factor`` voxels on the new
    one. A 2-voxel field resized by 0.5 becomes a 1-voxel field.

    Args:
        field: ``(B, N, *S)`` displacement or velocity in voxels.
        factor: Ratio of new to old grid size along every axis, ``> 0``.
        size: Exact output spatial shape; default ``round(s * factor)`` per axis.
        crop: Only the first ``crop`` voxels per axis of the resized grid (at most its size):
            the values of resizing and then slicing, computed (and differentiated) on the crop
            alone; default the whole grid.

    Returns:
        ``(B, N, *S')`` field in voxels of the new grid (``S' = crop`` when given).

    Raises:
        TypeError: If ``field`` is not a floating-point tensor.
        ValueError: If ``field`` is not a field, ``factor <= 0``, or ``crop`` does not have one
            size per spatial axis, each from 1 to the resized grid's.
    """
    check_field("resize_field", "field", field)
    if not factor > 0:
        raise ValueError(f"resize_field(): 'factor' must be > 0, got {factor}")
    if crop is not None:
        full = [round(s * factor) for s in field.shape[2:]] if size is None else list(size)
        if len(crop) != len(full) or not all(1 <= c <= f for c, f in zip(crop, full)):
            raise ValueError(
                f"resize_field(): 'crop' must hold {len(full)} sizes from 1 to the resized "
                f"grid's {tuple(full)}, got {tuple(crop)}"
            )
        return _resize_field(field, factor, full, tuple(crop))
    if factor == 1 and size is None:
        return field
    return _resize_field(field, factor, size)


def _resize_field(
    field: Tensor,
    factor: float,
    size: Sequence[int] | None = None,
    crop: tuple[int, ...] | None = None,
) -> Tensor:
    if size is None:
        size = [round(s * factor) for s in field.shape[2:]]
    mode = "bilinear" if field.ndim == 4 else "trilinear"
    # interpolation is linear: the vectors are scaled on the smaller grid (upsampling by 2 in
    # 3D: one multiplication over 1/8 of the voxels, forward and backward)
    small = field * factor if factor > 1 else field
    if crop is None:
        resized = F.interpolate(small, size=tuple(size), mode=mode, align_corners=False)
    else:
        # the resize's own scales (new / old size per axis) with a smaller output: the kernel
        # maps an output voxel to the same source position as the whole resize does
        scales = [n / s for n, s in zip(size, field.shape[2:])]
        upsample = torch.ops.aten.upsample_trilinear3d
        if mode == "bilinear":
            upsample = torch.ops.aten.upsample_bilinear2d
        resized = upsample(small, list(crop), False, *scales)
    return resized if factor > 1 else resized * factor


_JACOBIAN_SLAB = 16  # planes of the first spatial axis per slab of jacobian_determinant


def _difference(x: Tensor, dim: int) -> Tensor:
    """``torch.gradient`` of ``x`` along ``dim`` (unit spacing): central differences inside,
    one-sided at both ends; written out with slices, about 2.5 times faster on a CPU."""
    n = x.shape[dim]
    out = torch.empty_like(x)
    out.narrow(dim, 1, n - 2).copy_((x.narrow(dim, 2, n - 2) - x.narrow(dim, 0, n - 2)) * 0.5)
    out.narrow(dim, 0, 1).copy_(x.narrow(dim, 1, 1) - x.narrow(dim, 0, 1))
    out.narrow(dim, n - 1, 1).copy_(x.narrow(dim, n - 1, 1) - x.narrow(dim, n - 2, 1))
    return out


def _determinant(disp: Tensor) -> Tensor:
    """``det(I + ∇disp)`` of a whole field ``(B, N, *S)``, shape ``(B, *S)``."""
    ndim = disp.shape[1]
    # jac[c][a] = δ_ca + d disp_c / d x_a
    grads = [_difference(disp, 2 + a) for a in range(ndim)]
    jac = [[grads[a][:, c] + (1.0 if a == c else 0.0) for a in range(ndim)] for c in range(ndim)]
    if ndim == 2:
        return jac[0][0] * jac[1][1] - jac[0][1] * jac[1][0]
    return (
        jac[0][0] * (jac[1][1] * jac[2][2] - jac[1][2] * jac[2][1])
        - jac[0][1] * (jac[1][0] * jac[2][2] - jac[1][2] * jac[2][0])
        + jac[0][2] * (jac[1][0] * jac[2][1] - jac[1][1] * jac[2][0])
    )


def jacobian_determinant(disp: Tensor) -> Tensor:
    """Jacobian determinant of the deformation ``φ(x) = x + disp(x)``.

    Derivatives are central differences in the interior and one-sided at the border (as
    ``torch.gradient``), per voxel, so ``J`` is dimensionless; ``J ≤ 0`` marks folding. A
    field is processed in slabs of the first spatial axis (each with one plane of its
    neighbours for the differences), so the nine derivative volumes of a 256³ field never
    exist at once; the values are those of the whole field.

    Args:
        disp: Displacement field, shape ``(B, N, *S)`` in voxels, ``N`` in {2, 3}, each spatial
            size ``>= 2``.

    Returns:
        ``(B, 1, *S)`` tensor of determinants (1 for a zero field, ``s**N`` for a uniform
        scaling by ``s``).

    Raises:
        TypeError: If ``disp`` is not a floating-point tensor.
        ValueError: If ``disp`` is not a field or a spatial size is below 2.
    """
    check_field("jacobian_determinant", "disp", disp)
    if min(disp.shape[2:]) < 2:
        raise ValueError(
            f"jacobian_determinant(): every spatial size of 'disp' must be >= 2, "
            f"got {tuple(disp.shape[2:])}"
        )
    size = disp.shape[2]
    if size <= 2 * _JACOBIAN_SLAB:
        return _determinant(disp).unsqueeze(1)
    parts = []
    for start in range(0, size, _JACOBIAN_SLAB):
        stop = min(start + _JACOBIAN_SLAB, size)
        low, high = max(start - 1, 0), min(stop + 1, size)
        # the neighbour planes give the slab's edge planes their central differences
        det = _determinant(disp[:, :, low:high])
        parts.append(det[:, start - low : start - low + stop - start])
    return torch.cat(parts, dim=1).unsqueeze(1)


class SpatialTransformer(nn.Module):
    """``nn.Module`` wrapper of :func:`warp` with a fixed ``mode`` and ``padding``."""

    def __init__(self, mode: str = "bilinear", padding: str = "border") -> None:
        super().__init__()
        check_option("SpatialTransformer", "mode", mode, WARP_MODES)
        check_option("SpatialTransformer", "padding", padding, PADDING_MODES)
        self.mode = mode
        self.padding = padding

    def forward(self, moving: Tensor, disp: Tensor) -> Tensor:
        """See :func:`warp`."""
        return warp(moving, disp, self.mode, self.padding)


class VelocityIntegrator(nn.Module):
    """``nn.Module`` wrapper of :func:`integrate_velocity` with a fixed number of steps."""

    def __init__(self, steps: int = 7) -> None:
        super().__init__()
        if steps < 0:
            raise ValueError(f"VelocityIntegrator(): 'steps' must be >= 0, got {steps}")
        self.steps = steps

    def forward(self, velocity: Tensor) -> Tensor:
        """See :func:`integrate_velocity`."""
        return integrate_velocity(velocity, self.steps)
