"""Who is held out and what is validated on: person splits and validation pairs.

Splits are by person (:func:`split_people`, :func:`split_subjects`), reproducible from a seed;
:func:`validation_pairs` loads held-out scan pairs (whole, or 2D slices of 3D volumes) for
validation during training. Must not import model, train, inference or cli.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.training.foreground import brain_slices, foreground_centre
from hyperreg.training.sources import Scan, fit_to_shape, load_scan

__all__ = ["ValidationPair", "split_people", "split_subjects", "validation_pairs"]


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
    normalization: str = DEFAULT_NORMALIZATION,
    spacing: float = 0.0,
    orientation: str = "",
    shape: tuple[int, ...] = (),
) -> list[ValidationPair]:
    """Load held-out ``(moving, fixed)`` scan pairs for validation during training.

    Scans are read by :func:`~hyperreg.training.sources.load_scan` as in
    :class:`~hyperreg.training.data.PairSampler` (normalised over the whole scan, label maps on
    their image's grid, optionally resampled to ``spacing``) but kept whole, not fitted to a
    training grid; only a moving scan of another shape than its fixed scan is centred in the
    fixed scan's grid (:func:`~hyperreg.training.sources.fit_to_shape`). For a 2D model on 3D
    scans, each scan pair gives one pair per slice index along ``slice_axis``: ``slices`` when
    given, else every ``slice_every``-th slice where all scans have brain. Slices, then scan
    pairs, are thinned evenly so at most ``max_pairs`` pairs remain.

    Args:
        pairs: ``(moving, fixed)`` scans, e.g. validation subjects to each other or to an atlas.
        ndim: 2 or 3, the model's dimensionality.
        slice_axis: Axis cut for 2D pairs from 3D scans.
        slices: Slice indices to use (e.g.
            :attr:`~hyperreg.training.data.PairSampler.heldout_slices`).
        slice_every: Spacing of the slices chosen when ``slices`` is None.
        max_pairs: Most pairs returned (>= 1).
        normalization: See :func:`~hyperreg.geometry.intensity.normalize_intensity`.
        spacing: Voxel size in mm to resample to; 0 keeps the scans' voxels.
        orientation: Storage orientation to resample 3D scans to, as in
            :class:`~hyperreg.training.data.PairSampler` (``""`` keeps their axes).
        shape: With ``orientation``: every scan's foreground is centred in a grid of this
            shape (:func:`~hyperreg.training.foreground.foreground_centre`), as
            :class:`~hyperreg.training.data.PairSampler` does with ``centre``.

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
        slices = brain_slices(volumes, slice_axis)[slice_every // 2 :: slice_every]
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
