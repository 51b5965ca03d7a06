"""Training data: pair sampling from scans, mixing pair sources, splits, λ sampling.

Scans come from :mod:`hyperreg.training.sources` (every layout, person ids, loading onto a
training grid; ``Scan`` and ``find_scans`` are re-exported here). Pairs are subject to subject
(moving ≠ fixed) within one source, or atlas to subject. For 2D training from 3D volumes, slices
are cut along one axis (axis 2 is coronal in neurite-oasis) from the range where every subject
has brain, so a CPU can train a useful 2D model in minutes. :class:`MixtureSampler` draws each
sample of a batch from one of several samplers (several sources, real and synthetic pairs).
Splits are by person (:func:`split_subjects`). Randomness always comes from an explicit
``torch.Generator``. Must not import model, train, inference or cli.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

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


def _brain_slices(volumes: list[np.ndarray], axis: int, min_fraction: float = 0.3) -> np.ndarray:
    """Slice indices along ``axis`` where every volume has ≥ min_fraction of its largest area."""
    keep = None
    for data in volumes:
        other = tuple(a for a in range(data.ndim) if a != axis)
        area = (data > 0.05 * data.max()).sum(axis=other)
        ok = area >= min_fraction * area.max()
        keep = ok if keep is None else keep & ok
    indices = np.flatnonzero(keep)
    if indices.size == 0:
        raise ValueError("PairSampler(): the scans share no slice with brain in it")
    return indices


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
        normalization: str = "minmax",
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
        options = {"normalization": normalization, "spacing": spacing, "with_seg": labels,
                   "orientation": orientation}
        # C order at load: scans come in NIfTI's Fortran order, and batching such a volume cost
        # a transposing copy per image in every step (30 ms at 160 × 192 × 224; now 7 ms)
        loaded = [load_scan(scan, **options) for scan in scans]
        volumes = [np.ascontiguousarray(image) for image, _ in loaded]
        segs = [None if seg is None else np.ascontiguousarray(seg) for _, seg in loaded]
        self.atlas = (
            np.ascontiguousarray(load_scan(Scan(Path(atlas)), **options)[0]) if atlas else None
        )
        everything = volumes + ([self.atlas] if self.atlas is not None else [])
        dims = {v.ndim for v in everything}
        if len(dims) != 1:
            raise ValueError(
                f"PairSampler(): scans must all be 2D or all 3D, got shapes "
                f"{sorted({v.shape for v in everything})}"
            )
        shape = tuple(int(n) for n in shape)
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
        if data_ndim > ndim:
            # slice axis first and contiguous: cutting a slice is then a cheap contiguous copy
            volumes = [np.ascontiguousarray(np.moveaxis(v, slice_axis, 0)) for v in volumes]
            if self.atlas is not None:
                self.atlas = np.ascontiguousarray(np.moveaxis(self.atlas, slice_axis, 0))
            if shape and len(shapes) != 1 and len({v.shape[0] for v in volumes}) != 1:
                raise ValueError(
                    f"PairSampler(): 2D slices of 3D scans need one size along 'slice_axis' "
                    f"{slice_axis}, got shapes {sorted(shapes)}"
                )
            self.slices = _brain_slices(volumes, 0)
            if holdout_every > 0:
                held = self.slices[holdout_every // 2 :: holdout_every]
                self.heldout_slices = held
                self.slices = np.setdiff1d(self.slices, held)
        if data_ndim > ndim:
            segs = [None if g is None else np.ascontiguousarray(np.moveaxis(g, slice_axis, 0))
                    for g in segs]
        if shape:
            first = 0 if self.slices is None else 1
            centres = [foreground_centre(v, g, first, shape) if centre else None
                       for v, g in zip(volumes, segs)]
            volumes = [fit_to_shape(v, shape, first, c) for v, c in zip(volumes, centres)]
            segs = [None if g is None else fit_to_shape(g, shape, first, c)
                    for g, c in zip(segs, centres)]
            if self.atlas is not None:
                self.atlas = fit_to_shape(self.atlas, shape, first)
        self.volumes = volumes
        self.segs = segs
        self.label_ids = [None if g is None else np.unique(g[g > 0]) for g in segs]
        if self.atlas is None and len(volumes) < 2 and self.slices is None:
            raise ValueError("PairSampler(): need at least two scans (or an atlas) to make pairs")
        self.crop = tuple(int(c) for c in crop)
        if self.crop and (
            len(self.crop) != ndim
            or any(not 0 < c <= s for c, s in zip(self.crop, self.spatial_shape))
        ):
            raise ValueError(
                f"PairSampler(): 'crop' must give {ndim} sizes within the image shape "
                f"{self.spatial_shape}, got {self.crop}"
            )
        # shapes in the scans' own axis order (the slice axis was moved first above)
        shown = volumes[0].shape
        if self.slices is not None:
            shown = np.moveaxis(volumes[0], 0, slice_axis).shape
        logger.info(
            "pairs from %d scans of shape %s%s",
            len(volumes),
            shown,
            "" if self.slices is None else f", {len(self.slices)} slices along axis {slice_axis}",
        )

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
                    [self._cut(seg_a, index_a), self._cut(seg_b, index_b)], ids,
                    self.max_labels, generator,
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
            _batch(moving), _batch(fixed), _labels(moving_seg), _labels(fixed_seg), image_pairs
        )


def random_window(
    spatial_shape: tuple[int, ...], crop: tuple[int, ...], generator: torch.Generator
) -> tuple[slice, ...]:
    """A random crop window of size ``crop`` inside ``spatial_shape`` (uniform start per axis,
    drawn from ``generator``); ``crop`` sizes must not exceed the shape."""
    return tuple(
        slice(start, start + c)
        for c, size in zip(crop, spatial_shape)
        for start in [int(torch.randint(size - c + 1, (1,), generator=generator))]
    )


def _batch(arrays: list[np.ndarray]) -> Tensor:
    """Stack 2D/3D arrays into a ``(B, 1, *S)`` float tensor."""
    return torch.from_numpy(np.ascontiguousarray(np.stack(arrays)[:, None]))


def _labels(arrays: list[np.ndarray]) -> Tensor:
    """Stack index maps into a ``(B, 1, *S)`` int16 tensor."""
    return torch.from_numpy(np.ascontiguousarray(np.stack(arrays)[:, None].astype(np.int16)))


class TrainBatch(NamedTuple):
    """One training batch.

    Attributes:
        moving: ``(B, 1, *S)`` float32 images in [0, 1].
        fixed: ``(B, 1, *S)`` float32 images in [0, 1].
        moving_labels: ``(B, 1, *S)`` int16 index maps: 0 background (or a label left out),
            ``1..K`` the labels chosen for the pair, the same ids on both sides; all 0 for a
            pair without label maps. Only maps of one pair (one label convention) share an
            index meaning.
        fixed_labels: Same for the fixed side.
        image_pairs: ``(B,)`` bool: whether the image similarity term applies (False for a
            synthetic pair whose two images have independent random contrasts).
    """

    moving: Tensor
    fixed: Tensor
    moving_labels: Tensor
    fixed_labels: Tensor
    image_pairs: Tensor


def label_indices(
    maps: list[np.ndarray], ids: np.ndarray, max_labels: int, generator: torch.Generator
) -> list[np.ndarray]:
    """Label maps of one pair as index maps over (at most ``max_labels`` of) ``ids``.

    Args:
        maps: Integer label maps of one label convention (the two sides of a pair).
        ids: The foreground label ids to consider (sorted, > 0).
        max_labels: Most labels kept; with more ids, a random subset (from ``generator``) is
            kept, so every label is trained on over many steps at a bounded cost per step.
        generator: Random source.

    Returns:
        One int16 array per map: ``k`` where the map holds the ``k``-th kept id, else 0.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size > max_labels:
        keep = torch.randperm(ids.size, generator=generator)[:max_labels].numpy()
        ids = np.sort(ids[keep])
    top = int(max(int(m.max()) for m in maps)) if maps else 0
    table = np.zeros(max(top, int(ids.max()) if ids.size else 0) + 1, np.int16)
    table[ids] = np.arange(1, ids.size + 1, dtype=np.int16)
    return [table[np.clip(m, 0, None)] for m in maps]


