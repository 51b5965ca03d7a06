"""The registration objective, written once: what training, validation and refinement minimise.

    loss(λ) = mean_i [ (1 − λ_i) · D_i + λ_i · k · R_i ]
    D_i     = image_weight · S_i · [image similarity applies to sample i]
            + label_weight · L_i · [sample i has label maps]

``S`` is the image dissimilarity (local NCC, scaled MSE or mutual information, each a loss:
lower is better), ``L`` the label overlap loss of the warped moving label map against the fixed
one (soft Dice over the labels present in either map, or MSE of one-hot probabilities as
SynthMorph does), ``R`` the diffusion regulariser (mean squared spatial gradient) of the field
the network predicts, and ``k`` VoxelMorph's ``loss_mult``: ``int_downsize`` when that field is a
velocity at ``1/int_downsize`` resolution, else 1, so λ stays on the scale of published
HyperMorph λ. A sample whose image pair is not comparable by intensity (a synthetic pair with
two random contrasts) sets ``image_pairs[i] = False`` and is driven by its labels alone.

The settings are a frozen dataclass stored in every checkpoint (``"objective"``), so a model is
refined and validated on exactly what it was trained on. Must not import geometry, training,
registration, apps or cli.

References:
    Hoopes, Hoffmann, Fischl, Guttag, Dalca. HyperMorph. IPMI 2021; MELBA 2022 (the λ-weighted
    loss). Balakrishnan et al. VoxelMorph. IEEE TMI 2019 (NCC, Grad-l2 with
    ``loss_mult=int_downsize``, the auxiliary Dice term). Hoffmann et al. SynthMorph. IEEE TMI
    2022, and its hypernetwork variant (Hoffmann et al., Imaging Neuroscience 2024): the
    anatomy-aware label term; MSE on one-hot label probabilities (voxelmorph#579).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from hyperreg.method.losses import (
    NCCReference,
    gradient_loss,
    mi_loss,
    mse_loss,
    ncc_loss,
    ngf_loss,
)
from hyperreg.method.mind import mind_loss, mind_ssc
from hyperreg.method.spatial import warp
from hyperreg.method.similarities import SIMILARITIES as SIMILARITY_NAMES

__all__ = [
    "LABEL_LOSSES",
    "SIMILARITIES",
    "Objective",
    "ObjectiveTerms",
    "one_hot",
    "pooled_one_hot",
]

SIMILARITIES = tuple(SIMILARITY_NAMES)  # the registry, hyperreg.method.similarities
LABEL_LOSSES = ("none", "dice", "mse")


class ObjectiveTerms(NamedTuple):
    """One evaluation of the objective.

    Attributes:
        loss: Scalar to minimise (mean over the batch of each sample's λ-weighted loss).
        similarity: ``(B,)`` the data term ``D_i`` (image and label parts, weighted).
        image: ``(B,)`` image dissimilarity ``S_i`` (computed for every sample).
        labels: ``(B,)`` label overlap loss ``L_i`` (0 where a sample has no label maps).
        smoothness: ``(B,)`` ``k · R_i``, the regulariser as it enters the loss.
    """

    loss: Tensor
    similarity: Tensor
    image: Tensor
    labels: Tensor
    smoothness: Tensor


def one_hot(index: Tensor, classes: int) -> Tensor:
    """One-hot float encoding of an index map.

    Args:
        index: ``(B, 1, *S)`` integer map with values in ``[0, classes)``.
        classes: Number of channels ``L``.

    Returns:
        ``(B, L, *S)`` float32, channel ``l`` is 1 where ``index == l``.
    """
    out = F.one_hot(index[:, 0].long(), classes)
    return out.movedim(-1, 1).float()


def pooled_one_hot(index: Tensor, classes: int, factor: int) -> Tensor:
    """The share of each label in each ``factor``-wide block: ``avg_pool(one_hot(index), factor)``
    without the full-resolution one-hot (``L`` times the map's size, then read again to pool).

    Each block's ``factor**N`` voxels add ``1 / factor**N`` to their label's channel
    (``scatter_add``); the values are exact (multiples of a power of two) and equal those of
    ``torch.nn.functional.avg_pool{N}d(one_hot(index, classes), factor)``, which also drops the
    voxels past the last whole block.

    Args:
        index: ``(B, 1, *S)`` integer map with values in ``[0, classes)``, ``N = len(S)``.
        classes: Number of channels ``L``.
        factor: Block width in voxels along every axis, >= 1.

    Returns:
        ``(B, L, *(S // factor))`` float32.
    """
    batch, spatial = index.shape[0], tuple(index.shape[2:])
    coarse = [size // factor for size in spatial]
    crop = (slice(None), 0, *[slice(0, c * factor) for c in coarse])
    blocks = [batch]
    for size in coarse:
        blocks += [size, factor]
    ndim = len(spatial)
    # (B, c0, f, c1, f, ...) -> (B, f**N offsets within a block, c0 * c1 * ... blocks)
    order = [0, *[2 + 2 * i for i in range(ndim)], *[1 + 2 * i for i in range(ndim)]]
    cells = index[crop].long().reshape(blocks).permute(order).reshape(batch, factor**ndim, -1)
    share = torch.full(cells.shape, 1.0 / factor**ndim, device=index.device)
    out = torch.zeros(batch, classes, cells.shape[-1], device=index.device)
    return out.scatter_add_(1, cells, share).reshape(batch, classes, *coarse)


@dataclass(frozen=True)
class Objective:
    """Settings of the objective (see the module docstring for the formula).

    Attributes:
        similarity: ``"ncc"`` (local NCC, :func:`~hyperreg.method.losses.ncc_loss`), ``"mse"``
            (MSE / σ², :func:`~hyperreg.method.losses.mse_loss`) or ``"mi"`` (mutual
            information, :func:`~hyperreg.method.losses.mi_loss`, for refinement across
            contrasts) or ``"ngf"`` (normalised gradient fields,
            :func:`~hyperreg.method.losses.ngf_loss`, the verdict across contrasts) or
            ``"mind"`` (MIND-SSC descriptors, :func:`~hyperreg.method.mind.mind_loss`, for
            refinement across contrasts).
        ncc_window: NCC box width per axis.
        mse_sigma: σ of the MSE term (intensities in [0, 1]).
        label_loss: ``"none"``, ``"dice"`` (1 − mean soft Dice over the labels present in the
            moving or fixed map of the sample, background excluded) or ``"mse"`` (mean over
            voxels of the squared difference of one-hot probabilities, summed over the present
            labels and background).
        label_weight: Weight of the label term in ``D``.
        image_weight: Weight of the image term in ``D``.
        int_downsize: ``k`` for a velocity predicted at ``1/int_downsize`` resolution.
        label_downsize: Evaluate the label term on a grid this many times coarser: one-hot
            maps average-pooled (label probabilities), the displacement pooled and scaled to
            coarse voxels. 2 makes the term 8× cheaper in 3D, at the resolution of a
            half-resolution velocity; 1 is exact.

    Raises:
        ValueError: On an unknown ``similarity`` or ``label_loss``, or negative weights.
    """

    similarity: str = "ncc"
    ncc_window: int = 9
    mse_sigma: float = 0.05
    label_loss: str = "none"
    label_weight: float = 1.0
    image_weight: float = 1.0
    int_downsize: int = 2
    label_downsize: int = 1

    def __post_init__(self) -> None:
        if self.label_downsize not in (1, 2, 4):
            raise ValueError(
                f"Objective(): 'label_downsize' must be 1, 2 or 4, got {self.label_downsize}"
            )
        if self.similarity not in SIMILARITIES:
            raise ValueError(
                f"Objective(): 'similarity' must be one of {SIMILARITIES}, got {self.similarity!r}"
            )
        if self.label_loss not in LABEL_LOSSES:
            raise ValueError(
                f"Objective(): 'label_loss' must be one of {LABEL_LOSSES}, got {self.label_loss!r}"
            )
        if self.label_weight < 0 or self.image_weight < 0:
            raise ValueError(
                "Objective(): 'label_weight' and 'image_weight' must be >= 0, got "
                f"{self.label_weight} and {self.image_weight}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Objective:
        """Settings from a checkpoint's ``"objective"`` entry (unknown keys are an error)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Objective.from_dict(): unknown keys {unknown}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the settings (what checkpoints store)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def image_term(
        self,
        moved: Tensor,
        fixed: Tensor,
        weight: Tensor | None = None,
        reference: NCCReference | None = None,
    ) -> Tensor:
        """``(B,)`` image dissimilarity of ``moved`` against ``fixed`` (``(B, C, *S)``);
        ``weight`` (``(B, 1, *S)``, a cost mask) weighs the voxels of local NCC (the other
        similarities ignore it); ``reference`` (``ncc_reference(fixed, self.ncc_window)``,
        computed once) is the fixed image's NCC statistics (the other similarities ignore it)."""
        if self.similarity == "ncc":
            window = self.ncc_window
            return ncc_loss(
                moved, fixed, window=window, reduction="none", weight=weight, reference=reference
            )
        if self.similarity == "mse":
            return mse_loss(moved, fixed, sigma=self.mse_sigma, reduction="none")
        if self.similarity == "ngf":
            return ngf_loss(moved, fixed, reduction="none")
        if self.similarity == "mind":
            with torch.set_grad_enabled(fixed.requires_grad):
                target = mind_ssc(fixed)
            return mind_loss(moved, fixed, reduction="none", fixed_descriptor=target)
        return mi_loss(moved, fixed, reduction="none")

    def smoothness(self, field: Tensor, image_shape: tuple[int, ...]) -> Tensor:
        """``(B,)`` ``k · R``: Grad-l2 of ``field`` (``(B, N, *S_field)``), times
        ``int_downsize`` when the field is smaller than ``image_shape`` (a half-resolution
        velocity)."""
        smooth = gradient_loss(field, reduction="none")
        if tuple(field.shape[2:]) != tuple(image_shape) and self.int_downsize > 1:
            smooth = smooth * self.int_downsize
        return smooth

    def label_term(self, moved_labels: Tensor, fixed_labels: Tensor) -> Tensor:
        """``(B,)`` label overlap loss of warped one-hot maps.

        Args:
            moved_labels: ``(B, L, *S)`` warped one-hot moving map (probabilities in [0, 1]).
            fixed_labels: ``(B, L, *S)`` one-hot fixed map; channel 0 is background.

        Returns:
            ``(B,)``: 0 for a sample with no foreground label in either map.
        """
        dims = tuple(range(2, fixed_labels.ndim))
        present = (fixed_labels.sum(dims) + moved_labels.sum(dims)) > 0  # (B, L)
        if self.label_loss == "mse":
            squared = (moved_labels - fixed_labels).pow(2).mean(dims)
            return (squared * present).sum(1)
        top = 2 * (moved_labels * fixed_labels)[:, 1:].sum(dims)
        bottom = (moved_labels + fixed_labels)[:, 1:].sum(dims).clamp_min(1e-5)
        mask = present[:, 1:].float()
        count = mask.sum(1)
        dice = (top / bottom * mask).sum(1) / count.clamp_min(1)
        return torch.where(count > 0, 1 - dice, torch.zeros_like(dice))

    def __call__(
        self,
        moved: Tensor,
        fixed: Tensor,
        field: Tensor,
        lam: Tensor | float,
        *,
        disp: Tensor | None = None,
        moving_labels: Tensor | None = None,
        fixed_labels: Tensor | None = None,
        image_pairs: Tensor | None = None,
    ) -> ObjectiveTerms:
        """Evaluate the objective for a batch.

        Args:
            moved: ``(B, C, *S)`` warped moving images.
            fixed: ``(B, C, *S)`` fixed images.
            field: The regularised field, ``(B, N, *S_field)``: the velocity (possibly at
                ``1/int_downsize`` resolution) or the displacement, in voxels.
            lam: λ per sample ``(B,)`` or one value, in [0, 1].
            disp: ``(B, N, *S)`` displacement in voxels (array-axis order) that warps the moving
                label map; needed with label maps.
            moving_labels: ``(B, 1, *S)`` integer index map of the moving labels
                (0 = background, ``1..L-1`` the labels of the pair), or None.
            fixed_labels: Same for the fixed image, with the same index meaning.
            image_pairs: ``(B,)`` bool, where the image term applies (default: everywhere).

        Returns:
            :class:`ObjectiveTerms`.

        Raises:
            ValueError: If label maps are given without ``disp``, or only one of them.
        """
        batch = moved.shape[0]
        lam_t = torch.as_tensor(lam, dtype=torch.float32, device=moved.device).reshape(-1)
        lam_t = lam_t.expand(batch) if lam_t.numel() == 1 else lam_t
        image = self.image_term(moved, fixed).float()
        weight = torch.full((batch,), self.image_weight, device=moved.device)
        if image_pairs is not None:
            weight = weight * image_pairs.to(device=moved.device, dtype=torch.float32)
        data = weight * image
        labels = torch.zeros_like(image)
        if (moving_labels is None) != (fixed_labels is None):
            raise ValueError("Objective(): give both 'moving_labels' and 'fixed_labels' or neither")
        if moving_labels is not None and self.label_loss != "none" and self.label_weight > 0:
            if disp is None:
                raise ValueError("Objective(): label maps need the displacement 'disp'")
            classes = int(max(moving_labels.max(), fixed_labels.max())) + 1
            factor = self.label_downsize
            if factor > 1:  # each map's label shares per block; the displacement in block units
                moving_hot = pooled_one_hot(moving_labels, classes, factor)
                fixed_hot = pooled_one_hot(fixed_labels, classes, factor)
                pool = F.avg_pool2d if disp.ndim == 4 else F.avg_pool3d
                disp = pool(disp, factor) / factor
            else:
                moving_hot = one_hot(moving_labels, classes)
                fixed_hot = one_hot(fixed_labels, classes)
            moved_labels = warp(moving_hot, disp)
            labels = self.label_term(moved_labels, fixed_hot).float()
            data = data + self.label_weight * labels
        smooth = self.smoothness(field, tuple(fixed.shape[2:])).float()
        loss = ((1 - lam_t) * data + lam_t * smooth).mean()
        return ObjectiveTerms(loss, data, image, labels, smooth)
