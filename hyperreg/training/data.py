"""Training data: scan lists, intensity normalisation, pair sampling, λ sampling.

Sources: the neurite-oasis layout (``ROOT/OASIS_OAS1_XXXX_MR1/aligned_norm.nii.gz`` with
``aligned_seg35``; 2D-only folders with ``slice_norm`` / ``slice_seg24``), a folder of scans, or a
CSV list (column ``image``, optional ``seg``). Pairs are subject to subject (moving ≠ fixed) or
atlas to subject. For 2D training from 3D volumes, slices are cut along one axis (axis 2 is
coronal in neurite-oasis) from the range where every subject has brain, so a CPU can train a
useful 2D model in minutes. Randomness always comes from an explicit ``torch.Generator``. Must
not import model, train, inference or cli.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hyperreg.geometry.intensity import normalize_intensity
from hyperreg.geometry.io import load_volume

__all__ = [
    "LambdaSampler",
    "PairSampler",
    "Scan",
    "ValidationPair",
    "find_scans",
    "split_subjects",
    "validation_pairs",
]

logger = logging.getLogger(__name__)

SCAN_SUFFIXES = (".nii.gz", ".nii", ".mgz", ".mgh", ".npz")
_OASIS_FILES = {
    3: ("aligned_norm.nii.gz", "aligned_seg35.nii.gz"),
    2: ("slice_norm.nii.gz", "slice_seg24.nii.gz"),
}


@dataclass(frozen=True)
class Scan:
    """One subject: an intensity image and, optionally, its label map."""

    image: Path
    seg: Path | None = None

    @property
    def name(self) -> str:
        """Subject name: the neurite-oasis folder, else the file name without suffix."""
        if self.image.parent.name.startswith("OASIS_"):
            return self.image.parent.name
        name = self.image.name
        for suffix in SCAN_SUFFIXES:
            if name.endswith(suffix):
                return name[: -len(suffix)]
        return name


def _oasis_scans(root: Path, ndim: int) -> list[Scan]:
    scans: list[Scan] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for dims in (3, 2) if ndim == 2 else (3,):
            image_name, seg_name = _OASIS_FILES[dims]
            if (folder / image_name).is_file():
                seg = folder / seg_name
                scans.append(Scan(folder / image_name, seg if seg.is_file() else None))
                break
    return scans


def find_scans(source: str | Path, ndim: int) -> list[Scan]:
    """List the scans of a data source.

    Args:
        source: A neurite-oasis folder (subject folders holding ``aligned_norm.nii.gz`` or, for
            2D, ``slice_norm.nii.gz``; 3D volumes are preferred, their slices are cut later), a
            folder of scans (``.nii``, ``.nii.gz``, ``.mgz``, ``.npz``; files whose name contains
            ``seg`` are skipped), or a CSV file with an ``image`` column and an optional ``seg``
            column (relative paths are relative to the CSV).
        ndim: 2 or 3, the dimensionality of training.

    Returns:
        The scans, in sorted order.

    Raises:
        FileNotFoundError: If ``source`` does not exist.
        ValueError: If it holds no scan, or a CSV lacks the ``image`` column.
    """
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"find_scans(): no such file or folder: '{source}'")
    if source.is_file():
        if source.suffix.lower() != ".csv":
            raise ValueError(f"find_scans(): '{source}' must be a folder or a .csv list of scans")
        with source.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        if not rows or "image" not in rows[0]:
            raise ValueError(f"find_scans(): '{source}' must have a header with an 'image' column")
        base = source.parent
        scans = [
            Scan(base / row["image"], base / row["seg"] if row.get("seg") else None) for row in rows
        ]
    else:
        scans = _oasis_scans(source, ndim)
        if not scans:
            files = sorted(
                p
                for p in source.iterdir()
                if p.name.endswith(SCAN_SUFFIXES) and "seg" not in p.name.lower()
            )
            scans = [Scan(p) for p in files]
    if not scans:
        raise ValueError(
            f"find_scans(): no scans found in '{source}' (expected neurite-oasis subject folders, "
            f"image files ending in {SCAN_SUFFIXES}, or a CSV list)"
        )
    return scans


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
        scans: Scans of one common grid shape (affinely aligned, as neurite-oasis is).
        ndim: 2 or 3.
        atlas: Optional atlas image path (fixed image of every pair).
        slice_axis: Axis cut for 2D training from 3D volumes.
        normalization: Intensity normalisation, see :func:`normalize_intensity`.
        holdout_every: For 2D slices cut from volumes: hold out every ``holdout_every``-th brain
            slice (starting at ``holdout_every // 2``) from training, for validation; they are
            listed in ``heldout_slices``. 0 = train on every brain slice.
        crop: Random crop size per pair (one size per spatial axis; the same window for moving
            and fixed), drawn from the generator; ``()`` = whole images.

    Raises:
        ValueError: If scans differ in shape, a 2D model is asked for 3D scans with no axis, a
            3D model for 2D scans, there are fewer than two images to pair, or ``crop`` does
            not fit.
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
    ) -> None:
        self.ndim = ndim
        self.slice_axis = slice_axis
        self.heldout_slices: np.ndarray | None = None
        volumes = [self._load(scan.image, normalization) for scan in scans]
        self.atlas = self._load(Path(atlas), normalization) if atlas else None
        shapes = {v.shape for v in volumes + ([self.atlas] if self.atlas is not None else [])}
        if len(shapes) != 1:
            raise ValueError(
                f"PairSampler(): all scans must share one grid shape (affinely aligned), got "
                f"{sorted(shapes)}; resample them to a common space first"
            )
        self.volumes = volumes
        data_ndim = volumes[0].ndim
        if data_ndim < ndim:
            raise ValueError(
                f"PairSampler(): a {ndim}D model needs {ndim}D scans, got {data_ndim}D"
            )
        if data_ndim == ndim:
            self.slices = None
        else:
            self.slices = _brain_slices(volumes, slice_axis)
            if holdout_every > 0:
                held = self.slices[holdout_every // 2 :: holdout_every]
                self.heldout_slices = held
                self.slices = np.setdiff1d(self.slices, held)
            # slice axis first and contiguous: cutting a slice is then a cheap contiguous copy
            self.volumes = [np.ascontiguousarray(np.moveaxis(v, slice_axis, 0)) for v in volumes]
            if self.atlas is not None:
                self.atlas = np.ascontiguousarray(np.moveaxis(self.atlas, slice_axis, 0))
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
        logger.info(
            "pairs from %d scans of shape %s%s",
            len(volumes),
            volumes[0].shape,
            "" if self.slices is None else f", {len(self.slices)} slices along axis {slice_axis}",
        )

    @staticmethod
    def _load(path: Path, normalization: str) -> np.ndarray:
        return normalize_intensity(load_volume(path).data, normalization)

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
        moving, fixed = [], []
        count = len(self.volumes)
        for _ in range(batch_size):
            index = 0
            if self.slices is not None:
                index = int(self.slices[torch.randint(len(self.slices), (1,), generator=generator)])
            a = int(torch.randint(count, (1,), generator=generator))
            if self.atlas is not None:
                moving.append(self._cut(self.volumes[a], index))
                fixed.append(self._cut(self.atlas, index))
            elif count >= 2:
                b = int(torch.randint(count - 1, (1,), generator=generator))
                b = b + 1 if b >= a else b
                moving.append(self._cut(self.volumes[a], index))
                fixed.append(self._cut(self.volumes[b], index))
            else:
                other = int(self.slices[torch.randint(len(self.slices), (1,), generator=generator)])
                moving.append(self._cut(self.volumes[0], other))
                fixed.append(self._cut(self.volumes[0], index))
            if self.crop:
                # one random window per pair, the same for moving and fixed
                window = tuple(
                    slice(start, start + c)
                    for c, size in zip(self.crop, self.spatial_shape)
                    for start in [int(torch.randint(size - c + 1, (1,), generator=generator))]
                )
                moving[-1], fixed[-1] = moving[-1][window], fixed[-1][window]
        return _batch(moving), _batch(fixed)


def _batch(arrays: list[np.ndarray]) -> Tensor:
    """Stack 2D/3D arrays into a ``(B, 1, *S)`` float tensor."""
    return torch.from_numpy(np.stack(arrays)[:, None].copy())


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
) -> list[ValidationPair]:
    """Load held-out ``(moving, fixed)`` scan pairs for validation during training.

    Images are normalised over the whole scan, as in :class:`PairSampler`. For a 2D model on 3D
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

    Returns:
        The pairs, named ``"<moving>-><fixed>"`` (plus ``"@<slice>"`` in 2D from 3D).

    Raises:
        ValueError: If ``pairs`` is empty or scans differ in dimensionality from the model.
    """
    if not pairs:
        raise ValueError("validation_pairs(): 'pairs' must not be empty")
    cache: dict[Path, np.ndarray] = {}

    def load(path: Path | None, label: bool) -> np.ndarray | None:
        if path is None:
            return None
        if path not in cache:
            volume = load_volume(path, label=label).data
            cache[path] = volume if label else normalize_intensity(volume, normalization)
        return cache[path]

    pairs = [pairs[i] for i in _even(len(pairs), max_pairs)]
    data_ndim = load(pairs[0][0].image, False).ndim
    if data_ndim < ndim:
        raise ValueError(
            f"validation_pairs(): a {ndim}D model needs {ndim}D scans, got {data_ndim}D"
        )
    if data_ndim == ndim:
        slices = None
    elif slices is None:
        volumes = [load(scan.image, False) for pair in pairs for scan in pair]
        slices = _brain_slices(volumes, slice_axis)[slice_every // 2 :: slice_every]
    if slices is not None:
        slices = np.asarray(slices)[_even(len(slices), max(1, max_pairs // len(pairs)))]
    out: list[ValidationPair] = []
    for moving, fixed in pairs:
        arrays = (
            load(moving.image, False),
            load(fixed.image, False),
            load(moving.seg, True),
            load(fixed.seg, True),
        )
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