def foreground_centre(
    image: np.ndarray,
    seg: np.ndarray | None,
    first_axis: int = 0,
    shape: tuple[int, ...] | None = None,
    margin: int = 8,
) -> tuple[float, ...]:
    """Where to centre a scan in the training grid (voxel coordinates, axes ``first_axis`` on).

    The centre of mass of the foreground: the label map's non-zero voxels when there is one,
    else the image above 10 % of its maximum (a crude affine start; ANTs starts from the centres
    of mass too), used to put each person, scanned in their own position, in the middle of the
    training grid. With ``shape`` (a 3D grid in RAS order, so the last axis is superior), the
    last axis is instead placed so the top of the foreground lies ``margin`` voxels below the
    top of the grid: heads with and without a neck, brains and label maps of the whole head
    then all keep the top of the brain and lose the neck, not the vertex.
    """
    mask = seg > 0 if seg is not None else image > 0.1 * float(image.max())
    if first_axis:
        mask = mask.any(axis=tuple(range(first_axis)))
    if not mask.any():
        return tuple((n - 1) / 2 for n in mask.shape)
    centre = [float(np.mean(axis)) for axis in np.nonzero(mask)]
    if shape is not None:
        top = int(np.flatnonzero(mask.any(axis=tuple(range(mask.ndim - 1))))[-1])
        centre[-1] = top + margin - (shape[-1] - 1) / 2
    return tuple(centre)


