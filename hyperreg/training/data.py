"""Training data: random pairs from scans held in memory, and the names training data uses.

:class:`PairSampler` draws subject-to-subject pairs (moving ≠ fixed) within one source, or atlas
to subject. For 2D training from 3D volumes, slices are cut along one axis (axis 2 is coronal in
neurite-oasis) from the range where every subject has brain, so a CPU can train a useful 2D
model in minutes. Randomness always comes from an explicit ``torch.Generator``.

The rest of the training data lives by concept and is re-exported here: scans (every layout,
person ids, loading onto a training grid) in :mod:`hyperreg.training.sources`; the batch
layout, mixing of pair sources and λ sampling in :mod:`hyperreg.training.batches`; splits by
person and validation pairs in :mod:`hyperreg.training.holdout`; where the brain lies in
:mod:`hyperreg.training.foreground`. Must not import model, train, inference or cli.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.training.batches import (
    LambdaSampler,
    MixtureSampler,
    TrainBatch,
    batch_of,
    label_indices,
    random_window,
    stack_images,
    stack_labels,
)
from hyperreg.training.foreground import brain_slices, foreground_centre
from hyperreg.training.holdout import (
    ValidationPair,
    split_people,
    split_subjects,
    validation_pairs,
)
from hyperreg.training.sources import Scan, find_scans, fit_to_shape, load_scan

__all__ = [
    "LambdaSampler",
    "MixtureSampler",
    "PairSampler",
    "Scan",
    "TrainBatch",
    "ValidationPair",
    "batch_of",
    "find_scans",
    "foreground_centre",
    "label_indices",
    "random_window",
    "split_people",
    "split_subjects",
    "validation_pairs",
]

logger = logging.getLogger(__name__)


class PairSampler:
    """Random (moving, fixed) training pairs held in memory.

    Subject-to-subject: moving and fixed are two different scans (with one scan, two different
    slices). Atlas mode: ``fixed`` is always the atlas. For ``ndim=2`` with 3D scans, moving and
    fixed are the same slice index along ``slice_axis`` of two scans, drawn from the slices where
    every scan has brain.

    Args:
        scans: Scans of one space (affinely aligned, as neurite-oasis is): one grid shape, or
            any shapes with ``shape`` given.
        ndim: 2 or 3.
        atlas: Optional atlas image path (fixed image of every pair).
        slice_axis: Axis cut for 2D training from 3D volumes.
        normalization: Intensity normalisation, see :func:`normalize_intensity`.
        holdout_every: For 2D slices cut from volumes: hold out every ``holdout_every``-th brain
            slice (starting at ``holdout_every // 2``) from training, for validation; they are
            listed in ``heldout_slices``. 0 = train on every brain slice.
        crop: Random crop size per pair (one size per spatial axis; the same window for moving
            and fixed), drawn from the generator; ``()`` = whole images.
        shape: Training grid, one size per spatial axis of a training image: every scan (every
            slice, for 2D from 3D) is centred in it by :func:`fit_to_shape` (zero padding or
            central crop, no interpolation). ``()``: scans must share one shape.
        spacing: Resample every scan to isotropic ``spacing`` mm voxels first (see
            :func:`~hyperreg.training.sources.load_scan`); 0 keeps their voxels.
        labels: Load the scans' label maps too (:meth:`sample_batch` returns them as index
            maps for the anatomy-aware label term).
        orientation: Resample every 3D scan to this storage orientation (e.g. ``"RAS"``) first,
            so people stored LIA, PSR or RAS reach the network alike; ``""`` keeps their axes.
        centre: With ``shape``, centre each scan's foreground (:func:`foreground_centre`)
            rather than its array in the training grid: for sources whose people each lie in
            their own position (IXI, FreeSurfer native space).
        max_labels: Most labels per pair in :meth:`sample_batch` (see :func:`label_indices`).

    Raises:
        ValueError: If scans differ in shape (without ``shape``), a 2D model is asked for 3D
            scans with no axis, a 3D model for 2D scans, there are fewer than two images to
            pair, or ``crop`` or ``shape`` does not fit.
    """

    def __init__(
        self,
        scans: list[Scan],
        ndim: int,
        atlas: str | Path | None = None,
        slice_axis: int = 2,
        normalization: str = DEFAULT_NORMALIZATION,
        holdout_every: int = 0,
        crop: tuple[int, ...] = (),
        *,
        shape: tuple[int, ...] = (),
        spacing: float = 0.0,
        labels: bool = False,
        orientation: str = "",
        centre: bool = False,
        max_labels: int = 24,
    ) -> None:
        self.ndim = ndim
        self.max_labels = max_labels
        self.slice_axis = slice_axis
        self.heldout_slices: np.ndarray | None = None
        self.slices: np.ndarray | None = None
        options = {
            "normalization": normalization,
            "spacing": spacing,
            "with_seg": labels,
            "orientation": orientation,
        }
        volumes, segs = self._load(scans, atlas, options)
        shape = tuple(int(n) for n in shape)
        data_ndim, shapes = self._check_grids(volumes, shape)
        if data_ndim > ndim:
            volumes, segs = self._to_slices(volumes, segs, shapes, shape, holdout_every)
        if shape:
            volumes, segs = self._fit(volumes, segs, shape, centre)
        self.volumes = volumes
        self.segs = segs
        self.label_ids = [None if g is None else np.unique(g[g > 0]) for g in segs]
        if self.atlas is None and len(volumes) < 2 and self.slices is None:
            raise ValueError("PairSampler(): need at least two scans (or an atlas) to make pairs")
        self.crop = self._check_crop(crop)
        # shapes in the scans' own axis order (the slice axis was moved first)
        shown = volumes[0].shape
        if self.slices is not None:
            shown = np.moveaxis(volumes[0], 0, slice_axis).shape
        logger.info(
            "pairs from %d scans of shape %s%s",
            len(volumes),
            shown,
            "" if self.slices is None else f", {len(self.slices)} slices along axis {slice_axis}",
        )

    def _load(
        self, scans: list[Scan], atlas: str | Path | None, options: dict
    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """Read the scans (and ``self.atlas``) in C order: scans come in NIfTI's Fortran order,
        and batching such a volume cost a transposing copy per image in every step (30 ms at
        160 × 192 × 224; now 7 ms). Returns ``(volumes, label maps or None)``."""
        loaded = [load_scan(scan, **options) for scan in scans]
        volumes = [np.ascontiguousarray(image) for image, _ in loaded]
        segs = [None if seg is None else np.ascontiguousarray(seg) for _, seg in loaded]
        self.atlas = (
            np.ascontiguousarray(load_scan(Scan(Path(atlas)), **options)[0]) if atlas else None
        )
        return volumes, segs

    def _check_grids(
        self, volumes: list[np.ndarray], shape: tuple[int, ...]
    ) -> tuple[int, set[tuple[int, ...]]]:
        """Check that the scans (and atlas) fit one model and one grid; returns their
        dimensionality and their set of shapes."""
        ndim = self.ndim
        everything = volumes + ([self.atlas] if self.atlas is not None else [])
        dims = {v.ndim for v in everything}
        if len(dims) != 1:
            raise ValueError(
                f"PairSampler(): scans must all be 2D or all 3D, got shapes "
                f"{sorted({v.shape for v in everything})}"
            )
        if shape and (len(shape) != ndim or min(shape) < 1):
            raise ValueError(f"PairSampler(): 'shape' must give {ndim} sizes >= 1, got {shape}")
        shapes = {v.shape for v in everything}
        if len(shapes) != 1 and not shape:
            raise ValueError(
                f"PairSampler(): all scans must share one grid shape (affinely aligned), got "
                f"{sorted(shapes)}; resample them to a common space first (or give a training "
                "grid 'shape')"
            )
        data_ndim = dims.pop()
        if data_ndim < ndim:
            raise ValueError(
                f"PairSampler(): a {ndim}D model needs {ndim}D scans, got {data_ndim}D"
            )
        return data_ndim, shapes

    def _to_slices(
        self,
        volumes: list[np.ndarray],
        segs: list[np.ndarray | None],
        shapes: set[tuple[int, ...]],
        shape: tuple[int, ...],
        holdout_every: int,
    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """For 2D pairs from 3D scans: the slice axis moved first (cutting a slice is then a
        cheap contiguous copy), ``self.slices`` set to the brain slices and ``holdout_every``-th
        of them held out in ``self.heldout_slices``."""
        slice_axis = self.slice_axis
        volumes = [np.ascontiguousarray(np.moveaxis(v, slice_axis, 0)) for v in volumes]
        if self.atlas is not None:
            self.atlas = np.ascontiguousarray(np.moveaxis(self.atlas, slice_axis, 0))
        if shape and len(shapes) != 1 and len({v.shape[0] for v in volumes}) != 1:
            raise ValueError(
                f"PairSampler(): 2D slices of 3D scans need one size along 'slice_axis' "
                f"{slice_axis}, got shapes {sorted(shapes)}"
            )
        self.slices = brain_slices(volumes, 0)
        if holdout_every > 0:
            held = self.slices[holdout_every // 2 :: holdout_every]
            self.heldout_slices = held
            self.slices = np.setdiff1d(self.slices, held)
        segs = [
            None if g is None else np.ascontiguousarray(np.moveaxis(g, slice_axis, 0)) for g in segs
        ]
        return volumes, segs

    def _fit(
        self,
        volumes: list[np.ndarray],
        segs: list[np.ndarray | None],
        shape: tuple[int, ...],
        centre: bool,
    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """Every scan (and the atlas) centred in the training grid ``shape``: its array, or
        with ``centre`` its foreground (:func:`foreground_centre`)."""
        first = 0 if self.slices is None else 1
        centres = [
            foreground_centre(v, g, first, shape) if centre else None for v, g in zip(volumes, segs)
        ]
        volumes = [fit_to_shape(v, shape, first, c) for v, c in zip(volumes, centres)]
        segs = [
            None if g is None else fit_to_shape(g, shape, first, c) for g, c in zip(segs, centres)
        ]
        if self.atlas is not None:
            self.atlas = fit_to_shape(self.atlas, shape, first)
        return volumes, segs

    def _check_crop(self, crop: tuple[int, ...]) -> tuple[int, ...]:
        """``crop`` as ints, checked against the training image shape."""
        crop = tuple(int(c) for c in crop)
        if crop and (
            len(crop) != self.ndim or any(not 0 < c <= s for c, s in zip(crop, self.spatial_shape))
        ):
            raise ValueError(
                f"PairSampler(): 'crop' must give {self.ndim} sizes within the image shape "
                f"{self.spatial_shape}, got {crop}"
            )
        return crop

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        """Shape of one training image."""
        shape = self.volumes[0].shape
        return shape if self.slices is None else shape[1:]

    def _cut(self, volume: np.ndarray, index: int) -> np.ndarray:
        return volume if self.slices is None else volume[index]

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``batch_size`` pairs.

        Returns:
            ``(moving, fixed)``, each ``(B, 1, *S)`` float32 on the CPU, intensities in [0, 1].
        """
        batch = self.sample_batch(batch_size, generator)
        return batch.moving, batch.fixed

    def _pick(self, generator: torch.Generator) -> tuple[int | None, int, int, int]:
        """``(moving scan or None for the atlas side, fixed scan, moving slice, fixed slice)``;
        the moving side is always a scan, ``fixed`` is -1 for the atlas."""
        count = len(self.volumes)
        index = 0
        if self.slices is not None:
            index = int(self.slices[torch.randint(len(self.slices), (1,), generator=generator)])
        a = int(torch.randint(count, (1,), generator=generator))
        if self.atlas is not None:
            return a, -1, index, index
        if count >= 2:
            b = int(torch.randint(count - 1, (1,), generator=generator))
            return a, (b + 1 if b >= a else b), index, index
        other = int(self.slices[torch.randint(len(self.slices), (1,), generator=generator)])
        return 0, 0, other, index

    def sample_batch(self, batch_size: int, generator: torch.Generator) -> TrainBatch:
        """Draw ``batch_size`` pairs with their label maps (see :class:`TrainBatch`).

        A pair whose two scans both have label maps gets index maps over the labels of the two
        (at most ``max_labels``, drawn at random when there are more); otherwise its index maps
        are 0 (no label term). The image term applies to every real pair.
        """
        moving, fixed, moving_seg, fixed_seg = [], [], [], []
        for _ in range(batch_size):
            a, b, index_a, index_b = self._pick(generator)
            moving.append(self._cut(self.volumes[a], index_a))
            fixed.append(self._cut(self.atlas if b < 0 else self.volumes[b], index_b))
            seg_a = self.segs[a] if self.segs else None
            seg_b = None if b < 0 or not self.segs else self.segs[b]
            if seg_a is not None and seg_b is not None:
                ids = np.union1d(self.label_ids[a], self.label_ids[b])
                pair = label_indices(
                    [self._cut(seg_a, index_a), self._cut(seg_b, index_b)],
                    ids,
                    self.max_labels,
                    generator,
                )
            else:
                pair = [np.zeros(moving[-1].shape, np.int16)] * 2
            moving_seg.append(pair[0])
            fixed_seg.append(pair[1])
            if self.crop:
                # one random window per pair, the same for moving and fixed
                window = random_window(self.spatial_shape, self.crop, generator)
                for items in (moving, fixed, moving_seg, fixed_seg):
                    items[-1] = items[-1][window]
        image_pairs = torch.ones(batch_size, dtype=torch.bool)
        return TrainBatch(
            stack_images(moving),
            stack_images(fixed),
            stack_labels(moving_seg),
            stack_labels(fixed_seg),
            image_pairs,
        )
