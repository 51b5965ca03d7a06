"""Differentiable losses: local NCC, mutual information, scaled MSE, diffusion regulariser, Dice.

Every loss follows PyTorch's ``(prediction, target)`` order and takes ``reduction="mean"`` (a
scalar) or ``"none"`` (one value per sample, shape ``(B,)``), because HyperMorph weights each
sample's terms by that sample's own λ. Must not import nibabel or hyperreg modules other than
``_checks``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperreg._checks import check_field, check_image, check_option, check_same_shape

__all__ = [
    "NCC",
    "NCCReference",
    "dice_loss",
    "gradient_loss",
    "mi_loss",
    "mse_loss",
    "ncc_loss",
    "ncc_reference",
    "ngf_loss",
]

REDUCTIONS = ("mean", "none")


def _check_similarity_inputs(fn: str, moved: Tensor, fixed: Tensor, reduction: str) -> None:
    """The checks every similarity loss makes first: ``moved`` and ``fixed`` floating-point
    images of one shape, ``reduction`` one of :data:`REDUCTIONS` (errors name ``fn``)."""
    check_image(fn, "moved", moved)
    check_image(fn, "fixed", fixed)
    check_same_shape(fn, ("moved", "fixed"), moved, fixed)
    check_option(fn, "reduction", reduction, REDUCTIONS)


def _reduce(per_sample: Tensor, reduction: str) -> Tensor:
    return per_sample.mean() if reduction == "mean" else per_sample


def _box_sum(x: Tensor, window: int, padded: bool = False) -> Tensor:
    """Sum over a ``window``-wide cube around each voxel, zero padding outside the image.

    Separable; each axis sums shifted copies by doubling (widths 1, 2, 4, … added along the
    binary digits of ``window``): about ``2·log2(window)`` tensor additions per axis instead of
    a pooling kernel's ``window`` reads per voxel, and every sum still adds at most ``window``
    values, so it keeps the precision of a direct sum (a cumulative-sum filter does not: its
    differences of large running totals leave spurious variance in flat regions). The zero
    padding of every axis is added once, before the first axis (the sums along one axis of the
    other axes' zero margins stay 0). ``padded``: ``x`` already holds the image inside a zero
    margin of ``window // 2`` voxels per side (:func:`_padded`), so no padded copy is made.
    """
    ndim = x.ndim - 2
    half = window // 2
    run = F.pad(x, [half, half] * ndim) if half and not padded else x
    for axis in range(ndim):
        dim = axis + 2
        size = run.shape[dim] - 2 * half  # the image's size along this axis
        total, offset, width, digits = None, 0, 1, window
        while digits:
            if digits & 1:
                part = run.narrow(dim, offset, size)
                total = part if total is None else total + part
                offset += width
            digits >>= 1
            if digits:
                length = run.shape[dim] - width
                run = run.narrow(dim, 0, length) + run.narrow(dim, width, length)
                width *= 2
        run = total
    return run if half else run.clone()


def _padded(like: Tensor, channels: int, half: int) -> tuple[Tensor, Tensor]:
    """A buffer for :func:`_box_sum` with ``padded``: ``(B, channels, *(S + 2·half))`` with a
    zero margin of ``half`` voxels per side (``B`` and ``S`` those of ``like``, its dtype and
    device), and its interior ``(B, channels, *S)``, uninitialised, for the caller to fill (the
    terms of a box sum written in place instead of concatenated, then padded: two copies
    fewer)."""
    spatial = like.shape[2:]
    buffer = like.new_empty(like.shape[0], channels, *[s + 2 * half for s in spatial])
    for dim in range(2, buffer.ndim):
        buffer.narrow(dim, 0, half).zero_()
        buffer.narrow(dim, buffer.shape[dim] - half, half).zero_()
    interior = buffer[(slice(None), slice(None), *[slice(half, half + s) for s in spatial])]
    return buffer, interior


class _BoxMean(torch.autograd.Function):
    """Local mean with its own backward: the box filter is its own adjoint (a symmetric window
    with zero padding), so the gradient is the same filter applied to the incoming gradient,
    as cheap as the forward pass (autograd through the shifted slices allocated and filled a
    full-size zero tensor per slice)."""

    @staticmethod
    def forward(ctx, x: Tensor, window: int) -> Tensor:  # type: ignore[override]
        ctx.window = window
        return _box_sum(x, window) / float(window ** (x.ndim - 2))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        window = ctx.window
        return _box_sum(grad, window) / float(window ** (grad.ndim - 2)), None


def _box_mean(x: Tensor, window: int) -> Tensor:
    """Local mean over a ``window``-wide cube, zero padding outside the image
    (:func:`_box_sum` divided by the window's voxel count; differentiable once)."""
    return _BoxMean.apply(x, window)


def _unit_scale(image: Tensor) -> Tensor:
    """Divide each sample whose largest absolute value exceeds 1 by that value (detached)."""
    scale = image.detach().abs().flatten(1).amax(1).clamp_min(1.0)
    return image / scale.view(-1, *([1] * (image.ndim - 1)))


class NCCReference(NamedTuple):
    """The fixed image's share of local NCC, computed once (:func:`ncc_reference`).

    Attributes:
        fixed: The fixed image ``(B, C, *S)`` as NCC uses it (at least float32, divided by its
            largest absolute value where that exceeds 1).
        mean: Its local mean over the window, same shape.
        var: Its local variance over the window (clamped at 0), same shape.
        window: The box width the statistics were computed with.
    """

    fixed: Tensor
    mean: Tensor
    var: Tensor
    window: int


def ncc_reference(fixed: Tensor, window: int = 9) -> NCCReference:
    """The local statistics of a fixed image for :func:`ncc_loss`'s ``reference``.

    An optimisation against one fixed image (test-time refinement) computes them once instead of
    at every step: the box sums of the fixed image and of its square are then not recomputed,
    and the backward pass filters three channels instead of five. :func:`ncc_loss` with the
    reference gives the value and gradient it gives without it (tested to 1e-5).

    Args:
        fixed: Fixed image ``(B, C, *S)``, floating point; no gradient flows into it.
        window: Odd box width per axis (default 9), the one :func:`ncc_loss` will be called with.

    Returns:
        An :class:`NCCReference`.

    Raises:
        TypeError: If ``fixed`` is not a floating-point tensor.
        ValueError: If ``window`` is not a positive odd integer.
    """
    check_image("ncc_reference", "fixed", fixed)
    if window < 1 or window % 2 == 0:
        raise ValueError(f"ncc_reference(): 'window' must be a positive odd integer, got {window}")
    with torch.no_grad():
        work = torch.promote_types(fixed.dtype, torch.float32)
        scaled = _unit_scale(fixed.detach().to(work))
        mean, square = _box_sum(torch.cat([scaled, scaled * scaled], 1), window).chunk(2, 1)
        mean = mean / float(window ** (fixed.ndim - 2))
        square = square / float(window ** (fixed.ndim - 2))
        var = (square - mean * mean).clamp_min(0)
    return NCCReference(scaled, mean, var, window)


class _CachedNCC(torch.autograd.Function):
    """Local NCC map ``min(cc, 1)`` of ``moved`` against an :class:`NCCReference`, with its own
    backward: the chain rule through ``cc = cross² / (var_i · var_j + ε)`` written out, and the
    box filter (its own adjoint) applied once to the three stacked gradients of the moved
    image's local mean, mean square and mean product with the fixed image."""

    @staticmethod
    def forward(ctx, moved: Tensor, reference: NCCReference, eps: float) -> Tensor:  # type: ignore[override]
        window, fixed, mu_j, var_j = (
            reference.window,
            reference.fixed,
            reference.mean,
            reference.var,
        )
        count = float(window ** (moved.ndim - 2))
        terms, inside = _padded(moved, 3, window // 2)  # moved, its square, moved · fixed
        inside[:, 0:1].copy_(moved)
        torch.mul(moved, moved, out=inside[:, 1:2])
        torch.mul(moved, fixed, out=inside[:, 2:3])
        stats = _box_sum(terms, window, padded=True) / count
        mu_i, ii, ij = stats.chunk(3, 1)
        cross = ij - mu_i * mu_j
        var_raw = ii - mu_i * mu_i
        denominator = var_raw.clamp_min(0) * var_j + eps
        cc = cross * cross / denominator
        ctx.save_for_backward(moved, fixed, mu_i, mu_j, var_j, cross, var_raw, denominator, cc)
        ctx.window, ctx.count = window, count
        return cc.clamp(max=1.0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        moved, fixed, mu_i, mu_j, var_j, cross, var_raw, denominator, cc = ctx.saved_tensors
        grad = grad * (cc <= 1.0)  # clamp(max=1) passes the gradient where cc <= 1
        terms, inside = _padded(grad, 3, ctx.window // 2)  # d_mean, d_var, d_cross
        d_mean, d_var, d_cross = inside[:, 0:1], inside[:, 1:2], inside[:, 2:3]
        torch.div(grad * 2 * cross, denominator, out=d_cross)
        torch.mul(-grad * cc * var_j / denominator, var_raw >= 0, out=d_var)
        torch.sub(-d_cross * mu_j, 2 * d_var * mu_i, out=d_mean)
        back = _box_sum(terms, ctx.window, padded=True) / ctx.count
        b_mean, b_square, b_product = back.chunk(3, 1)
        return b_mean + 2 * moved * b_square + fixed * b_product, None, None


def ncc_loss(
    moved: Tensor,
    fixed: Tensor,
    window: int = 9,
    reduction: str = "mean",
    weight: Tensor | None = None,
    *,
    reference: NCCReference | None = None,
) -> Tensor:
    """Negative local (windowed) normalised cross-correlation.

    For each voxel, ``cc = cov(I, J)² / (var(I) · var(J) + ε)`` over a ``window``-wide box; the
    loss is ``−mean(cc)``, in ``[−1, 0]``: −1 for a perfect local linear match, 0 inside flat
    regions (windows are zero-padded at the border, as in VoxelMorph, so border windows of a
    constant image still correlate). ``ε = 1e-5 / window**(2N)`` makes it equal to VoxelMorph's
    sum-based form. Computed in at least float32 (float16/bfloat16 inputs are promoted, float64
    kept), so it stays finite under mixed precision and on constant images, never NaN.

    Scale: a sample whose largest absolute value ``m = max |x|`` (over channels and voxels)
    exceeds 1 is first divided by ``m``, so for images above [0, 1] ``ε`` is relative to their
    scale: raw scanner units (e.g. 0–4095) give what the same images min–max scaled to [0, 1]
    give, and flat windows (whose variance is float32 rounding noise at large scales) stay
    uncorrelated instead of counting as matches. Samples within [−1, 1] are used as they are, so
    [0, 1] inputs give exactly VoxelMorph's values (including its ``ε`` on dim, low-contrast
    images). An intensity offset is not removed (zero padding makes border windows depend on it).

    Args:
        moved: Warped moving image, shape ``(B, C, *S)``.
        fixed: Fixed image, same shape.
        window: Odd box width per axis (default 9).
        reduction: ``"mean"`` (scalar) or ``"none"`` (shape ``(B,)``).
        weight: Per-voxel weights ``(B, 1, *S)`` in [0, 1] (a cost mask: 0 leaves a voxel out),
            or None: the loss is ``−Σ w·cc / Σ w`` instead of the mean (0 where ``Σ w = 0``).
        reference: ``ncc_reference(fixed, window)`` computed once for this ``fixed`` (the
            same values and gradient, cheaper per call), or None. No gradient flows into
            ``fixed`` through a reference.

    Returns:
        The loss, a scalar or ``(B,)`` tensor (float32, or float64 for float64 inputs).

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If shapes differ, ``window`` is not a positive odd integer, ``reduction``
            is unknown, or ``reference`` was computed with another window or shape.

    References:
        Avants et al., SyN, MedIA 2008 (local CC); VoxelMorph (Balakrishnan et al., 2019).
    """
    _check_similarity_inputs("ncc_loss", moved, fixed, reduction)
    if window < 1 or window % 2 == 0:
        raise ValueError(f"ncc_loss(): 'window' must be a positive odd integer, got {window}")
    work = torch.promote_types(torch.promote_types(moved.dtype, fixed.dtype), torch.float32)
    moved = _unit_scale(moved.to(work))
    eps = 1e-5 / window ** (2 * (moved.ndim - 2))
    if reference is not None:
        if reference.window != window or reference.fixed.shape != fixed.shape:
            raise ValueError(
                f"ncc_loss(): 'reference' was computed for window {reference.window} and shape "
                f"{tuple(reference.fixed.shape)}, not window {window} and shape "
                f"{tuple(fixed.shape)}"
            )
        cc = _CachedNCC.apply(moved.to(reference.fixed.dtype), reference, eps)
    else:
        fixed = _unit_scale(fixed.to(work))
        stats = _box_mean(
            torch.cat([moved, fixed, moved * moved, fixed * fixed, moved * fixed], dim=1), window
        )
        mu_i, mu_j, ii, jj, ij = stats.chunk(5, dim=1)
        cross = ij - mu_i * mu_j
        var_i = (ii - mu_i * mu_i).clamp_min(0)
        var_j = (jj - mu_j * mu_j).clamp_min(0)
        cc = (cross * cross / (var_i * var_j + eps)).clamp(max=1.0)
    if weight is not None:
        w = weight.to(cc.dtype).expand_as(cc).flatten(1)
        weighted = (cc.flatten(1) * w).sum(1) / w.sum(1).clamp_min(1e-6)
        return _reduce(-weighted, reduction)
    return _reduce(-cc.flatten(1).mean(1), reduction)


def mi_loss(
    moved: Tensor,
    fixed: Tensor,
    bins: int = 32,
    sigma_ratio: float = 0.5,
    reduction: str = "mean",
) -> Tensor:
    """Negative global mutual information with Gaussian Parzen windows (differentiable).

    Each intensity, clamped to [0, 1], votes into ``bins`` evenly spaced bin centres ``c_k``
    (``0 .. 1``) with weights ``exp(−(x − c_k)² / (2σ²))`` normalised to sum to 1, where ``σ =
    sigma_ratio · (c_1 − c_0)``. The joint histogram is ``p_ab = mean_x w_a(x)ᵀ w_b(x)``, and
    ``MI = Σ p_ab log((p_ab + ε) / (p_a p_b + ε) + ε)`` with ``ε = 1e-7`` (nats). The loss is
    ``−MI``: 0 for independent images, ``−H(fixed)`` at best. Unlike local NCC it does not
    assume a linear intensity relation, so it suits pairs of different contrast (T1 → T2).
    Memory grows as ``voxels × bins`` per sample.

    Args:
        moved: Warped moving image ``(B, C, *S)``, intensities in [0, 1] (values outside are
            clamped, which has zero gradient there).
        fixed: Fixed image, same shape and range.
        bins: Number of histogram bins, ``>= 2`` (default 32).
        sigma_ratio: Parzen window width as a fraction of the bin spacing, ``> 0`` (0.5).
        reduction: ``"mean"`` (scalar) or ``"none"`` (``(B,)``).

    Returns:
        Scalar or ``(B,)`` tensor in nats (float32, or float64 for float64 inputs).

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If shapes differ, ``bins < 2``, ``sigma_ratio <= 0`` or ``reduction`` is
            unknown.

    References:
        Viola and Wells, IJCV 1997; Mattes et al., IEEE TMI 2003 (Parzen-window MI). Same
        formula as MONAI's ``GlobalMutualInformationLoss(kernel_type="gaussian")`` (from
        DeepReg); equal to it to float precision (tested).
    """
    _check_similarity_inputs("mi_loss", moved, fixed, reduction)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise ValueError(f"mi_loss(): 'bins' must be an integer >= 2, got {bins!r}")
    if not sigma_ratio > 0:
        raise ValueError(f"mi_loss(): 'sigma_ratio' must be > 0, got {sigma_ratio}")
    work = torch.promote_types(torch.promote_types(moved.dtype, fixed.dtype), torch.float32)
    centres = torch.linspace(0.0, 1.0, bins, device=moved.device, dtype=work)
    preterm = 1.0 / (2.0 * (sigma_ratio / (bins - 1)) ** 2)

    def parzen(image: Tensor) -> tuple[Tensor, Tensor]:
        values = image.to(work).clamp(0, 1).reshape(image.shape[0], -1, 1)
        weight = torch.exp(-preterm * (values - centres) ** 2)
        weight = weight / weight.sum(-1, keepdim=True)  # (B, V, bins)
        return weight, weight.mean(1, keepdim=True)  # (B, 1, bins)

    w_a, p_a = parzen(moved)
    w_b, p_b = parzen(fixed)
    joint = torch.bmm(w_a.transpose(1, 2), w_b) / w_a.shape[1]
    product = torch.bmm(p_a.transpose(1, 2), p_b)
    eps = 1e-7
    mi = (joint * torch.log((joint + eps) / (product + eps) + eps)).sum((1, 2))
    return _reduce(-mi, reduction)


def mse_loss(moved: Tensor, fixed: Tensor, sigma: float = 0.05, reduction: str = "mean") -> Tensor:
    """Mean squared intensity difference scaled by ``1 / sigma²`` (Gaussian likelihood).

    Args:
        moved: Warped moving image, shape ``(B, C, *S)``, intensities in [0, 1].
        fixed: Fixed image, same shape.
        sigma: Assumed image noise standard deviation, in intensity units (default 0.05, as in
            VoxelMorph's HyperMorph script).
        reduction: ``"mean"`` or ``"none"``.

    Returns:
        Scalar or ``(B,)`` tensor.

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If shapes differ, ``sigma <= 0`` or ``reduction`` is unknown.
    """
    _check_similarity_inputs("mse_loss", moved, fixed, reduction)
    if not sigma > 0:
        raise ValueError(f"mse_loss(): 'sigma' must be > 0, got {sigma}")
    work = torch.promote_types(torch.promote_types(moved.dtype, fixed.dtype), torch.float32)
    per_sample = (moved.to(work) - fixed.to(work)).pow(2).flatten(1).mean(1) / sigma**2
    return _reduce(per_sample, reduction)


def gradient_loss(field: Tensor, reduction: str = "mean") -> Tensor:
    """Diffusion regulariser: mean squared forward difference of a field ("Grad l2").

    ``L = (1/N) Σ_n mean((u(x + e_n) − u(x))²)`` over all channels and voxels, in voxels².

    Args:
        field: Displacement or velocity, shape ``(B, N, *S)``.
        reduction: ``"mean"`` or ``"none"``.

    Returns:
        Scalar or ``(B,)`` tensor.

    Raises:
        TypeError: If ``field`` is not a floating-point tensor.
        ValueError: If ``field`` is not a field or ``reduction`` is unknown.

    References:
        VoxelMorph's ``Grad('l2')`` (Balakrishnan et al., IEEE TMI 2019).
    """
    check_field("gradient_loss", "field", field)
    check_option("gradient_loss", "reduction", reduction, REDUCTIONS)
    ndim = field.ndim - 2
    terms = [torch.diff(field, dim=2 + axis).pow(2).flatten(1).mean(1) for axis in range(ndim)]
    return _reduce(torch.stack(terms, 0).mean(0), reduction)


def dice_loss(moved_seg: Tensor, fixed_seg: Tensor, reduction: str = "mean") -> Tensor:
    """Soft Dice loss ``1 − mean_l Dice_l`` on one-hot (or probabilistic) label maps.

    Args:
        moved_seg: Warped one-hot moving labels, shape ``(B, L, *S)``, values in [0, 1].
        fixed_seg: One-hot fixed labels, same shape.
        reduction: ``"mean"`` or ``"none"``.

    Returns:
        Scalar or ``(B,)`` tensor in [0, 1].

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If shapes differ or ``reduction`` is unknown.

    References:
        Milletari et al., V-Net, 3DV 2016; semi-supervised VoxelMorph (Balakrishnan et al., 2019).
    """
    check_image("dice_loss", "moved_seg", moved_seg)
    check_image("dice_loss", "fixed_seg", fixed_seg)
    check_same_shape("dice_loss", ("moved_seg", "fixed_seg"), moved_seg, fixed_seg)
    check_option("dice_loss", "reduction", reduction, REDUCTIONS)
    dims = tuple(range(2, moved_seg.ndim))
    top = 2 * (moved_seg * fixed_seg).sum(dims)
    bottom = (moved_seg + fixed_seg).sum(dims).clamp_min(1e-5)
    return _reduce(1 - (top / bottom).mean(1), reduction)


class NCC(nn.Module):
    """``nn.Module`` wrapper of :func:`ncc_loss` with a fixed ``window``."""

    def __init__(self, window: int = 9) -> None:
        super().__init__()
        self.window = window

    def forward(self, moved: Tensor, fixed: Tensor) -> Tensor:
        """See :func:`ncc_loss`."""
        return ncc_loss(moved, fixed, self.window)


def ngf_loss(moved: Tensor, fixed: Tensor, edge: float = 1.0, reduction: str = "mean") -> Tensor:
    """Negative normalised gradient fields: ``−mean_x cos²`` of the angle between the two
    images' intensity gradients, each damped where it is weak.

    Gradients are central differences (one-sided at the borders) along every spatial axis, in
    intensity per voxel. With ``∇a_ε = ∇a / sqrt(|∇a|² + ε_a²)``, the similarity is
    ``mean_x (∇a_ε · ∇b_ε)²`` in [0, 1]: 1 where every edge of one image lies along an edge of
    the other, with either sign (a T2's dark-to-bright edge is a T1's bright-to-dark one), 0
    for unrelated images. ``ε_a = edge · mean_x |∇a|`` per sample (a constant for the
    gradient), so flat noise counts little
    and the measure does not depend on the images' intensity units. It compares where edges
    lie, not what intensities are, so it suits pairs of different contrast; a field that moves
    edges without bringing them onto the other image's does not raise it.

    Args:
        moved: Warped moving image ``(B, 1, *S)`` (2D or 3D).
        fixed: Fixed image, same shape.
        edge: Damping as a share of the mean gradient magnitude, ``> 0`` (default 1: only
            edges stronger than the mean count fully).
        reduction: ``"mean"`` (scalar) or ``"none"`` (``(B,)``).

    Returns:
        Scalar or ``(B,)`` tensor in [-1, 0] (float32, or float64 for float64 inputs).

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If shapes differ, ``edge <= 0`` or ``reduction`` is unknown.

    References:
        Haber and Modersitzki, Intensity gradient based registration and fusion of
        multi-modal images, MICCAI 2006 (normalised gradient fields).
    """
    _check_similarity_inputs("ngf_loss", moved, fixed, reduction)
    if not edge > 0:
        raise ValueError(f"ngf_loss(): 'edge' must be > 0, got {edge}")
    work = torch.promote_types(torch.promote_types(moved.dtype, fixed.dtype), torch.float32)

    def unit_gradient(image: Tensor) -> Tensor:
        image = image.to(work)[:, 0]
        axes = tuple(range(1, image.ndim))
        grads = torch.stack(torch.gradient(image, dim=axes), 1)  # (B, ndim, *S)
        square = grads.square().sum(1, keepdim=True)
        # ε from the image as it is (no gradient through it; sqrt has none at 0)
        scale = edge * square.detach().sqrt().flatten(1).mean(1).clamp_min(1e-12)
        scale = scale.reshape(-1, *([1] * (grads.ndim - 1)))
        return grads / (square + scale.square()).sqrt()

    cosine = (unit_gradient(moved) * unit_gradient(fixed)).sum(1)
    return _reduce(-cosine.square().flatten(1).mean(1), reduction)
