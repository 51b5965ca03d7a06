"""Checks of what an input image holds, before any expensive stage: label map or image, with or
without skull, voxels near the model's size.

Each check is a cheap numpy function of a :class:`~hyperreg.geometry.io.Volume` (or a plain
array, taken as 1 mm voxels) that returns a value or one-line warnings naming the file and what
to do; none raises on a valid image and none changes its input. The pipeline decides what to do
with the warnings (print them; refuse where it must). The label-map and skull checks are
heuristics that say nothing where they are unsure (a missed warning is better than a false
one); ``benchmarks/bench_heuristics.py`` runs them on every 2D and 3D input of the shared data
(label maps of six labellings, stripped brains, heads) and on resampled, re-stored, thick-slice
and brain-masked copies and 2D slices of them, with no wrong verdict
(``benchmarks/RESULTS_heuristics.md``; ``tests/test_inspect.py`` runs a subset).

Uses numpy (and :mod:`hyperreg.geometry.io` for the Volume type) only; must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hyperreg.geometry.io import Volume, same_grid

__all__ = [
    "SkullEvidence",
    "check_pair_contents",
    "label_grid_warning",
    "label_ids_warning",
    "looks_like_label_map",
    "skull_evidence",
    "skull_stripped",
    "spacing_warning",
]

MAX_LABEL_IDS = 2000  # more distinct values than this: an intensity image (as apps.register)
_INTEGER_TOL = 1e-3  # |x - rint(x)| at most this everywhere: integer-valued
_SAME_NEIGHBOUR = 0.35  # label maps measured 0.52-0.87, integer-valued images 0.03-0.19
_MIN_SHARED_IDS = 0.5  # share of the ids of either label map that both maps hold
_LABEL_CHECK_VOXELS = 1 << 22  # larger arrays are checked on every second voxel per axis
_WORK_MM = 2.0  # resolution of the skull check (mm), by striding
_FOREGROUND = 0.1  # of the robust intensity range (0 .. 99.5th percentile)
_CLOSE_MM = 10.0  # closing radius that bridges the dark skull between scalp and brain
_SHELL_MM = 4.0  # outer shell of the closed foreground; also the gap before the background
_ZERO_TOL = 1e-3  # of the robust range: background voxels this close to the minimum are "zero"
# Skull verdict thresholds, per dimensionality (2: a slice, cm²; 3: a volume, ml), measured in
# benchmarks/RESULTS_heuristics.md on the closed foreground of every shared image and copies:
# stripped brains 1.2-2.5 l and up to 244 cm², heads 3.6-5.9 l and 155-427 cm²; bright shell
# of stripped brains at most 0.134 (3D) / 0.32 (2D slices of 40 cm² or more); zero background
# of stripped brains at least 0.97.
_TOO_SMALL = {2: 40.0, 3: 400.0}
_BRAIN_MAX = {2: 200.0, 3: 2800.0}
_HEAD_MIN = {2: 250.0, 3: 3200.0}
_STRIPPED_SHELL = 0.15
_HEAD_SHELL = {2: 0.35, 3: 0.2}
_ZERO_BACKGROUND = 0.9


def _data_and_spacing(volume: Volume | np.ndarray) -> tuple[np.ndarray, tuple[float, ...]]:
    if isinstance(volume, Volume):
        return volume.data, volume.spacing
    data = np.asarray(volume)
    if data.ndim not in (2, 3):
        raise ValueError(
            f"inspect: 'volume' must have shape (I, J) or (I, J, K), got {tuple(data.shape)}"
        )
    return data, (1.0,) * data.ndim


def _name(volume: Volume | np.ndarray, role: str) -> str:
    path = volume.path if isinstance(volume, Volume) else None
    return str(path) if path is not None else f"<in-memory {role}>"


def _same_neighbour_share(data: np.ndarray, background: int) -> float:
    """Share of neighbouring voxel pairs (not both ``background``) that hold the same value,
    over all axes."""
    equal = total = 0
    for axis in range(data.ndim):
        first = data[tuple(slice(1, None) if a == axis else slice(None) for a in range(data.ndim))]
        second = data[
            tuple(slice(None, -1) if a == axis else slice(None) for a in range(data.ndim))
        ]
        counted = (first != background) | (second != background)
        equal += int(np.count_nonzero((first == second) & counted))
        total += int(np.count_nonzero(counted))
    return equal / total if total else 0.0


def looks_like_label_map(volume: Volume | np.ndarray) -> bool:
    """Whether an array holds a label map rather than an intensity image.

    True when every value is an integer (within 1e-3), there are 2 to 2000 distinct values, and
    at least 35 % of the neighbouring voxel pairs (along each array axis; pairs that are both
    the most common value, the background, are left out) hold the same value: label maps are
    piecewise constant, images are not (also one whose air is a constant other than 0). Measured
    (``benchmarks/RESULTS_heuristics.md``): 0.52–0.87 on the FreeSurfer, SAMSEG, MUSE, GIF,
    SynthSeg and DKT maps of the shared data and their resampled (1.5, 3 mm), re-stored,
    thick-slice and 2D copies (0.52: a GIF map at 3 mm); 0.03–0.19 on integer-valued images
    (FreeSurfer's ``norm.mgz`` with its 187 grey values, uint8 templates and JPEG slices). An
    array of more than 2²² voxels (e.g. 256³) is judged on every second voxel along each axis,
    an eighth of the work: its neighbours are then 2 voxels apart.

    Args:
        volume: A :class:`~hyperreg.geometry.io.Volume` or an array ``(I, J)`` / ``(I, J, K)``.

    Returns:
        True for a label map (or a binary mask), False otherwise (also for a constant array).

    Raises:
        ValueError: If an array is not 2D or 3D.
    """
    data, _ = _data_and_spacing(volume)
    if data.size == 0:
        return False
    if data.size > _LABEL_CHECK_VOXELS:
        data = data[(slice(None, None, 2),) * data.ndim]
    if data.dtype.kind == "f":
        if not np.all(np.isfinite(data)) or np.max(np.abs(data - np.rint(data))) > _INTEGER_TOL:
            return False
        data = np.rint(data).astype(np.int64)
    low, high = int(data.min()), int(data.max())
    if low == high:
        return False
    if low >= 0 and high < 2**20:
        counts = np.bincount(data.ravel(order="K"))  # any order counts
        count, background = int(np.count_nonzero(counts)), int(np.argmax(counts))
    else:
        values, counts = np.unique(data, return_counts=True)
        count, background = int(values.size), int(values[np.argmax(counts)])
    if count > MAX_LABEL_IDS:
        return False
    return _same_neighbour_share(data, background) >= _SAME_NEIGHBOUR


class SkullEvidence(NamedTuple):
    """What :func:`skull_evidence` measured, and the verdict it draws.

    Attributes:
        bright_shell: Share of the foreground voxels in the outer 4 mm of the closed
            foreground that are brighter than the foreground median: scalp fat and skin in a
            head, cortex in a skull-stripped brain.
        foreground: Share of the (strided) grid above 10 % of the robust intensity range.
        size: Size of the closed foreground: millilitres (cm³) in 3D, cm² in 2D. A
            stripped brain, closed by 10 mm, measured 1.2–2.5 l; a head 3.6–5.9 l.
        zero_background: Share of the background (the grid farther than 4 mm outside the
            closed foreground) at the image's minimum (within 0.1 % of the range): 0.97–1 in
            stripped brains, whose background a mask set to 0; also high in heads whose scanner
            or converter zeroed the air. None when there is no such background.
        stripped: The verdict: True (a skull-stripped brain), False (a head with skull) or
            None (the measures do not agree clearly: nothing is claimed).
    """

    bright_shell: float
    foreground: float
    size: float
    zero_background: float | None
    stripped: bool | None


def _shifted_pairs(ndim: int) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    pairs = []
    for axis in range(ndim):
        for to, source in ((slice(1, None), slice(None, -1)), (slice(None, -1), slice(1, None))):
            pairs.append(
                (
                    tuple(to if a == axis else slice(None) for a in range(ndim)),
                    tuple(source if a == axis else slice(None) for a in range(ndim)),
                )
            )
    return pairs


def _morph(mask: np.ndarray, steps: int, grow: bool) -> np.ndarray:
    """Dilate (``grow``) or erode ``mask`` by ``steps`` face-neighbour steps; the array border
    is not a neighbour (a mask touching it is not eroded from outside)."""
    pairs = _shifted_pairs(mask.ndim)
    for _ in range(steps):
        out = mask.copy()
        for to, source in pairs:
            if grow:
                out[to] |= mask[source]
            else:
                out[to] &= mask[source]
        mask = out
    return mask


def _bounding_box(mask: np.ndarray, margin: int) -> tuple[slice, ...]:
    """Slices of the smallest box holding ``mask`` (not empty), grown by ``margin`` voxels on
    each side within the array."""
    box = []
    for axis in range(mask.ndim):
        hit = np.flatnonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis)))
        box.append(slice(max(0, hit[0] - margin), min(mask.shape[axis], hit[-1] + margin + 1)))
    return tuple(box)


def _verdict(ndim: int, bright_shell: float, size: float, zero: float | None) -> bool | None:
    """Stripped, head or None from the three measures (thresholds: see the constants)."""
    brain_max, head_min, head_shell = _BRAIN_MAX[ndim], _HEAD_MIN[ndim], _HEAD_SHELL[ndim]
    if size < _TOO_SMALL[ndim]:
        return None  # a slice at the edge of the head, a fragment: too little to judge
    masked = zero is not None and zero >= _ZERO_BACKGROUND
    if size <= brain_max and bright_shell < _STRIPPED_SHELL and masked:
        return True
    if size >= head_min and (bright_shell >= head_shell or (zero is not None and not masked)):
        return False
    return None


def skull_evidence(volume: Volume | np.ndarray) -> SkullEvidence | None:
    """Measure whether an intensity image shows a whole head or a skull-stripped brain.

    On a grid strided to about 2 mm, the foreground (above 10 % of the range from the minimum to
    the 99.5th percentile) is closed by 10 mm (bridging the dark skull between scalp and brain).
    Three measures follow (:class:`SkullEvidence`): the share of bright voxels in its outer
    4 mm shell (a T1-weighted head has bright scalp fat and skin there, a stripped brain has
    cortex, darker than its white matter), its size (ml, or cm² for a slice, from the header's
    voxel size: a brain is far smaller than a head)
    and the share of the background at the minimum (a brain mask sets it to 0; air in a head
    is noisy unless zeroed). The verdict claims only what the measures agree on:

    * stripped: at most 2.8 l (3D) or 200 cm² (a 2D slice), a dark shell (under 15 % bright)
      and at least 90 % of the background at the minimum;
    * head: at least 3.2 l (3D) or 250 cm² (2D), and a bright shell (at least 20 % in 3D,
      35 % in 2D) or a background not zeroed;
    * otherwise None (e.g. a brain-masked head that keeps some scalp, a slice near the top of
      the head, a stripped brain whose header gives the wrong voxel size).

    Measured (``benchmarks/RESULTS_heuristics.md``): no wrong verdict on any 2D or 3D image of
    the shared data nor on resampled (1.5, 3 mm), re-stored, thick-slice (6 mm) or
    brain-masked copies and 2D slices of them. Sizes are in world units, so they trust the
    header's voxel size. Heuristic, for T1-weighted images; T2 heads measured in 2D only, CT
    not at all. The thresholds were chosen on these same inputs: no held-out set.

    Args:
        volume: A :class:`~hyperreg.geometry.io.Volume` (its spacing sets the striding and the
            size) or an array ``(I, J)`` / ``(I, J, K)`` taken as 1 mm voxels.

    Returns:
        A :class:`SkullEvidence`, or None when nothing can be measured (a constant or
        non-finite image, no foreground, or no shell, e.g. tissue filling the whole grid).

    Raises:
        ValueError: If an array is not 2D or 3D.
    """
    data, spacing = _data_and_spacing(volume)
    steps = [max(1, round(_WORK_MM / s)) if s > 0 else 1 for s in spacing]
    work = np.asarray(data[tuple(slice(0, None, s) for s in steps)], dtype=np.float32)
    if work.size == 0 or not np.all(np.isfinite(work)):
        return None
    low, high = float(work.min()), float(np.percentile(work, 99.5))
    if high <= low:
        return None
    scaled = (work - low) / (high - low)
    foreground = scaled > _FOREGROUND
    if not foreground.any():
        return None
    voxel_mm = [s * st for s, st in zip(spacing, steps)]
    mm = float(np.mean(voxel_mm))
    close = max(1, round(_CLOSE_MM / mm))
    shell_steps = max(1, round(_SHELL_MM / mm))
    # the morphology runs on the foreground's bounding box, with room for every step (the
    # same masks as on the whole grid, a fraction of the work for a brain in a 256³ grid)
    box = _bounding_box(foreground, close + 2 * shell_steps + 1)
    inside, values = foreground[box], scaled[box]
    closed = _morph(_morph(inside, close, grow=True), close, grow=False)
    shell = closed & ~_morph(closed, shell_steps, grow=False) & inside
    if not shell.any():
        return None
    median = float(np.median(scaled[foreground]))
    bright = float(np.mean(values[shell] > median))
    unit = 1000.0 if work.ndim == 3 else 100.0  # mm³ per ml, mm² per cm²
    size = float(np.count_nonzero(closed)) * float(np.prod(voxel_mm)) / unit
    near = _morph(closed, shell_steps, grow=True)  # background: the grid outside this
    background = work.size - int(np.count_nonzero(near))
    zeros = int(np.count_nonzero(scaled <= _ZERO_TOL))
    zeros -= int(np.count_nonzero((values <= _ZERO_TOL) & near))
    zero = zeros / background if background else None
    return SkullEvidence(
        bright_shell=bright,
        foreground=float(np.mean(foreground)),
        size=size,
        zero_background=zero,
        stripped=_verdict(work.ndim, bright, size, zero),
    )


def skull_stripped(volume: Volume | np.ndarray) -> bool:
    """Whether an intensity image looks skull-stripped (brain only) rather than a whole head.

    True only when :func:`skull_evidence` says so clearly (its ``stripped`` verdict); False for
    a head and also when it cannot tell ("not shown to be stripped"). Use
    :func:`skull_evidence` to tell a head from "cannot tell".

    Args:
        volume: A :class:`~hyperreg.geometry.io.Volume` or an array ``(I, J)`` / ``(I, J, K)``.

    Returns:
        True for a skull-stripped brain, False for a head with skull or when it cannot tell.

    Raises:
        ValueError: If an array is not 2D or 3D.
    """
    evidence = skull_evidence(volume)
    return evidence is not None and evidence.stripped is True


def _stripped_or_none(volume: Volume | np.ndarray) -> bool | None:
    evidence = skull_evidence(volume)
    return None if evidence is None else evidence.stripped


def check_pair_contents(
    moving: Volume | np.ndarray,
    fixed: Volume | np.ndarray,
    *,
    model_skull_stripped: bool | None = None,
) -> list[str]:
    """One-line warnings about what a moving/fixed pair holds, each naming the file and the fix.

    Checks, in this order: a label map given as the moving or fixed image
    (:func:`looks_like_label_map`); a head with skull against a skull-stripped image
    (the verdicts of :func:`skull_evidence`); and, when ``model_skull_stripped`` is given, an
    image that differs from what the model was trained on. An image whose skull state is not
    told clearly (verdict None, e.g. a brain-masked head keeping some scalp, a 2D slice near
    the top of the head) gets no skull warning: a missed warning is better than a false one.
    Nothing is raised for a valid pair; the caller prints the warnings.

    Args:
        moving: The moving image, a :class:`~hyperreg.geometry.io.Volume` (its path is named)
            or an array.
        fixed: The fixed image, likewise.
        model_skull_stripped: True if the model was trained on skull-stripped images, False if
            on heads, None if unknown (no model check).

    Returns:
        Warnings, one line each (empty when nothing looks wrong).

    Raises:
        ValueError: If an array is not 2D or 3D.
    """
    warnings: list[str] = []
    stripped: dict[str, bool | None] = {}
    for role, volume in (("moving", moving), ("fixed", fixed)):
        if looks_like_label_map(volume):
            warnings.append(
                f"'{_name(volume, role)}' given as the {role} image looks like a label map "
                "(few integer ids, piecewise constant), not an intensity image: give the "
                f"{role} scan as the image and this file as the {role} label map "
                f"(--{role}-seg)"
            )
            stripped[role] = None
        else:
            stripped[role] = _stripped_or_none(volume)
    names = {"moving": _name(moving, "moving"), "fixed": _name(fixed, "fixed")}
    if stripped["moving"] is not None and stripped["fixed"] is not None:
        if stripped["moving"] != stripped["fixed"]:
            head = "moving" if not stripped["moving"] else "fixed"
            brain = "fixed" if head == "moving" else "moving"
            warnings.append(
                f"'{names[head]}' ({head}) looks like a head with skull but '{names[brain]}' "
                f"({brain}) is skull-stripped: the skull and scalp have nothing to match and "
                f"pull the registration; strip '{names[head]}' first (e.g. mri_synthstrip or "
                f"FSL bet), or use an unstripped {brain} image"
            )
    if model_skull_stripped is not None:
        for role in ("moving", "fixed"):
            if stripped[role] is None or stripped[role] == model_skull_stripped:
                continue
            if model_skull_stripped:
                warnings.append(
                    f"'{names[role]}' ({role}) looks like a head with skull but the model was "
                    "trained on skull-stripped brains: strip it first (e.g. mri_synthstrip or "
                    "FSL bet) or use a model trained on heads"
                )
            else:
                warnings.append(
                    f"'{names[role]}' ({role}) looks skull-stripped but the model was trained "
                    "on heads with skull: use a model trained on stripped brains, or check "
                    "the result closely"
                )
    return warnings


def spacing_warning(
    volume: Volume,
    model_spacing: float | Sequence[float] | None,
    *,
    factor: float = 1.5,
    role: str = "input",
) -> str | None:
    """A one-line warning when the voxels of ``volume`` are far from the model's voxel size.

    The network's receptive field and its regulariser (squared displacement differences between
    neighbouring voxels) are in voxels, so a model trained at 1 mm behaves differently on 2 mm
    or 1 × 3 mm voxels (and resampling a 3 mm axis to 1 mm does not restore its detail). Far
    means: along some array axis the spacing is more than ``factor``
    times the model's, or less than ``1 / factor`` of it.

    Args:
        volume: The image (its ``spacing``, mm per array axis, from the affine).
        model_spacing: The model's voxel size in mm (``ModelConfig.spacing``), one value for
            isotropic voxels or one per array axis; None or 0 (unknown, "native") gives no
            warning.
        factor: Allowed ratio, > 1 (default 1.5).
        role: Word used in the message (``"moving"``, ``"fixed"``).

    Returns:
        The warning, or None when the spacing is close enough (or the model's is unknown).

    Raises:
        ValueError: If ``factor <= 1``, a model spacing is negative, or the number of model
            spacings is neither 1 nor ``volume.ndim``.
    """
    if not factor > 1:
        raise ValueError(f"spacing_warning(): 'factor' must be > 1, got {factor}")
    if model_spacing is None:
        return None
    model = np.atleast_1d(np.asarray(model_spacing, dtype=np.float64))
    if model.size not in (1, volume.ndim) or model.ndim != 1:
        raise ValueError(
            f"spacing_warning(): 'model_spacing' must be one value or {volume.ndim}, got "
            f"{model.tolist()}"
        )
    if np.any(model < 0) or not np.all(np.isfinite(model)):
        raise ValueError(
            f"spacing_warning(): 'model_spacing' must be >= 0 mm, got {model.tolist()}"
        )
    if np.all(model == 0):
        return None
    model = np.broadcast_to(model, (volume.ndim,))
    spacing = np.asarray(volume.spacing)
    ratio = spacing / np.where(model > 0, model, spacing)
    if np.all((ratio <= factor) & (ratio >= 1 / factor)):
        return None
    shown = " x ".join(f"{s:.3g}" for s in spacing)
    model_shown = " x ".join(f"{s:.3g}" for s in model)
    return (
        f"'{_name(volume, role)}' ({role}) has {shown} mm voxels, far from the {model_shown} mm "
        "voxels the model was trained on: the network sees it resampled to those voxels, which "
        "does not restore detail that coarser voxels never held, and its accuracy on such "
        "images is unmeasured; images acquired near that voxel size (or a model trained at "
        "this one) avoid the question"
    )


def label_ids_warning(
    moving_seg: Volume, fixed_seg: Volume, either: Sequence[int], both: Sequence[int]
) -> str | None:
    """A one-line warning when two label maps share under half of the ids either holds.

    Such maps come from two labellings (e.g. FreeSurfer aseg ids against a renumbered 1-35
    set); Dice, scored over the ids of either map, is then low whatever the registration does.

    Args:
        moving_seg: Moving label map (integer ids; named in the message).
        fixed_seg: Fixed label map (integer ids; named in the message).
        either: Non-zero ids of either map, both: of both maps
            (:func:`hyperreg.method.metrics.label_sets`).

    Returns:
        The warning, or None when the maps share at least half of their non-zero ids (or hold
        none).
    """
    if not either or len(both) >= _MIN_SHARED_IDS * len(either):
        return None
    return (
        f"'{_name(moving_seg, 'moving label map')}' and '{_name(fixed_seg, 'fixed label map')}' "
        f"share only {len(both)} of the {len(either)} label ids either holds: Dice, scored over "
        "the ids of either map, will be low whatever the registration does; check that both "
        "maps use one labelling (e.g. both FreeSurfer aseg ids)"
    )


def label_grid_warning(seg: Volume, image: Volume) -> str | None:
    """A one-line warning when a label map is not on the voxel grid of its image.

    Both are then placed through their own headers (the label map by nearest neighbour),
    which is right only if both headers are: a label map written with another voxel size or
    origin than its image (an export slip, as in the LapIRN example data) lands beside the
    anatomy it labels, and Dice says so only as a low number.

    Args:
        seg: The label map (named in the message).
        image: Its image (named in the message).

    Returns:
        The warning, or None when both share a grid
        (:func:`~hyperreg.geometry.io.same_grid`: shapes equal, affines within 1e-4).
    """
    if same_grid(seg, image):
        return None

    def grid(volume: Volume) -> str:
        spacing = " x ".join(f"{s:.4g}" for s in volume.spacing)
        origin = ", ".join(f"{o + 0.0:.4g}" for o in volume.affine[:3, 3])  # no "-0"
        return f"shape {volume.spatial_shape}, {spacing} mm voxels, origin ({origin}) mm"

    return (
        f"label map '{_name(seg, 'label map')}' ({grid(seg)}) is not on the grid of its image "
        f"'{_name(image, 'image')}' ({grid(image)}): each is placed through its own header, "
        "which is right only if both headers are; check them"
    )
