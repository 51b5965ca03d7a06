"""Do the two images of a pair show the same contrast? (T1 to T1, or T2/FLAIR to T1.)

:func:`compare_contrasts` looks at the pair on one grid (the moving image after the affine
stage, the fixed image) and asks whether the moving intensity rises with the fixed one over
the head. Where both images show the same contrast (T1 and T1, even of two people, or one image
and a monotone change of it) the moving image's median intensity rises from the fixed image's
darkest tissue to its brightest. Where they do not (a T2 or FLAIR to a T1) it does not: CSF is
dark in T1 and bright in T2, grey matter is darker than white matter in T1 and brighter in T2
and FLAIR. :func:`similarity_for` turns the answer into the verdict's similarity (None, the
model's own, for the same contrast; :data:`OTHER_SIMILARITY`, normalised gradient fields,
otherwise), :func:`remap_pair` gives the network and refinement the moving image drawn in the
fixed image's intensities (:func:`hyperreg.geometry.intensity_map.intensity_map`: the networks
were trained on T1-like images; refinement then keeps the model's own similarity, local NCC
for the bundled models, which on the bundled 3D model gave a higher Dice than mutual
information at a fifth of the time, ``benchmarks/RESULTS_contrast.md``) and
:func:`contrast_note` says it in the one line the command line logs.
Must not import the pipeline, training, apps or cli.

The rule (:data:`RISE_THRESHOLD`, :data:`HEAD_FRACTION`, :data:`BINS`) was set on the shared
data (``benchmarks/RESULTS_contrast.md``): the 109 T1 to T1 pairs there scored 0.77 to 1.00
(none flagged), the real T2 to T1 pairs -0.47 to 0.33 and the synthetic T2/FLAIR ones -0.91
to 0.78 (two of five synthetic 3D T2 heads, 0.75 and 0.78, are missed: they run as the same
contrast).

References:
    Roche, Malandain, Pennec, Ayache. The correlation ratio as a new similarity measure for
    multimodal image registration. MICCAI 1998 (intensities of one image as a function of the
    other's, binned).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyperreg._checks import check_option
from hyperreg._errors import InputError
from hyperreg.geometry.intensity_map import intensity_map
from hyperreg.registration.masks import cut_view, filled_view
from hyperreg.registration.refine import Refinement

__all__ = [
    "BINS",
    "CONTRAST_CHOICES",
    "HEAD_FRACTION",
    "MIN_OVERLAP",
    "OTHER_MIN_LAMBDA",
    "OTHER_SIMILARITY",
    "RISE_THRESHOLD",
    "TIE_FRACTION",
    "ContrastCheck",
    "compare_contrasts",
    "contrast_lambda",
    "contrast_note",
    "contrast_options",
    "contrast_similarity",
    "pair_similarity",
    "remap_pair",
    "similarity_for",
]

logger = logging.getLogger(__name__)

CONTRAST_CHOICES = ("auto", "same", "different")
BINS = 10  # quantile bins of the fixed intensities over the head overlap
HEAD_FRACTION = 0.1  # a voxel is head when above this fraction of its image's 99.5th percentile
MIN_OVERLAP = 500  # fewer head voxels in both images: too little to judge (the same contrast)
TIE_FRACTION = 0.05  # binned medians within this fraction of the intensity range are ties
RISE_THRESHOLD = 0.72  # the lower rank correlation below this: contrasts differ
OTHER_SIMILARITY = "ngf"  # the verdict of other contrasts: normalised gradient fields
OTHER_MIN_LAMBDA = 0.2  # a model's default λ below this is raised to it for other contrasts


@dataclass(frozen=True)
class ContrastCheck:
    """What :func:`compare_contrasts` found.

    Attributes:
        differ: True when the intensities do not correspond (e.g. T2 or FLAIR to T1).
        rise: Spearman rank correlation, in [-1, 1], between one image's intensity bins
            (quantiles over the head overlap, darkest first) and the other image's median in
            each, the lower of the two ways round: near 1 for the same contrast, low or
            negative for another; NaN when not measured.
        correlation: Pearson correlation of the two images' intensities over the overlap
            (reported, not used by the rule); NaN when not measured.
        voxels: Voxels in the head overlap.
        reason: One line: why.
    """

    differ: bool
    rise: float
    correlation: float
    voxels: int
    reason: str


def compare_contrasts(moving: np.ndarray, fixed: np.ndarray) -> ContrastCheck:
    """Whether ``moving`` and ``fixed`` (one grid, any intensity units) differ in contrast.

    The head of each image is where it exceeds :data:`HEAD_FRACTION` of its own 99.5th
    percentile (non-finite voxels are not head); over their overlap the fixed intensities are
    cut into :data:`BINS` quantile bins and the moving image's median in each bin is ranked
    against the bins' order (Spearman), then the same with the roles swapped (a T2 head's
    bright CSF shows as a fall even where scalp voxels, alike in both, fill the fixed image's
    bins); ``rise`` is the lower of the two. Contrasts differ when ``rise`` is below
    :data:`RISE_THRESHOLD`. Medians closer than :data:`TIE_FRACTION` of the image's intensity
    range (0.5th to 99.5th percentile) rank as ties, so noise inside one tissue does not count
    as a fall. A monotone change of intensities (gamma, a window, a scanner's
    scaling) keeps the medians' order, so it never counts as another contrast. Fewer than
    :data:`MIN_OVERLAP` overlapping head voxels, or an image with fewer than 3 distinct
    levels there, is too little to judge: the same contrast.

    Args:
        moving: The moving image on the fixed grid (after the affine stage), shape ``S``.
        fixed: The fixed image, shape ``S``.

    Returns:
        A :class:`ContrastCheck`.

    Raises:
        InputError: If the shapes differ.
    """
    fn = "compare_contrasts"
    moving, fixed = np.asarray(moving), np.asarray(fixed)
    if moving.shape != fixed.shape:
        message = "{0} has shape {a} but {1} has shape {b}; give both on one grid"
        raise InputError(fn, message, "moving", "fixed", a=moving.shape, b=fixed.shape)
    overlap = _head(moving) & _head(fixed)
    voxels = int(overlap.sum())
    if voxels < MIN_OVERLAP:
        reason = f"{voxels} head voxels overlap (fewer than {MIN_OVERLAP}): not judged"
        return ContrastCheck(False, float("nan"), float("nan"), voxels, reason)
    m = moving[overlap].astype(np.float64)
    f = fixed[overlap].astype(np.float64)
    rises = [_rise(m, f), _rise(f, m)]  # each image's median over the other's bins
    if any(r is None for r in rises):
        reason = "an image has too few intensity levels over the head: not judged"
        return ContrastCheck(False, float("nan"), float("nan"), voxels, reason)
    rise = min(r for r in rises if r is not None)
    correlation = _pearson(m, f)
    differ = rise < RISE_THRESHOLD
    verb = "does not rise" if differ else "rises"
    sign = "<" if differ else ">="
    reason = (
        f"the moving intensity {verb} with the fixed one over the head: rank correlation "
        f"{rise:.2f} {sign} {RISE_THRESHOLD:g}"
    )
    return ContrastCheck(differ, rise, correlation, voxels, reason)


def similarity_for(contrast: str, check: ContrastCheck | None) -> str | None:
    """The similarity to judge with: :data:`OTHER_SIMILARITY` (``"ngf"``) when ``contrast``
    is ``"different"``, or ``"auto"`` and ``check.differ``; else None (the model's own: local
    NCC for the bundled models, MSE for a model trained with it).

    Raises:
        InputError: If ``contrast`` is not one of :data:`CONTRAST_CHOICES`, or is ``"auto"``
            without a check.
    """
    fn = "similarity_for"
    check_option(fn, "contrast", contrast, CONTRAST_CHOICES)
    if contrast == "auto" and check is None:
        raise InputError(fn, "{0} 'auto' needs {1}", "contrast", "check")
    if contrast == "different" or (contrast == "auto" and check is not None and check.differ):
        return OTHER_SIMILARITY
    return None


def pair_similarity(
    contrast: str, moving: np.ndarray, fixed: np.ndarray
) -> tuple[str | None, ContrastCheck | None]:
    """The similarity of a pair (:func:`similarity_for`) and, with ``contrast="auto"``, the
    :class:`ContrastCheck` it came from (None otherwise: nothing is measured).

    Args:
        contrast: One of :data:`CONTRAST_CHOICES`.
        moving, fixed: The pair on one grid (the moving image after the affine stage).

    Raises:
        InputError: If ``contrast`` is unknown or the shapes differ.
    """
    check_option("pair_similarity", "contrast", contrast, CONTRAST_CHOICES)
    check = compare_contrasts(moving, fixed) if contrast == "auto" else None
    return similarity_for(contrast, check), check


def contrast_lambda(lam: float, similarity: str | None) -> float | None:
    """The λ a pair of other contrasts is registered at instead of a model's default ``lam``:
    :data:`OTHER_MIN_LAMBDA` when ``similarity`` is :data:`OTHER_SIMILARITY` and ``lam`` is
    below it (a smoother field: with the bundled 2D model, λ 0.2 gave the synthetic T2 and
    FLAIR slices of ``benchmarks/RESULTS_contrast.md`` a higher Dice than its default 0.05);
    None when ``lam`` stays."""
    if similarity == OTHER_SIMILARITY and lam < OTHER_MIN_LAMBDA:
        return OTHER_MIN_LAMBDA
    return None


def remap_pair(pair: Any) -> None:
    """Give ``pair`` (a :class:`~hyperreg.registration.prepared.PreparedPair`) the moving
    image the network sees for other contrasts: ``pair.aligned`` drawn in the fixed image's
    intensities (:func:`~hyperreg.geometry.intensity_map.intensity_map`) as
    ``pair.remapped``. The outputs are then sampled from the moving image as read
    (``pair.chained`` set), and the verdict scores that image, not the remapped one. For a cut
    field of view (:func:`~hyperreg.registration.masks.cut_view`) the map is found inside the
    moving array's footprint only and the fixed image fills the rest
    (:func:`~hyperreg.registration.masks.filled_view`).

    Raises:
        InputError: If the moving image has fewer than two intensity levels.
    """
    inside, aligned = cut_view(pair), pair.aligned.data
    seen = aligned if inside is None else np.where(inside, aligned, np.nan)
    mapping = intensity_map(seen, pair.fixed.data)
    pair.remapped = dataclasses.replace(pair.aligned, data=mapping.apply(aligned))
    if inside is not None:
        pair.remapped = filled_view(pair.remapped, pair.fixed, inside)
    pair.chained = True  # outputs from the file as read, never the remapped copy


def contrast_similarity(pair: Any, contrast: str) -> str | None:
    """The similarity a prepared pair is judged by (:data:`OTHER_SIMILARITY`, or None for the
    model's own):
    :func:`pair_similarity` on ``pair.aligned.data`` (the moving image after the affine stage)
    and ``pair.fixed.data`` (a :class:`~hyperreg.registration.prepared.PreparedPair`); one
    INFO line (:func:`contrast_note`) when ``"auto"`` found other contrasts or ``"different"``
    asked for them. For other contrasts the pair is given its remapped moving image
    (:func:`remap_pair`).

    Raises:
        InputError: If ``contrast`` is not one of :data:`CONTRAST_CHOICES`.
    """
    similarity, check = pair_similarity(contrast, pair.aligned.data, pair.fixed.data)
    if check is not None and check.differ:
        logger.info("%s", contrast_note(check))
    elif contrast == "different":
        logger.info("%s", contrast_note(None))
    if similarity == OTHER_SIMILARITY:
        remap_pair(pair)
    return similarity


def contrast_options(pair: Any, contrast: str, refinement: Refinement | None) -> dict[str, Any]:
    """The keyword arguments ``refinement`` and ``similarity`` of
    :meth:`~hyperreg.registration.prepared.PreparedPair.register` for ``pair``: the similarity
    of :func:`contrast_similarity` (which remaps the pair's moving image for other contrasts)
    and ``refinement`` as given (it refines the remapped image with its own similarity)."""
    return {"refinement": refinement, "similarity": contrast_similarity(pair, contrast)}


def contrast_note(check: ContrastCheck | None) -> str:
    """The one line logged when ``auto`` found other contrasts (``check``), or when they were
    asked for (None: ``"different"``, or a refinement similarity for other contrasts)."""
    why = "as asked" if check is None else check.reason
    return (
        f"other contrasts ({why}): the network and refinement see the moving image "
        "drawn in the fixed image's intensities and the verdict uses normalised gradient "
        "fields (--contrast same: the images as read)"
    )


def _rise(values: np.ndarray, by: np.ndarray) -> float | None:
    """Rank correlation of the median of ``values`` in each quantile bin of ``by`` (darkest
    first) with the bins' order; None when ``by`` has fewer than 3 distinct bins."""
    edges = np.unique(np.quantile(by, np.linspace(0.0, 1.0, BINS + 1)))
    if edges.size < 4:
        return None
    bins = np.clip(np.searchsorted(edges, by, side="right") - 1, 0, edges.size - 2)
    medians = np.array([np.median(values[bins == b]) for b in np.unique(bins)])
    low, high = np.percentile(values, [0.5, 99.5])
    step = TIE_FRACTION * float(high - low)  # medians closer than this are ties (noise)
    return _rank_correlation(np.round(medians / step) if step > 0 else medians)


def _head(image: np.ndarray) -> np.ndarray:
    """Voxels above :data:`HEAD_FRACTION` of the image's 99.5th percentile (finite only)."""
    finite = np.isfinite(image)
    if not finite.any():
        return finite
    top = float(np.percentile(image[finite], 99.5))
    with np.errstate(invalid="ignore"):
        return finite & (image > HEAD_FRACTION * top) if top > 0 else finite & (image > top)


def _rank_correlation(values: np.ndarray) -> float:
    """Spearman correlation of ``values`` with their positions 0, 1, … (ties averaged)."""
    order = np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(np.float64)
    for value in np.unique(values):  # average the ranks of ties
        tied = values == value
        order[tied] = order[tied].mean()
    return _pearson(order, np.arange(values.size, dtype=np.float64))


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation; 0 when either is constant."""
    a, b = a - a.mean(), b - b.mean()
    denominator = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denominator) if denominator > 0 else 0.0
