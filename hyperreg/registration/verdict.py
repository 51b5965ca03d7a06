"""The verdict on one registered pair, and the rule that never returns a worse result.

:func:`judge` is a pure function of the pair's similarities (as it came through the headers,
after the affine stage, registered: the model's own similarity on the network grid, higher is
better) and of the result's statistics (folding, the affine's scales and shears). It says which
result to keep (:data:`KEPT`) and gives a :class:`Verdict`: ``ok``, or ``check: <reasons>``
for an implausible affine, a registration that lowered the similarity, or folding above
:data:`MAX_FOLDING`. :func:`decompose_affine` gives the scales and shears of an affine's linear
part. Numbers only: no torch, no files. Must not import training, apps or cli.

References:
    FSL's ``avscale`` (the rotation, scales and upper-triangular shears of an affine's
    3 x 3 part); ITK's ``ScaleSkewVersor3DTransform`` (the same factorisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "KEPT",
    "MAX_FOLDING",
    "MAX_SHEAR",
    "MIN_FIELD_OF_VIEW",
    "MIN_GAINS",
    "SCALE_RANGE",
    "SIMILARITY_MARGIN",
    "AffineShape",
    "Verdict",
    "decompose_affine",
    "judge",
]

KEPT = ("registered", "affine", "headers")
"""What a result holds: the registration, the affine stage alone (identity field) or the pair
as it came (the headers' identity, no affine, identity field)."""

SIMILARITY_MARGIN = 0.01
"""A registration counts as less similar than the best of the pair as it came and after the
affine when its similarity is lower by more than this share of that best value's magnitude
(1 %), or by more than :data:`_ABSOLUTE_MARGIN` where that value is near 0 (an MSE of
identical images). Measured with the bundled 2D model's local NCC on five Mindboggle slices
(``benchmarks/RESULTS_trust.md``): a slice resampled shifted by 0.1 voxel along both axes
lowers it by 0.4 %, by 0.25 voxel by 2.4-2.8 % (1 % is about a 0.15-voxel shift, with its
interpolation); the network's field on a slice registered to itself lowers it by 2.5-15 %;
registrations of different people at λ <= 0.6 raise it by 82-285 %."""

_ABSOLUTE_MARGIN = 1e-4

MIN_GAINS = {"ngf": 0.07}
"""Similarity -> the share by which a registration judged by it must raise the best of the
pair as it came and the affine alone to be kept (0 for the others). Normalised gradient fields
judge pairs of other contrasts (:mod:`hyperreg.registration.contrast`), where the network's
field raises every similarity a little even on a pair already aligned; measured with the
bundled 2D model (``benchmarks/RESULTS_contrast.md``)."""

SCALE_RANGE = (0.6, 1.6)
"""Plausible scales of an affine between two heads (fixed world -> moving world)."""

MAX_SHEAR = 0.3
"""Largest plausible shear (the tangent of the shear angle, ~17 degrees)."""

MAX_FOLDING = 0.005
"""Largest plausible share of voxels with ``J <= 0`` (0.5 %)."""

MIN_FIELD_OF_VIEW = 0.8
"""A moving image whose field of view covers less of the fixed head (after the affine stage)
than this share gets a reason to check: a cut or partial scan."""

_KEPT_TEXT = {"affine": "the affine alone", "headers": "the pair as it came (no registration)"}


@dataclass(frozen=True)
class AffineShape:
    """Scales and shears of an affine's linear part ``L = Q · diag(scales) · (I + K)``.

    Attributes:
        scales: Per world axis (x, y, z order of the RAS frame), positive.
        shears: The strictly upper entries of ``K``, ``(xy, xz, yz)``: dimensionless tangents.
        mirrored: ``det L < 0`` (the transform flips the image).
    """

    scales: tuple[float, ...]
    shears: tuple[float, ...]
    mirrored: bool = False

    def text(self) -> str:
        """``"scales 1.02 0.98 1.01, shears 0.01 -0.02 0.00"`` (``", mirrored"`` when so)."""
        scales = " ".join(f"{s:.3f}" for s in self.scales)
        shears = " ".join(f"{s:.3f}" for s in self.shears)
        return f"scales {scales}, shears {shears}" + (", mirrored" if self.mirrored else "")


def decompose_affine(matrix: np.ndarray) -> AffineShape:
    """The scales and shears of the ``(3, 3)`` linear part of a ``(4, 4)`` world affine.

    QR factorisation ``L = Q · U`` with ``Q`` orthogonal and ``U`` upper triangular with a
    positive diagonal: ``scales = diag(U)``, ``shears[i, j] = U[i, j] / U[i, i]`` (``i < j``);
    translation does not enter. An identity or a rotation gives scales 1 and shears 0.

    Args:
        matrix: ``(4, 4)`` (or ``(3, 3)``) float, e.g.
            :attr:`hyperreg.geometry.affine.AffineTransform.matrix`.

    Returns:
        An :class:`AffineShape`.

    Raises:
        ValueError: If ``matrix`` is not ``(3, 3)`` or ``(4, 4)`` or holds non-finite values.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.shape not in ((3, 3), (4, 4)) or not np.all(np.isfinite(matrix)):
        raise ValueError(
            "decompose_affine(): 'matrix' must be a finite (4, 4) or (3, 3) array, got shape "
            f"{matrix.shape}"
        )
    linear = matrix[:3, :3]
    _, upper = np.linalg.qr(linear)
    signs = np.where(np.diag(upper) < 0, -1.0, 1.0)
    upper = signs[:, None] * upper  # Q · U = (Q · S) · (S · U) with S = diag(signs)
    scales = np.diag(upper)
    safe = np.where(scales > 0, scales, 1.0)
    shears = [upper[i, j] / safe[i] for i in range(3) for j in range(i + 1, 3)]
    return AffineShape(
        scales=tuple(float(s) for s in scales),
        shears=tuple(float(s) for s in shears),
        mirrored=bool(np.linalg.det(linear) < 0),
    )


@dataclass(frozen=True)
class Verdict:
    """The verdict on one registered pair.

    Attributes:
        similarity_before: The pair as it came (through the headers), or NaN.
        similarity_affine: After the affine stage alone, or NaN without one.
        similarity_after: Registered (the field the model gave, before any fallback).
        kept: What the result holds, one of :data:`KEPT`.
        reasons: Why the pair needs checking; empty when it does not.
        affine: The affine's scales and shears, or None without an affine stage.
    """

    similarity_before: float
    similarity_affine: float
    similarity_after: float
    kept: str = "registered"
    reasons: tuple[str, ...] = ()
    affine: AffineShape | None = None

    @property
    def ok(self) -> bool:
        """Nothing to check."""
        return not self.reasons

    @property
    def text(self) -> str:
        """``"ok"`` or ``"check: <reason>; <reason>"``."""
        return "ok" if self.ok else "check: " + "; ".join(self.reasons)


def _worse(after: float, best: float, margin: float) -> bool:
    """``after`` lies below ``best`` by more than the margin (relative, absolute near 0)."""
    return after < best - max(margin * abs(best), _ABSOLUTE_MARGIN)


def judge(
    similarity_before: float,
    similarity_affine: float | None,
    similarity_after: float,
    *,
    folding_fraction: float = 0.0,
    affine: AffineShape | None = None,
    never_worse: bool = True,
    margin: float = SIMILARITY_MARGIN,
    field_of_view: float | None = None,
    min_gain: float = 0.0,
) -> Verdict:
    """The verdict on one pair, and the result to keep.

    The registration is worse when ``similarity_after`` lies below the best of
    ``similarity_before`` and ``similarity_affine`` by more than ``margin`` times that best
    value's magnitude (:data:`SIMILARITY_MARGIN`). Then, with ``never_worse``, the better of
    the two is kept (``"affine"`` on a tie); without, the registration is kept and flagged.
    Further reasons to check: folding above :data:`MAX_FOLDING` (of the field kept: none for
    a fallback), a scale outside :data:`SCALE_RANGE`, a shear beyond :data:`MAX_SHEAR` or a
    mirroring affine.

    Args:
        similarity_before: The pair as it came; NaN when not measured (ignored).
        similarity_affine: After the affine stage alone; None or NaN without one.
        similarity_after: Registered.
        folding_fraction: Share of voxels with ``J <= 0`` of the registration's field.
        affine: :func:`decompose_affine` of the affine stage's transform, or None.
        never_worse: Keep the better of before/affine when the registration is worse.
        margin: Relative margin (``>= 0``) below which a lower similarity is noise.
        field_of_view: Share of the fixed head inside the moving image's field of view
            (:func:`~hyperreg.registration.masks.field_of_view`), or None; below
            :data:`MIN_FIELD_OF_VIEW` a reason to check.
        min_gain: Share (``>= 0``, :data:`MIN_GAINS`) by which the registration must raise
            the best of the other two to count as better; one that is not worse but gains
            less is treated as worse (kept or replaced alike), with its own reason.

    Returns:
        A :class:`Verdict`.

    Raises:
        ValueError: If ``margin`` or ``min_gain`` is negative or not finite.
    """
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"judge(): 'margin' must be a finite number >= 0, got {margin}")
    if not (math.isfinite(min_gain) and min_gain >= 0):
        raise ValueError(f"judge(): 'min_gain' must be a finite number >= 0, got {min_gain}")
    affine_sim = math.nan if similarity_affine is None else float(similarity_affine)
    reasons: list[str] = []
    if affine is not None:
        low, high = SCALE_RANGE
        if any(not low <= s <= high for s in affine.scales):
            scales = " ".join(f"{s:.2f}" for s in affine.scales)
            reasons.append(f"implausible affine: scales {scales} outside [{low:g}, {high:g}]")
        if any(abs(s) > MAX_SHEAR for s in affine.shears):
            shears = " ".join(f"{s:.2f}" for s in affine.shears)
            reasons.append(f"implausible affine: shears {shears} beyond ±{MAX_SHEAR:g}")
        if affine.mirrored:
            reasons.append("implausible affine: it mirrors the image")
    candidates = {"affine": affine_sim, "headers": float(similarity_before)}
    candidates = {k: v for k, v in candidates.items() if math.isfinite(v)}
    kept = "registered"
    if candidates and math.isfinite(similarity_after):
        best_kind = max(candidates, key=lambda k: (candidates[k], k == "affine"))
        best = candidates[best_kind]
        text = None
        if _worse(similarity_after, best, margin):
            text = f"registration lowered similarity {best:.4f} -> {similarity_after:.4f}"
        elif min_gain > 0 and similarity_after < best + min_gain * abs(best):
            text = (
                f"registration raised similarity only {best:.4f} -> {similarity_after:.4f} "
                f"(less than {100 * min_gain:g} %)"
            )
        if text is not None:
            if never_worse:
                kept = best_kind
                reasons.append(f"{text}; kept {_KEPT_TEXT[best_kind]}")
            else:
                reasons.append(f"{text}; kept it (never-worse rule off)")
    elif not math.isfinite(similarity_after):
        reasons.append("registered similarity is not finite")
    if field_of_view is not None and field_of_view < MIN_FIELD_OF_VIEW:
        reasons.append(
            f"partial field of view: the moving image covers {100 * field_of_view:.0f} % of "
            "the fixed head"
        )
    if kept == "registered" and folding_fraction > MAX_FOLDING:
        reasons.append(
            f"folding {100 * folding_fraction:.2f} % of voxels (limit {100 * MAX_FOLDING:g} %)"
        )
    return Verdict(
        similarity_before=float(similarity_before),
        similarity_affine=affine_sim,
        similarity_after=float(similarity_after),
        kept=kept,
        reasons=tuple(reasons),
        affine=affine,
    )
