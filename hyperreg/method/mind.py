"""MIND-SSC: modality independent neighbourhood descriptors and the similarity built on them.

Each voxel gets a descriptor that says how alike small patches around it are to one another
(self-similarity), not what its intensities are, so a T2 and a T1 of the same anatomy get
similar descriptors. :func:`mind_ssc` computes the descriptor of an image, :func:`mind_loss`
the mean squared difference of two images' descriptors (a loss: 0 for equal descriptors).
Pure tensor functions on ``(B, 1, *S)`` images, 2D or 3D; differentiable in the image. Must not
import nibabel or hyperreg modules other than ``_checks`` and ``_errors``.

The self-similarity context (SSC): the ``2·N`` points one ``dilation`` away from a voxel along
each array axis (its six-neighbourhood in 3D) form the pairs that lie on two different axes
(12 in 3D, 4 in 2D); for each pair the patch distance is the mean over a
``(2·radius + 1)``-wide box (its voxels inside the image) of the squared intensity difference
between the image shifted to one point and to the other (the image extended by its border
values). Distances are turned into ``exp(−D / V)`` with ``V`` the voxel's
mean distance over the pairs (a local noise estimate, kept within ``[0.001, 1000]`` times its
mean over the image), then divided by their largest value per voxel, so each channel lies in
(0, 1] and one of them is 1.

References:
    Heinrich, Jenkinson, Bhushan, Matin, Gleeson, Brady, Schnabel. MIND: Modality independent
    neighbourhood descriptor for multi-modal deformable registration. Medical Image Analysis
    16(7), 2012. Heinrich, Jenkinson, Papiez, Brady, Schnabel. Towards realtime multimodal
    fusion for image-guided interventions using self-similarities (MIND-SSC). MICCAI 2013.
    Used as the similarity of multimodal deformable registration by deeds and ConvexAdam
    (Siebert, Hansen, Heinrich, MICCAI 2021); written here from the papers.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from hyperreg._checks import check_image, check_option, check_same_shape
from hyperreg._errors import InputError

__all__ = ["MIND_DILATION", "MIND_RADIUS", "mind_loss", "mind_ssc", "ssc_offsets"]

MIND_RADIUS = 1  # the patch: a box (2·radius + 1) voxels wide (3 × 3 × 3 in 3D)
MIND_DILATION = 2  # the neighbourhood's points lie this many voxels from the centre
_REDUCTIONS = ("mean", "none")


def ssc_offsets(ndim: int, dilation: int = 1) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The point pairs of the self-similarity context: each pair two of the ``2·ndim`` points
    ``±dilation`` voxels along one array axis, the two on different axes (12 pairs in 3D, 4 in
    2D), as voxel offsets in array-axis order.

    Raises:
        InputError: If ``ndim`` is not 2 or 3 or ``dilation`` is not a positive integer.
    """
    fn = "ssc_offsets"
    if ndim not in (2, 3):
        raise InputError(fn, "{0} must be 2 or 3, got {ndim!r}", "ndim", ndim=ndim)
    _check_positive(fn, "dilation", dilation)
    points = []
    for axis, sign in itertools.product(range(ndim), (-1, 1)):
        point = [0] * ndim
        point[axis] = sign * dilation
        points.append((axis, tuple(point)))
    return [(p, q) for (a, p), (b, q) in itertools.combinations(points, 2) if a != b]


def mind_ssc(image: Tensor, radius: int = MIND_RADIUS, dilation: int = MIND_DILATION) -> Tensor:
    """MIND-SSC descriptor of every voxel (see the module docstring).

    Args:
        image: ``(B, 1, *S)`` floating image, ``S`` = ``(H, W)`` or ``(D, H, W)``, any intensity
            units (the descriptor does not depend on them: a scaled or shifted image gives the
            same descriptor).
        radius: Patch half-width in voxels, ``>= 0`` (0: single voxels).
        dilation: Distance of the neighbourhood's points from the centre, voxels, ``>= 1``.

    Returns:
        ``(B, P, *S)`` descriptor, ``P`` = 12 in 3D and 4 in 2D (one channel per pair of
        :func:`ssc_offsets`), values in (0, 1], dtype of ``image`` (float32 at least). The image
        is extended by its border values (replicate) for the shifts; a box near the border
        averages its voxels inside the image.

    Raises:
        TypeError: If ``image`` is not a floating-point tensor.
        ValueError: If ``image`` is not ``(B, 1, *S)``, or ``radius``/``dilation`` is out of
            range.
    """
    fn = "mind_ssc"
    check_image(fn, "image", image)
    if image.shape[1] != 1:
        message = "{0} must have one channel, got shape {shape}"
        raise InputError(fn, message, "image", shape=tuple(image.shape))
    if isinstance(radius, bool) or not isinstance(radius, int) or radius < 0:
        raise InputError(fn, "{0} must be an integer >= 0, got {radius!r}", "radius", radius=radius)
    _check_positive(fn, "dilation", dilation)
    ndim = image.ndim - 2
    work = image.to(torch.promote_types(image.dtype, torch.float32))
    shape = work.shape[2:]
    padded = F.pad(work, [dilation] * (2 * ndim), mode="replicate")

    def shifted(offset: tuple[int, ...]) -> Tensor:
        index = tuple(slice(dilation + o, dilation + o + n) for o, n in zip(offset, shape))
        return padded[(slice(None), slice(None), *index)]

    pairs = ssc_offsets(ndim, dilation)
    squared = torch.cat([(shifted(p) - shifted(q)).square() for p, q in pairs], 1)
    squared = _box_mean(squared, radius)
    # the nearest pair at 0: its channel is exp(0) = 1, the largest, so the division by the
    # largest value of the definition is already done (and exp stays finite)
    distance = squared - squared.amin(1, keepdim=True)
    variance = distance.mean(1, keepdim=True)
    level = variance.flatten(1).mean(1).reshape(-1, *([1] * (ndim + 1)))
    variance = torch.maximum(torch.minimum(variance, level * 1000), level * 0.001)
    return torch.exp(distance * (-1.0 / variance.clamp_min(torch.finfo(work.dtype).tiny)))