class MixtureSampler:
    """Draw each sample of a batch from one of several pair samplers.

    Sample ``i`` comes from sampler ``k`` with probability ``weights[k] / sum(weights)``, drawn
    per sample from the generator; each sampler then draws its share of the batch, and the
    samples are put back in the drawn order. The batch structure is that of
    :meth:`PairSampler.sample`, so per-sample λ works unchanged. Used for several ``--data``
    sources (weights = training scans per source) and for real / synthetic mixing (weights
    ``1 − f`` and ``f``).

    Args:
        samplers: Objects with ``sample(batch_size, generator) -> (moving, fixed)``, all giving
            one spatial shape.
        weights: One non-negative weight per sampler, not all zero.

    Raises:
        ValueError: If the lengths differ, ``samplers`` is empty, or the weights are invalid.
    """

    def __init__(self, samplers: list, weights: list[float]) -> None:
        if not samplers or len(samplers) != len(weights):
            raise ValueError(
                f"MixtureSampler(): need one weight per sampler, got {len(samplers)} samplers "
                f"and {len(weights)} weights"
            )
        if min(weights) < 0 or not sum(weights) > 0:
            raise ValueError(
                f"MixtureSampler(): 'weights' must be >= 0 and not all 0, got {weights}"
            )
        self.samplers = list(samplers)
        self.weights = torch.tensor(weights, dtype=torch.float64)

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``batch_size`` pairs; see :meth:`PairSampler.sample` for the layout."""
        batch = self.sample_batch(batch_size, generator)
        return batch.moving, batch.fixed

    def sample_batch(self, batch_size: int, generator: torch.Generator) -> TrainBatch:
        """Draw ``batch_size`` pairs with labels (:class:`TrainBatch`); a sampler without
        ``sample_batch`` gives pairs without label maps on which the image term applies."""
        choice = torch.multinomial(self.weights, batch_size, replacement=True, generator=generator)
        rows_out: list[list[Tensor | None]] = [[None] * batch_size for _ in range(5)]
        for index, sampler in enumerate(self.samplers):
            rows = torch.nonzero(choice == index).flatten().tolist()
            if not rows:
                continue
            part = batch_of(sampler, len(rows), generator)
            for offset, row in enumerate(rows):
                for field, values in zip(part, rows_out):
                    values[row] = field[offset]
        return TrainBatch(*(torch.stack(values) for values in rows_out))  # type: ignore[arg-type]


def batch_of(source: object, batch_size: int, generator: torch.Generator) -> TrainBatch:
    """A :class:`TrainBatch` from any pair source: its ``sample_batch`` when it has one, else
    its ``sample`` (images only: index maps 0, image term on)."""
    sample_batch = getattr(source, "sample_batch", None)
    if callable(sample_batch):
        return sample_batch(batch_size, generator)
    moving, fixed = source.sample(batch_size, generator)  # type: ignore[attr-defined]
    empty = torch.zeros(moving.shape, dtype=torch.int16)
    image_pairs = torch.ones(len(moving), dtype=torch.bool)
    return TrainBatch(moving, fixed, empty, empty.clone(), image_pairs)


class LambdaSampler:
    """Per-sample λ for HyperMorph training: U(0, 1) with a share drawn exactly at 0 or 1.

    Args:
        endpoint_fraction: Share of samples set to 0 or 1 (half each on average), in [0, 1].

    Raises:
        ValueError: If ``endpoint_fraction`` is outside [0, 1].

    References:
        Hoopes et al., HyperMorph, MELBA 2022 (λ sampling with endpoint oversampling).
    """

    def __init__(self, endpoint_fraction: float = 0.2) -> None:
        if not 0.0 <= endpoint_fraction <= 1.0:
            raise ValueError(
                f"LambdaSampler(): 'endpoint_fraction' must lie in [0, 1], got {endpoint_fraction}"
            )
        self.endpoint_fraction = endpoint_fraction

    def sample(self, n: int, generator: torch.Generator) -> Tensor:
        """``(n,)`` float32 λ values in [0, 1]."""
        lam = torch.rand(n, generator=generator)
        endpoint = torch.rand(n, generator=generator) < self.endpoint_fraction
        ends = (torch.rand(n, generator=generator) < 0.5).float()
        return torch.where(endpoint, ends, lam)


def split_subjects(
    names: list[str],
    seed: int,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    min_train: int = 2,
) -> dict[str, list[str]]:
    """Split subjects into train / val / test, reproducibly from ``seed``.

    Each held-out set gets ``round(fraction · n)`` subjects, at least one when its fraction is
    positive, while at least ``min_train`` subjects stay for training (the test set shrinks
    first, then the validation set). With fewer than ``min_train + 1`` subjects nothing is held
    out. The same names and seed always give the same split, whatever the input order.

    Args:
        names: Subject names (unique).
        seed: Seed of the permutation.
        val_fraction: Share of subjects for validation, in [0, 1).
        test_fraction: Share of subjects for testing, in [0, 1).
        min_train: Fewest training subjects (2 for subject-to-subject pairs, 1 with an atlas).

    Returns:
        ``{"train": [...], "val": [...], "test": [...]}``, each sorted.

    Raises:
        ValueError: If a fraction is outside [0, 1) or names repeat.
    """
    for arg, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"split_subjects(): '{arg}' must lie in [0, 1), got {value}")
    if len(set(names)) != len(names):
        raise ValueError("split_subjects(): 'names' must be unique")
    n = len(names)
    order = [sorted(names)[i] for i in np.random.default_rng(seed).permutation(n)]
    n_val = max(1, round(val_fraction * n)) if val_fraction > 0 else 0
    n_test = max(1, round(test_fraction * n)) if test_fraction > 0 else 0
    while n - n_val - n_test < min_train and n_test > 0:
        n_test -= 1
    while n - n_val < min_train and n_val > 0:
        n_val -= 1
    return {
        "train": sorted(order[n_val + n_test :]),
        "val": sorted(order[:n_val]),
        "test": sorted(order[n_val : n_val + n_test]),
    }


def split_people(
    people: list[str],
    seed: int,
    *,
    holdout: tuple[str, ...] | list[str] = (),
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    min_train: int = 2,
) -> dict[str, list[str]]:
    """Split people into train / val / test: the named ``holdout`` people, or a seeded split.

    With ``holdout``, exactly those people form the validation set (``val_fraction`` is not
    used) and ``test_fraction`` of the others is drawn, reproducibly from ``seed``, as the test
    set (pass 0 to train on everyone else). Without it, :func:`split_subjects` splits them.

    Args:
        people: Person ids (unique; see :attr:`~hyperreg.training.sources.Scan.person`).
        seed: Seed of the split.
        holdout: Person ids to hold out for validation.
        val_fraction: Share of people for validation when ``holdout`` is empty.
        test_fraction: Share of (the other) people for testing.
        min_train: Fewest training people (2 for subject-to-subject pairs, 1 with an atlas).

    Returns:
        ``{"train": [...], "val": [...], "test": [...]}``, each sorted.

    Raises:
        ValueError: If ``holdout`` names a person not in ``people``, or as
            :func:`split_subjects`.
    """
    if not holdout:
        if len(people) > min_train:
            return split_subjects(people, seed, val_fraction, test_fraction, min_train)
        return {"train": sorted(people), "val": [], "test": []}
    unknown = sorted(set(holdout) - set(people))
    if unknown:
        known = sorted(people)
        raise ValueError(
            f"split_people(): 'holdout' names people not in the data: {unknown}; known: "
            f"{known[:8]}{' ...' if len(known) > 8 else ''}"
        )
    rest = sorted(set(people) - set(holdout))
    split = {"train": rest, "val": sorted(set(holdout)), "test": []}
    if len(rest) > min_train:
        inner = split_subjects(rest, seed, 0.0, test_fraction, min_train)
        split["train"], split["test"] = inner["train"], inner["test"]
    return split


@dataclass(frozen=True)
class ValidationPair:
    """One held-out pair: normalised images (float32) and label maps (int32, or None)."""

    name: str
    moving: np.ndarray
    fixed: np.ndarray
    moving_seg: np.ndarray | None
    fixed_seg: np.ndarray | None


def validation_pairs(
    pairs: list[tuple[Scan, Scan]],
    ndim: int,
    *,
    slice_axis: int = 2,
    slices: np.ndarray | None = None,
    slice_every: int = 10,
    max_pairs: int = 16,
    normalization: str = "minmax",
    spacing: float = 0.0,
    orientation: str = "",
    shape: tuple[int, ...] = (),
) -> list[ValidationPair]:
    """Load held-out ``(moving, fixed)`` scan pairs for validation during training.

    Scans are read by :func:`~hyperreg.training.sources.load_scan` as in :class:`PairSampler`
    (normalised over the whole scan, label maps on their image's grid, optionally resampled to
    ``spacing``) but kept whole, not fitted to a training grid; only a moving scan of another
    shape than its fixed scan is centred in the fixed scan's grid (:func:`fit_to_shape`). For a
    2D model on 3D
    scans, each scan pair gives one pair per slice index along ``slice_axis``: ``slices`` when
    given, else every ``slice_every``-th slice where all scans have brain. Slices, then scan
    pairs, are thinned evenly so at most ``max_pairs`` pairs remain.

    Args:
        pairs: ``(moving, fixed)`` scans, e.g. validation subjects to each other or to an atlas.
        ndim: 2 or 3, the model's dimensionality.
        slice_axis: Axis cut for 2D pairs from 3D scans.
        slices: Slice indices to use (e.g. :attr:`PairSampler.heldout_slices`).
        slice_every: Spacing of the slices chosen when ``slices`` is None.
        max_pairs: Most pairs returned (>= 1).
        normalization: See :func:`normalize_intensity`.
        spacing: Voxel size in mm to resample to; 0 keeps the scans' voxels.
        orientation: Storage orientation to resample 3D scans to, as in :class:`PairSampler`
            (``""`` keeps their axes).
        shape: With ``orientation``: every scan's foreground is centred in a grid of this
            shape (:func:`foreground_centre`), as :class:`PairSampler` does with ``centre``.

    Returns:
        The pairs, named ``"<moving>-><fixed>"`` (plus ``"@<slice>"`` in 2D from 3D).

    Raises:
        ValueError: If ``pairs`` is empty or scans differ in dimensionality from the model.
    """
    if not pairs:
        raise ValueError("validation_pairs(): 'pairs' must not be empty")
    cache: dict[Scan, tuple[np.ndarray, np.ndarray | None]] = {}

    def load(scan: Scan) -> tuple[np.ndarray, np.ndarray | None]:
        if scan not in cache:
            image, seg = load_scan(
                scan, normalization=normalization, spacing=spacing, orientation=orientation
            )
            if orientation and shape and image.ndim == len(shape):
                centre = foreground_centre(image, seg, 0, shape)
                image = fit_to_shape(image, shape, 0, centre)
                seg = None if seg is None else fit_to_shape(seg, shape, 0, centre)
            cache[scan] = image, seg
        return cache[scan]

    pairs = [pairs[i] for i in _even(len(pairs), max_pairs)]
    data_ndim = load(pairs[0][0])[0].ndim
    if data_ndim < ndim:
        raise ValueError(
            f"validation_pairs(): a {ndim}D model needs {ndim}D scans, got {data_ndim}D"
        )
    if data_ndim == ndim:
        slices = None
    elif slices is None:
        volumes = [load(scan)[0] for pair in pairs for scan in pair]
        slices = _brain_slices(volumes, slice_axis)[slice_every // 2 :: slice_every]
    if slices is not None:
        slices = np.asarray(slices)[_even(len(slices), max(1, max_pairs // len(pairs)))]
    out: list[ValidationPair] = []
    for moving, fixed in pairs:
        (moving_image, moving_seg), (fixed_image, fixed_seg) = load(moving), load(fixed)
        if moving_image.shape != fixed_image.shape:
            moving_image = fit_to_shape(moving_image, fixed_image.shape)
            if moving_seg is not None:
                moving_seg = fit_to_shape(moving_seg, fixed_image.shape)
        arrays = (moving_image, fixed_image, moving_seg, fixed_seg)
        name = f"{moving.name}->{fixed.name}"
        if slices is None:
            out.append(ValidationPair(name, *arrays))
            continue
        for index in slices.tolist():
            cut = [None if a is None else np.take(a, index, axis=slice_axis) for a in arrays]
            out.append(ValidationPair(f"{name}@{index}", *cut))
    return out


def _even(count: int, most: int) -> np.ndarray:
    """Up to ``most`` indices spread evenly over ``range(count)``."""
    if count <= most:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, most).round().astype(int))
