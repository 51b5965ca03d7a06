"""Typed results of the registration pipeline (:mod:`hyperreg.registration.pipeline`).

:class:`PairResult` is one pair registered at one λ, every output already through the whole
chain; :class:`AffineStage` and :class:`RefineStats` are the statistics of the affine stage and
of test-time refinement, as fields rather than entries of an untyped dict. Must not import
training, apps or cli.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from hyperreg.geometry.affine import AffineTransform

__all__ = ["AffineStage", "PairResult", "RefineStats", "mean_of"]


@dataclass(frozen=True)
class AffineStage:
    """What the affine stage did for a pair.

    Attributes:
        kind: ``"affine"``, ``"rigid"`` or ``"initial"`` (a given transform, nothing computed).
        seconds: Wall time.
        mi_before: Mattes MI of the pair as it lies (lower is better; NaN if not computed).
        mi_after: Mattes MI through the transform kept.
        identity_kept: The stage kept the identity: it found no MI gain, or its result moved
            the fixed grid's corners by under 3 voxels (an already-aligned pair).
    """

    kind: str
    seconds: float
    mi_before: float
    mi_after: float
    identity_kept: bool

    @classmethod
    def of(cls, transform: AffineTransform, kind: str | None = None) -> AffineStage:
        """The statistics of ``transform`` (from :func:`register_affine` or given)."""
        identity = bool(np.allclose(transform.matrix, np.eye(4), atol=1e-9))
        return cls(
            kind=kind or transform.kind,
            seconds=transform.seconds,
            mi_before=transform.metric_before,
            mi_after=transform.metric_after,
            identity_kept=identity and kind is None,
        )


@dataclass(frozen=True)
class RefineStats:
    """Test-time refinement of one field (:func:`hyperreg.registration.refine.refine_pair`).

    Attributes:
        steps: Adam steps taken.
        similarity: ``"ncc"`` or ``"mi"``.
        seconds: Optimisation wall time.
        similarity_before, similarity_after: The similarity (higher is better).
        loss_before, loss_after: The objective at λ.
    """

    steps: int
    similarity: str
    seconds: float
    similarity_before: float
    similarity_after: float
    loss_before: float
    loss_after: float


@dataclass
class PairResult:
    """One pair registered at one λ, every array on the fixed grid.

    Attributes:
        lam: λ.
        moved: Moved image, the moving file's own intensities, sampled once through the chain.
        moved_seg: Moved label map (int32), or None without a moving label map.
        disp: The deformable displacement alone ``(N, *S)``, fixed voxels, i/j/k order, defined
            on the moving image after the affine stage.
        warp: The whole transform (affine then ``disp``) as one field in the same format
            (:func:`~hyperreg.registration.chain.composed_displacement`); ``disp`` itself when
            there is no affine to compose.
        dice: ``{label: Dice}`` (:func:`~hyperreg.method.metrics.registration_dice`), or None.
        dice_before: Mean Dice with no registration (through the headers), same labels.
        dice_affine: Mean Dice of the affine stage alone, or None without one.
        folding_fraction: Share of voxels with ``J <= 0`` of ``disp``.
        log_jacobian_std: Standard deviation of ``log J`` of ``disp``.
        smoothness: The training's smoothness term of the field, or None.
        ncc: Local NCC of the network's moved and fixed images (normalised), or None.
        affine: The affine stage's statistics, or None when none ran.
        refinement: The refinement's statistics, or None when not refined.
        inverse_disp: Inverse of ``disp`` (``exp(-v)``), when asked for, else None.
        resampled: One note per input brought onto another grid.
        lam_reason: Why this λ (given, the model's default and its source, or the label-free
            choice), set by the caller that chose it; "" when not recorded.
    """

    lam: float
    moved: np.ndarray
    moved_seg: np.ndarray | None
    disp: np.ndarray
    warp: np.ndarray
    dice: dict[int, float] | None = None
    dice_before: float | None = None
    dice_affine: float | None = None
    folding_fraction: float = 0.0
    log_jacobian_std: float = 0.0
    smoothness: float | None = None
    ncc: float | None = None
    affine: AffineStage | None = None
    refinement: RefineStats | None = None
    inverse_disp: np.ndarray | None = None
    resampled: list[str] = field(default_factory=list)
    lam_reason: str = ""

    @property
    def mean_dice(self) -> float | None:
        """Mean Dice over the scored labels, or None without label maps."""
        return None if self.dice is None else mean_of(self.dice.values())


def mean_of(values: Iterable[float]) -> float:
    """Mean of ``values`` ignoring NaN; NaN when nothing is left."""
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else float("nan")