def mind_loss(
    moved: Tensor,
    fixed: Tensor,
    radius: int = MIND_RADIUS,
    dilation: int = MIND_DILATION,
    reduction: str = "mean",
    fixed_descriptor: Tensor | None = None,
) -> Tensor:
    """Mean squared difference of the two images' MIND-SSC descriptors (:func:`mind_ssc`),
    over the voxels and the descriptor's channels: 0 when the descriptors agree, at most 1.

    Args:
        moved: Warped moving image ``(B, 1, *S)`` (2D or 3D), any intensity units.
        fixed: Fixed image, same shape.
        radius, dilation: As :func:`mind_ssc`.
        reduction: ``"mean"`` (scalar) or ``"none"`` (``(B,)``).
        fixed_descriptor: ``mind_ssc(fixed, radius, dilation)`` computed once (a loop over one
            fixed image), or None to compute it here; taken as given.

    Returns:
        Scalar or ``(B,)`` tensor in [0, 1] (float32, or float64 for float64 inputs); the
        gradient flows to ``moved`` (and to ``fixed`` unless ``fixed_descriptor`` is given).

    Raises:
        TypeError: If an input is not a floating-point tensor.
        ValueError: If the shapes differ, an image has more than one channel, ``reduction`` is
            unknown, or ``radius``/``dilation`` is out of range.

    References:
        Heinrich et al., Medical Image Analysis 2012 (MIND; the sum of squared descriptor
        differences as the similarity) and MICCAI 2013 (the SSC neighbourhood).
    """
    fn = "mind_loss"
    check_image(fn, "moved", moved)
    check_image(fn, "fixed", fixed)
    check_same_shape(fn, ("moved", "fixed"), moved, fixed)
    check_option(fn, "reduction", reduction, _REDUCTIONS)
    target = mind_ssc(fixed, radius, dilation) if fixed_descriptor is None else fixed_descriptor
    difference = (mind_ssc(moved, radius, dilation) - target).square()
    per_sample = difference.flatten(1).mean(1)
    return per_sample.mean() if reduction == "mean" else per_sample


def _box_sum(x: Tensor, radius: int) -> Tensor:
    """Sum over a ``(2·radius + 1)``-wide box around each voxel of ``x`` (``(B, C, *S)``), zero
    outside the image; separable, ``2·radius`` in-place additions per axis (no padded copy, no
    autograd graph)."""
    for dim in range(2, x.ndim):
        total, size = x.clone(), x.shape[dim]
        for shift in range(1, min(radius, size - 1) + 1):
            total.narrow(dim, shift, size - shift).add_(x.narrow(dim, 0, size - shift))
            total.narrow(dim, 0, size - shift).add_(x.narrow(dim, shift, size - shift))
        x = total
    return x


class _BoxMean(torch.autograd.Function):
    """Mean over the voxels of a box that lie inside the image: ``box_sum(x) / count``, with
    ``count`` the box's voxels inside. Linear, and the zero-padded box sum is its own adjoint,
    so the gradient is ``box_sum(grad / count)``: no autograd graph of the additions (whose
    slice gradients would each fill a padded copy with zeros)."""

    @staticmethod
    def forward(ctx, x: Tensor, radius: int) -> Tensor:  # type: ignore[override]
        ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
        count = _box_sum(ones, radius)
        ctx.save_for_backward(count)
        ctx.radius = radius
        return _box_sum(x, radius) / count

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (count,) = ctx.saved_tensors
        return _box_sum(grad / count, ctx.radius), None


def _box_mean(x: Tensor, radius: int) -> Tensor:
    """Mean of ``x`` (``(B, C, *S)``) over the voxels of a ``(2·radius + 1)``-wide box around
    each voxel that lie inside the image (:class:`_BoxMean`); ``x`` itself for radius 0."""
    return _BoxMean.apply(x, radius) if radius else x


def _check_positive(fn: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(fn, "{0} must be an integer >= 1, got {value!r}", name, value=value)
