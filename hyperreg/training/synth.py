"""Training by synthesis: registration pairs generated on the fly from label maps (SynthMorph).

Each synthetic pair starts from one label map (moving and fixed from the same map) or two
(different maps). Each side is made independently: the label map is moved by a random affine
jitter composed with a random smooth diffeomorphic deformation and resampled with nearest
neighbour (label ids stay exact), then every label gets a random intensity (a Gaussian mixture:
mean ~ U(0, 1), standard deviation ~ U(0, ``label_std``) per label), and the image is blurred,
multiplied by a smooth bias field, gamma-adjusted, given Gaussian noise and scaled to [0, 1].
Moving and fixed therefore differ in shape, contrast and artefacts, so a model trained on them
learns to register anatomy whatever scanner, contrast or person it sees.

The affine jitter (``RandAffineGrid``), blur (``RandGaussianSmooth``), bias (``RandBiasField``),
gamma (``RandAdjustContrast``) and noise (``RandGaussianNoise``) are MONAI's random transforms.
The smooth deformation is SynthMorph's: a stationary velocity field drawn as Gaussian noise on a
coarse control grid (every ``field_spacing`` voxels), upsampled linearly and integrated by
scaling and squaring (:func:`hyperreg.method.spatial.integrate_velocity`); MONAI's
``Rand3DElastic`` was 25× slower on a 160 × 192 × 224 grid and is not diffeomorphic. The
affine and the deformation are composed into one displacement, so each label map is
resampled once. Every random draw comes from one integer per pair drawn from the caller's
``torch.Generator``: the same generator state gives the same pair.

Must not import train, inference or cli.

References:
    Hoffmann, Billot, Greve, Iglesias, Fischl, Dalca. SynthMorph: learning contrast-invariant
    registration without acquired images. IEEE TMI 41(3), 2022 (arXiv:2004.10282).
    Billot et al., SynthSeg, MedIA 2023 (the Gaussian-mixture image model).
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hyperreg.method.spatial import identity_grid, integrate_velocity, warp
from hyperreg.training.batches import TrainBatch, label_indices, random_window
from hyperreg.training.foreground import foreground_centre
from hyperreg.training.sources import Scan, fit_to_shape, load_scan

__all__ = ["SynthPair", "SynthPairSampler", "label_maps_from_scans"]

logger = logging.getLogger(__name__)

_LOOKUP_LIMIT = 1 << 16  # label ids below this index a table directly (no np.unique)


def _plain(value: object) -> Tensor:
    """A MONAI output (MetaTensor or array) as a plain tensor."""
    as_tensor = getattr(value, "as_tensor", None)
    return as_tensor() if callable(as_tensor) else torch.as_tensor(value)


class SynthPair(NamedTuple):
    """One synthetic pair: images ``(1, *S)`` float32 in [0, 1] and their label maps
    ``(1, *S)`` int32 (ids from the source map(s), after deformation)."""

    moving: Tensor
    fixed: Tensor
    moving_seg: Tensor
    fixed_seg: Tensor


def label_maps_from_scans(
    scans: list[Scan],
    ndim: int,
    *,
    shape: tuple[int, ...] = (),
    slice_axis: int = 2,
    slice_step: int = 4,
    spacing: float = 0.0,
    orientation: str = "",
    centre: bool = False,
) -> list[np.ndarray]:
    """Label maps of ``scans`` for :class:`SynthPairSampler`, centred in the training grid.

    Scans without a label map are skipped. For a 2D model on 3D label maps, every
    ``slice_step``-th slice along ``slice_axis`` with at least 30 % of the map's largest
    labelled area becomes one 2D map (neighbouring 1 mm slices are nearly identical).

    Args:
        scans: Scans; only their ``seg`` files (and image headers) are read.
        ndim: 2 or 3.
        shape: Training grid (see :func:`~hyperreg.training.sources.fit_to_shape`); ``()``
            keeps each map's shape (then they must agree for batching).
        slice_axis: Axis cut for 2D maps from 3D ones.
        slice_step: Keep every ``slice_step``-th labelled slice (>= 1).
        spacing: Voxel size to resample to, as in
            :func:`~hyperreg.training.sources.load_scan`; 0 keeps the voxels.
        orientation: Storage orientation to resample 3D maps to, as in
            :func:`~hyperreg.training.sources.load_scan`.
        centre: Centre each map's labelled voxels in the grid (see
            :func:`~hyperreg.training.foreground.foreground_centre`).

    Returns:
        int32 label maps, each of shape ``shape`` (or its own shape).

    Raises:
        ValueError: If a 3D model is given 2D label maps.
    """
    maps: list[np.ndarray] = []
    for scan in scans:
        if scan.seg is None:
            continue
        seg = load_scan(scan, spacing=spacing, orientation=orientation)[1]
        assert seg is not None  # scan.seg is set
        if seg.ndim < ndim:
            raise ValueError(
                f"label_maps_from_scans(): a {ndim}D model needs {ndim}D label maps, got "
                f"'{scan.seg}' with shape {seg.shape}"
            )
        if seg.ndim > ndim:
            stack = np.moveaxis(seg, slice_axis, 0)
            area = (stack > 0).reshape(len(stack), -1).sum(1)
            keep = np.flatnonzero(area >= 0.3 * area.max())[:: max(1, slice_step)]
            slices = [stack[index] for index in keep]
        else:
            slices = [seg]
        maps += [
            fit_to_shape(s, shape, 0, foreground_centre(s, s, 0, shape) if centre else None)
            if shape
            else np.ascontiguousarray(s)
            for s in slices
        ]
    return maps


class SynthPairSampler:
    """Synthetic ``(moving, fixed)`` pairs from label maps, with the batch layout of
    :class:`~hyperreg.training.data.PairSampler`.

    Args:
        label_maps: Integer label maps, all ``ndim``-D of one shape (see
            :func:`label_maps_from_scans`).
        ndim: 2 or 3.
        crop: Size of a random window cut from the map(s) before synthesis (the same window
            for moving and fixed); ``()`` = whole maps.
        same_map_prob: Probability that moving and fixed come from one label map (always,
            with a single map).
        max_velocity: Largest standard deviation of the velocity field, in voxels; each pair
            side draws its own from U(0, ``max_velocity``).
        field_spacing: Voxels between control points of the velocity field.
        int_steps: Scaling-and-squaring steps.
        rotate_deg: Largest rotation, degrees (about each axis in 3D).
        scale: Largest relative scaling per axis (0.1 = ×0.9 to ×1.1).
        translate: Largest shift, as a fraction of each axis' size.
        shear: Largest shear factor.
        label_std: Largest within-label intensity standard deviation.
        blur: Range of the Gaussian blur σ, voxels.
        bias: Largest bias-field coefficient (MONAI ``RandBiasField``, degree 3).
        gamma: Range of the gamma exponent.
        noise: Largest noise standard deviation (intensities in [0, 1]).
        max_labels: Most labels per pair in :meth:`sample_batch`.

    Raises:
        ValueError: If ``label_maps`` is empty, of mixed shapes, not ``ndim``-D, not integer,
            or ``crop`` does not fit.

    References:
        Hoffmann et al., SynthMorph, IEEE TMI 2022 (the generative model and its ranges).
    """

    def __init__(
        self,
        label_maps: list[np.ndarray],
        ndim: int,
        *,
        crop: tuple[int, ...] = (),
        same_map_prob: float = 0.5,
        max_velocity: float = 3.0,
        field_spacing: int = 16,
        int_steps: int = 5,
        rotate_deg: float = 10.0,
        scale: float = 0.1,
        translate: float = 0.05,
        shear: float = 0.05,
        label_std: float = 0.05,
        blur: tuple[float, float] = (0.5, 1.5),
        bias: float = 0.3,
        gamma: tuple[float, float] = (0.5, 2.0),
        noise: float = 0.05,
        max_labels: int = 24,
    ) -> None:
        self.max_labels = max_labels
        if not label_maps:
            raise ValueError("SynthPairSampler(): 'label_maps' must not be empty")
        shapes = {m.shape for m in label_maps}
        if len(shapes) != 1 or len(next(iter(shapes))) != ndim:
            raise ValueError(
                f"SynthPairSampler(): label maps must be {ndim}D of one shape, got {sorted(shapes)}"
            )
        if any(m.dtype.kind not in "iub" for m in label_maps):
            raise ValueError("SynthPairSampler(): label maps must be integer arrays")
        self.ndim = ndim
        self.label_maps = [np.asarray(m, dtype=np.int32) for m in label_maps]
        self.spatial_shape = tuple(int(n) for n in label_maps[0].shape)
        self.crop = tuple(int(c) for c in crop)
        if self.crop and (
            len(self.crop) != ndim
            or any(not 0 < c <= s for c, s in zip(self.crop, self.spatial_shape))
        ):
            raise ValueError(
                f"SynthPairSampler(): 'crop' must give {ndim} sizes within the map shape "
                f"{self.spatial_shape}, got {self.crop}"
            )
        # MONAI takes seconds to import: only runs that synthesise pay for it
        from monai.transforms import (
            RandAdjustContrast,
            RandAffineGrid,
            RandBiasField,
            RandGaussianNoise,
            RandGaussianSmooth,
        )

        self.same_map_prob = same_map_prob
        self.max_velocity = max_velocity
        self.field_spacing = field_spacing
        self.int_steps = int_steps
        self.label_std = label_std
        size = self.crop or self.spatial_shape
        rotate = math.radians(rotate_deg)
        self._affine = RandAffineGrid(
            rotate_range=(rotate,) if ndim == 2 else (rotate,) * 3,
            shear_range=(shear,) * (2 if ndim == 2 else 6),
            translate_range=tuple(translate * n for n in size),
            scale_range=(scale,) * ndim,
        )
        sigma = {"sigma_x": blur, "sigma_y": blur, "sigma_z": blur}
        self._intensity = [  # blur, bias (then >= 0, as gamma needs), gamma, noise
            RandGaussianSmooth(prob=1.0, **sigma),
            RandBiasField(degree=3, coeff_range=(0.0, bias), prob=1.0),
            RandAdjustContrast(prob=1.0, gamma=gamma),
            RandGaussianNoise(prob=1.0, std=noise, sample_std=True),
        ]
        logger.info(
            "synthesis from %d label maps of shape %s", len(self.label_maps), self.spatial_shape
        )

    def _deform(self, seg: Tensor, rng: np.random.Generator) -> Tensor:
        """Label map ``(1, *S)`` float → moved by affine ∘ smooth deformation (nearest)."""
        shape = tuple(seg.shape[1:])
        self._affine.set_random_state(seed=int(rng.integers(2**31)))
        grid = _plain(self._affine(spatial_size=shape)).float()[: self.ndim]
        centre = torch.tensor([(n - 1) / 2 for n in shape]).view(-1, *([1] * self.ndim))
        affine_disp = (grid + centre)[None] - identity_grid(shape, seg.device, torch.float32)
        coarse = tuple(max(2, math.ceil(n / self.field_spacing) + 1) for n in shape)
        std = rng.uniform(0.0, self.max_velocity)
        velocity = torch.from_numpy(rng.normal(0.0, std, (1, self.ndim, *coarse))).float()
        mode = "bilinear" if self.ndim == 2 else "trilinear"
        # integrated at half resolution (the field is smooth), vectors doubled on the way up
        half = tuple(max(2, math.ceil(n / 2)) for n in shape)
        velocity = F.interpolate(velocity, size=half, mode=mode, align_corners=True) / 2
        smooth = integrate_velocity(velocity, self.int_steps)
        smooth = 2 * F.interpolate(smooth, size=shape, mode=mode, align_corners=True)
        # sample point A(x) + u(A(x)): the affine first, then the smooth deformation
        disp = affine_disp + warp(smooth, affine_disp, padding="border", exact=False)
        return warp(seg[None], disp, mode="nearest", padding="zeros", exact=False)[0]

    def _image(self, seg: Tensor, rng: np.random.Generator) -> Tensor:
        """Gaussian-mixture image of a label map ``(1, *S)``, artefacts, scaled to [0, 1]."""
        labels = seg.numpy().astype(np.int64)
        if labels.min() >= 0 and labels.max() < _LOOKUP_LIMIT:
            index = labels  # a lookup table over 0..max: one mean and std per possible id
            count = int(labels.max()) + 1
        else:
            index = np.unique(labels, return_inverse=True)[1].reshape(labels.shape)
            count = int(index.max()) + 1
        means = rng.uniform(0.0, 1.0, count)
        stds = rng.uniform(0.0, self.label_std, count)
        noise = rng.standard_normal(seg.shape)
        image = means[index] + stds[index] * noise
        image = torch.from_numpy(np.clip(image, 0.0, 1.0).astype(np.float32))
        for index, transform in enumerate(self._intensity):
            transform.set_random_state(seed=int(rng.integers(2**31)))
            image = _plain(transform(image)).float()
            if index == 1:  # after the bias field: gamma needs non-negative values
                image = image.clamp_min(0.0)
        low, high = float(image.min()), float(image.max())
        return (image - low) / (high - low) if high > low else torch.zeros_like(image)

    def pair(self, generator: torch.Generator) -> SynthPair:
        """One synthetic pair; all its randomness comes from one draw of ``generator``.

        Returns:
            The :class:`SynthPair`: images ``(1, *S)`` float32 in [0, 1] and label maps
            ``(1, *S)`` int32, ``S`` = ``crop`` or the maps' shape.
        """
        seed = int(torch.randint(2**62, (1,), generator=generator))
        rng = np.random.default_rng(seed)
        count = len(self.label_maps)
        first = int(rng.integers(count))
        second = first
        if count > 1 and rng.uniform() >= self.same_map_prob:
            second = (first + 1 + int(rng.integers(count - 1))) % count
        maps = [self.label_maps[first], self.label_maps[second]]
        if self.crop:
            window = random_window(
                self.spatial_shape, self.crop, torch.Generator().manual_seed(seed)
            )
            maps = [m[window] for m in maps]
        out = []
        for source in maps:
            seg = self._deform(torch.from_numpy(source.astype(np.float32))[None], rng)
            out.append((self._image(seg, rng), seg.round().to(torch.int32)))
        (moving, moving_seg), (fixed, fixed_seg) = out
        return SynthPair(moving, fixed, moving_seg, fixed_seg)

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``batch_size`` synthetic pairs.

        Returns:
            ``(moving, fixed)``, each ``(B, 1, *S)`` float32 on the CPU, intensities in [0, 1].
        """
        pairs = [self.pair(generator) for _ in range(batch_size)]
        return torch.stack([p.moving for p in pairs]), torch.stack([p.fixed for p in pairs])

    def sample_batch(self, batch_size: int, generator: torch.Generator) -> TrainBatch:
        """Draw ``batch_size`` synthetic pairs with their label maps as index maps (at most
        ``max_labels`` labels per pair, :func:`~hyperreg.training.batches.label_indices`). The
        image term is off for every pair (``image_pairs`` False): its two images have
        independent random contrasts, so only the labels say what corresponds, as in
        SynthMorph."""
        moving, fixed, moving_seg, fixed_seg = [], [], [], []
        for _ in range(batch_size):
            pair = self.pair(generator)
            maps = [pair.moving_seg[0].numpy(), pair.fixed_seg[0].numpy()]
            ids = np.union1d(np.unique(maps[0]), np.unique(maps[1]))
            indexed = label_indices(maps, ids[ids > 0], self.max_labels, generator)
            moving.append(pair.moving)
            fixed.append(pair.fixed)
            moving_seg.append(torch.from_numpy(indexed[0])[None])
            fixed_seg.append(torch.from_numpy(indexed[1])[None])
        return TrainBatch(
            torch.stack(moving),
            torch.stack(fixed),
            torch.stack(moving_seg),
            torch.stack(fixed_seg),
            torch.zeros(batch_size, dtype=torch.bool),
        )
