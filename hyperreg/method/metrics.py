"""Evaluation metrics (no gradients): Dice and HD95 per label, folding fraction, log-J spread.

Label maps are hard integer maps; fields are displacements in voxels. The Hausdorff distance
comes from MONAI (imported on first use: it takes seconds to load). Must not import nibabel or
hyperreg modules other than ``_checks`` and ``spatial``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from hyperreg._checks import check_field
from hyperreg.method.spatial import jacobian_determinant

__all__ = [
    "dice_per_label",
    "field_summary",
    "folding_fraction",
    "hd95_per_label",
    "input_labels",
    "label_sets",
    "labels_in_both",
    "log_jacobian_std",
    "mean_dice",
    "mean_registration_dice",
    "registration_dice",
]


def _as_numpy_labels(fn: str, arg: str, seg: object) -> np.ndarray:
    array = seg.detach().cpu().numpy() if isinstance(seg, Tensor) else np.asarray(seg)
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.array_equal(array, np.rint(array)):
            raise ValueError(f"{fn}(): '{arg}' must hold integer label ids, got non-integer values")
        array = array.astype(np.int64)
    elif array.dtype.kind not in "iub":
        raise TypeError(f"{fn}(): '{arg}' must be an integer label map, got dtype {array.dtype}")
    return array


def _label_pair(
    fn: str, moved_seg: object, fixed_seg: object, labels: Sequence[int] | None
) -> tuple[np.ndarray, np.ndarray, Sequence[int]]:
    """Both maps as integer arrays of one shape, and the labels to score (default: in both)."""
    a = _as_numpy_labels(fn, "moved_seg", moved_seg)
    b = _as_numpy_labels(fn, "fixed_seg", fixed_seg)
    if a.shape != b.shape:
        raise ValueError(
            f"{fn}(): 'moved_seg' and 'fixed_seg' must have the same shape, got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    return a, b, labels_in_both(a, b) if labels is None else labels


_BINCOUNT_MAX = 1 << 20  # label ids up to this are counted with np.bincount (one pass per count)
_COUNT_CHUNK = 1 << 20  # voxels per counted block: np.bincount's int64 copy of it stays 8 MiB


def _counts(size: int, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Id counts (``np.bincount``, ``size`` bins) of ``a``; with ``b`` (same shape), rows:
    ``a``, ``b``, and ``a`` where ``a == b``. Counted a block of one axis at a time, so
    neither ``np.bincount``'s int64 copy nor the flattening copy of a map stored in another
    memory order than the other is ever as large as a map (a 256³ int32 map: 128 MiB). Exact.
    """
    maps = [m.reshape(1) if m.ndim == 0 else m for m in (a, b) if m is not None]
    counts = np.zeros((1 if b is None else 3, size), np.int64)
    # blocks of the last axis for maps all in Fortran order (then each block is contiguous)
    fortran = all(m.flags.f_contiguous for m in maps) and not all(
        m.flags.c_contiguous for m in maps
    )
    axis = maps[0].ndim - 1 if fortran else 0
    length = maps[0].shape[axis]
    rows = max(1, _COUNT_CHUNK // max(1, maps[0].size // max(length, 1)))
    for start in range(0, length, rows):
        block = (slice(None),) * axis + (slice(start, start + rows),)
        flat = _flat_ids(*(m[block] for m in maps))
        for row, ids in enumerate(flat):
            counts[row] += np.bincount(ids, minlength=size)
        if b is not None:
            counts[2] += np.bincount(flat[0][flat[0] == flat[1]], minlength=size)
    return counts


def _flat_ids(*maps: np.ndarray) -> list[np.ndarray]:
    """The maps as 1D arrays that ``np.bincount`` takes, without a copy where it can.

    A map in Fortran order (as nibabel reads MGZ and many NIfTI files) is flattened in its own
    memory order rather than copied into C order (a 256³ map: about 0.25 s saved per map); all
    maps are flattened in one order, so element ``n`` is the same voxel in each. Ids are cast to
    the platform integer only when the dtype cannot be counted as it is (e.g. uint64).
    """
    fortran = all(m.flags.f_contiguous for m in maps) and not all(
        m.flags.c_contiguous for m in maps
    )
    flat = [m.ravel(order="F" if fortran else "C") for m in maps]
    return [f if np.can_cast(f.dtype, np.intp) else f.astype(np.intp) for f in flat]


def _overlaps(
    a: np.ndarray, b: np.ndarray, labels: Sequence[int]
) -> dict[int, tuple[int, int, int]]:
    """``{label: (|A|, |B|, |A∩B|)}`` voxel counts of each label in two integer maps.

    Three ``np.bincount`` passes (sizes in ``a``, in ``b``, and in ``a`` where ``a == b``)
    instead of three comparisons per label; maps with negative ids or ids above
    :data:`_BINCOUNT_MAX` fall back to one comparison per label. Counts are exact either way.
    """
    labels = [int(label) for label in labels]
    if not labels:
        return {}
    lo = min(int(a.min()) if a.size else 0, int(b.min()) if b.size else 0)
    hi = max(int(a.max()) if a.size else 0, int(b.max()) if b.size else 0)
    if lo < 0 or hi > _BINCOUNT_MAX:
        out = {}
        for label in labels:
            in_a, in_b = a == label, b == label
            out[label] = (int(in_a.sum()), int(in_b.sum()), int((in_a & in_b).sum()))
        return out
    size = hi + 1
    count_a, count_b, count_both = _counts(size, a, b)

    def at(counts: np.ndarray, label: int) -> int:
        return int(counts[label]) if 0 <= label < size else 0

    return {
        label: (at(count_a, label), at(count_b, label), at(count_both, label)) for label in labels
    }


def _ids(seg: np.ndarray) -> list[int]:
    """The distinct ids of an integer map (``np.unique``; one ``np.bincount`` pass instead of a
    sort when the ids lie in ``[0, _BINCOUNT_MAX]``)."""
    if seg.size and seg.dtype.kind in "iu":
        lo, hi = int(seg.min()), int(seg.max())
        if 0 <= lo and hi <= _BINCOUNT_MAX:
            counts = _counts(hi + 1, seg)[0]
            return np.flatnonzero(counts).tolist()
    return np.unique(seg).tolist()


def labels_in_both(moving_seg: object, fixed_seg: object) -> list[int]:
    """The label ids hyperreg scores by default: non-zero ids present in **both** label maps.

    Args:
        moving_seg: Integer label map (numpy array or tensor), any shape.
        fixed_seg: Integer label map, any shape.

    Returns:
        Sorted list of ids; 0 (background) is never included.

    Raises:
        TypeError: If a label map is not an integer array.
    """
    return _label_sets("labels_in_both", moving_seg, fixed_seg)[1]


def dice_per_label(
    moved_seg: object, fixed_seg: object, labels: Sequence[int] | None = None
) -> dict[int, float]:
    """Dice overlap ``2|A∩B| / (|A| + |B|)`` for each label id.

    Args:
        moved_seg: Hard label map (numpy array or tensor, any shape, integer ids).
        fixed_seg: Hard label map of the same shape.
        labels: Label ids to score; default every non-zero id present in **both** maps.
            A requested id absent from both maps scores NaN (undefined), never 1 or 0.

    Returns:
        ``{label: dice}`` in ascending label order.

    Raises:
        TypeError: If a map is not integer-valued.
        ValueError: If the shapes differ.

    References:
        Dice, Ecology 1945. Agrees with MONAI's ``compute_dice`` on one-hot maps (tested).
    """
    a, b, labels = _label_pair("dice_per_label", moved_seg, fixed_seg, labels)
    scores: dict[int, float] = {}
    for label, (size_a, size_b, both) in _overlaps(a, b, labels).items():
        total = size_a + size_b
        scores[label] = float("nan") if total == 0 else 2.0 * both / total
    return scores


def mean_dice(moved_seg: object, fixed_seg: object, labels: Sequence[int] | None = None) -> float:
    """Mean of :func:`dice_per_label` over the scored labels (NaN entries ignored)."""
    values = [v for v in dice_per_label(moved_seg, fixed_seg, labels).values() if not math.isnan(v)]
    return float(np.mean(values)) if values else float("nan")


def input_labels(moving_seg: object, fixed_seg: object) -> list[int]:
    """The label ids a registration is scored on: non-zero ids of **either** input label map.

    Args:
        moving_seg: The moving label map **before** warping (numpy array or tensor).
        fixed_seg: The fixed label map.

    Returns:
        Sorted ids of the union; 0 (background) is never included.

    Raises:
        TypeError: If a label map is not an integer array.
    """
    return _label_sets("input_labels", moving_seg, fixed_seg)[0]


def label_sets(moving_seg: object, fixed_seg: object) -> tuple[list[int], list[int]]:
    """:func:`input_labels` and :func:`labels_in_both` from one count of each map.

    Args:
        moving_seg: Integer label map (numpy array or tensor), any shape.
        fixed_seg: Integer label map, any shape.

    Returns:
        ``(ids of either map, ids of both maps)``, each sorted; 0 (background) never included.

    Raises:
        TypeError: If a label map is not an integer array.
    """
    return _label_sets("label_sets", moving_seg, fixed_seg)


def _label_sets(fn: str, moving_seg: object, fixed_seg: object) -> tuple[list[int], list[int]]:
    a = set(_ids(_as_numpy_labels(fn, "moving_seg", moving_seg)))
    b = set(_ids(_as_numpy_labels(fn, "fixed_seg", fixed_seg)))
    return sorted((a | b) - {0}), sorted((a & b) - {0})


def registration_dice(
    moved_seg: object,
    fixed_seg: object,
    moving_seg: object | None = None,
    labels: Sequence[int] | None = None,
) -> dict[int, float]:
    """Dice per label with hyperreg's one convention, used by every command and benchmark.

    The labels are those of the **inputs** (:func:`input_labels` of ``moving_seg`` and
    ``fixed_seg``; without ``moving_seg``, of ``moved_seg`` and ``fixed_seg``), background 0
    excluded, and a label that the warp erased (absent from both ``moved_seg`` and
    ``fixed_seg``) scores 0, not NaN: a structure lost by the registration lowers the mean
    instead of leaving it. A label present in only one input scores 0 too. This is the
    Learn2Reg convention (Hering et al., IEEE TMI 2022), so mean Dice is over the same label set
    for every λ, every command and every baseline (no registration, affine alone).

    Args:
        moved_seg: Moved label map (integer ids), on the fixed grid.
        fixed_seg: Fixed label map, same shape.
        moving_seg: The moving label map before warping (any shape), or None.
        labels: Label ids to score instead of the inputs' union.

    Returns:
        ``{label: dice}`` in ascending label order, every value in [0, 1].

    Raises:
        TypeError: If a map is not integer-valued.
        ValueError: If ``moved_seg`` and ``fixed_seg`` differ in shape.
    """
    fn = "registration_dice"
    a, b, _ = _label_pair(fn, moved_seg, fixed_seg, ())
    if labels is None:
        labels = input_labels(a if moving_seg is None else moving_seg, b)
    scores: dict[int, float] = {}
    for label, (size_a, size_b, both) in _overlaps(a, b, labels).items():
        total = size_a + size_b
        scores[label] = 0.0 if total == 0 else 2.0 * both / total
    return scores


def mean_registration_dice(
    moved_seg: object,
    fixed_seg: object,
    moving_seg: object | None = None,
    labels: Sequence[int] | None = None,
) -> float:
    """Mean of :func:`registration_dice` (the one convention; NaN when no label is scored)."""
    scores = registration_dice(moved_seg, fixed_seg, moving_seg, labels)
    return float(np.mean(list(scores.values()))) if scores else float("nan")


def hd95_per_label(
    moved_seg: object,
    fixed_seg: object,
    labels: Sequence[int] | None = None,
    spacing: Sequence[float] | None = None,
) -> dict[int, float]:
    """95th-percentile symmetric Hausdorff distance per label, as Learn2Reg reports it.

    For each label the two boundaries are compared: the distances from every surface voxel of
    one map to the nearest surface voxel of the other, both ways, and the 95th percentile of
    their union's directed maxima (MONAI's ``compute_hausdorff_distance`` with
    ``percentile=95``).

    Args:
        moved_seg: Integer label map, shape ``S`` (2D or 3D; numpy array or tensor).
        fixed_seg: Integer label map of the same shape.
        labels: Label ids to score; default :func:`labels_in_both`.
        spacing: Voxel size per array axis (mm) for distances in mm; default voxels.

    Returns:
        ``{label: HD95}`` in voxels (or mm with ``spacing``); NaN where a label is absent from
        either map (undefined), never 0 or infinity.

    Raises:
        TypeError: If a label map is not integer-valued.
        ValueError: If the shapes differ.

    References:
        Huttenlocher et al., IEEE TPAMI 1993; MONAI ``monai.metrics.compute_hausdorff_distance``;
        Learn2Reg (Hering et al., IEEE TMI 2022) for the 95th-percentile variant.
    """
    from monai.metrics import compute_hausdorff_distance

    a, b, labels = _label_pair("hd95_per_label", moved_seg, fixed_seg, labels)
    scores: dict[int, float] = {}
    for label in labels:
        in_a, in_b = a == label, b == label
        if not in_a.any() or not in_b.any():
            scores[int(label)] = float("nan")
            continue
        pred = torch.from_numpy(in_a)[None, None].float()
        target = torch.from_numpy(in_b)[None, None].float()
        with warnings.catch_warnings():  # MONAI 1.5+ warns about its own internal argument
            warnings.simplefilter("ignore", FutureWarning)
            value = compute_hausdorff_distance(
                pred, target, include_background=True, percentile=95, spacing=spacing
            )
        scores[int(label)] = float(value.reshape(-1)[0])
    return scores


@torch.no_grad()
def folding_fraction(disp: Tensor) -> float:
    """Fraction of voxels where the deformation folds (Jacobian determinant ``≤ 0``).

    Args:
        disp: Displacement field ``(B, N, *S)`` in voxels.

    Returns:
        A fraction in [0, 1] over all samples and voxels (multiply by 100 for percent).

    Raises:
        TypeError, ValueError: As :func:`hyperreg.method.spatial.jacobian_determinant`.
    """
    check_field("folding_fraction", "disp", disp)
    return float((jacobian_determinant(disp.float()) <= 0).float().mean())


@torch.no_grad()
def log_jacobian_std(disp: Tensor) -> float:
    """Standard deviation of ``log J`` over all voxels, with ``J`` clipped at 1e-9 from below.

    Args:
        disp: Displacement field ``(B, N, *S)`` in voxels.

    Returns:
        A non-negative float (0 for any affine-free translation).
    """
    check_field("log_jacobian_std", "disp", disp)
    det = jacobian_determinant(disp.float()).clamp_min(1e-9)
    return float(det.log().std())


def field_summary(disp: Tensor) -> dict[str, float]:
    """``{"folding_fraction", "log_jacobian_std", "max_displacement"}`` of one field (voxels)."""
    return {
        "folding_fraction": folding_fraction(disp),
        "log_jacobian_std": log_jacobian_std(disp),
        "max_displacement": float(disp.detach().norm(dim=1).max()),
    }
