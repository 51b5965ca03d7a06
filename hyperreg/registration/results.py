"""Typed results of the registration pipeline (:mod:`hyperreg.registration.pipeline`).

:class:`RegistrationResult` is one model run on a pair on the fixed grid
(:func:`~hyperreg.registration.lambdas.register_pair`, sweeps, refinement); :class:`PairResult` is
one pair registered at one λ, every output already through the whole chain;
:class:`AffineStage` and :class:`RefineStats` are the statistics of the affine stage and of
test-time refinement, as fields rather than entries of an untyped dict. Must not import
training, apps or cli.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hyperreg.geometry.affine import AffineTransform
from hyperreg.registration.verdict import Verdict

__all__ = [
    "AffineStage",
    "PairResult",
    "RefineStats",
    "RegistrationResult",
    "Verdict",
    "mean_of",
]


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
        steps: Most Adam steps per level, as asked for
            (:attr:`~hyperreg.registration.refine.Refinement.steps`; 0: the network's field,
            not refined); the steps taken are ``steps_taken``.
        similarity: ``"ncc"``, ``"mse"``, ``"mi"`` or ``"mind"``.
        seconds: Optimisation wall time in seconds (CUDA synchronised).
        similarity_before, similarity_after: The similarity of the network's field and of the
            refined one, higher is better: local NCC in [0, 1], minus MSE / σ², MI in nats, or
            minus the MIND-SSC distance.
        loss_before, loss_after: The objective at λ (dimensionless) of the same two fields.
        steps_taken: Adam steps taken per level, ``(coarse, fine)``; ``(0, n)`` without a
            coarse level.
        fell_back: The network's field was kept: the refined loss did not fall.
        quarter_steps: Adam steps taken at the quarter level (0 without one).
    """

    steps: int
    similarity: str
    seconds: float
    similarity_before: float
    similarity_after: float
    loss_before: float
    loss_after: float
    steps_taken: tuple[int, int] = (0, 0)
    fell_back: bool = False
    quarter_steps: int = 0


@dataclass
class RegistrationResult:
    """Outputs of one registration, on the fixed grid, as numpy arrays.

    Attributes:
        moved: Moved image, spatial shape of ``fixed``, float32, in the moving image's own
            intensity units (the model sees normalised intensities; the output does not); 0
            where the field points outside the moving image, as ANTs and ITK resample. None
            when the caller asked for the field only (``images=False``).
        disp: Displacement ``(N, *S)`` in voxels, i/j/k order, ``moved[x] = moving(x + disp(x))``.
        moved_seg: Moved label map (int32, nearest neighbour) or None.
        lam: The λ used.
        dice: ``{label: Dice}`` between moved and fixed label maps, or None.
        folding_fraction: Share of voxels with Jacobian determinant ≤ 0.
        log_jacobian_std: Standard deviation of log J.
        smoothness: :func:`~hyperreg.method.losses.gradient_loss` of the field training
            regularises (the velocity when the model integrates one, else the displacement),
            voxels²; times ``int_downsize`` for a half-resolution velocity, as in the training
            loss. None when not computed.
        dice_before: Mean Dice of the unregistered label maps (same labels), or None.
        ncc: Local NCC (squared, window 9, in [0, 1]) of the model's moved image and the
            fixed image (normalised, network grid), from refinement and from sweeps that ask
            for it, else None.
        refinement: The refinement's statistics (from
            :func:`~hyperreg.registration.refine.refine_pair`), else None.
        resampled: One message per input that was resampled onto the fixed grid, e.g.
            ``"resampled moving 'm.nii.gz' (shape (150, 181), ...) onto the fixed grid (...)"``.
        inverse_disp: Inverse displacement ``(N, *S)`` in voxels (``exp(−v)``, on the fixed
            grid), when asked for (:func:`hyperreg.registration.refine.refine_pair`), else None.
    """

    moved: np.ndarray | None
    disp: np.ndarray
    moved_seg: np.ndarray | None
    lam: float
    dice: dict[int, float] | None = None
    folding_fraction: float = 0.0
    log_jacobian_std: float = 0.0
    smoothness: float | None = None
    dice_before: float | None = None
    ncc: float | None = None
    refinement: RefineStats | None = None
    resampled: list[str] = field(default_factory=list)
    inverse_disp: np.ndarray | None = None

    @property
    def mean_dice(self) -> float | None:
        """Mean Dice over the scored labels, or None without label maps."""
        return None if self.dice is None else mean_of(self.dice.values())


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
        shared_labels: The label ids both input maps hold (the others of ``dice`` are in one
            map only and score 0), or None when not recorded.
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
        verdict: The pair's :class:`~hyperreg.registration.verdict.Verdict` (similarity as it
            came, after the affine and registered; the affine's scales and shears; ``ok`` or
            ``check: <reason>``; what the result holds), or None when not judged. When it
            kept the affine alone or the pair as it came, ``disp`` is zero and the field
            statistics are the identity's.
        settings: The :class:`~hyperreg.registration.settings.RegistrationSettings` it ran
            with (set by :func:`hyperreg.registration.engine.run`), or None.
    """

    lam: float
    moved: np.ndarray
    moved_seg: np.ndarray | None
    disp: np.ndarray
    warp: np.ndarray
    dice: dict[int, float] | None = None
    dice_before: float | None = None
    dice_affine: float | None = None
    shared_labels: list[int] | None = None
    folding_fraction: float = 0.0
    log_jacobian_std: float = 0.0
    smoothness: float | None = None
    ncc: float | None = None
    affine: AffineStage | None = None
    refinement: RefineStats | None = None
    inverse_disp: np.ndarray | None = None
    resampled: list[str] = field(default_factory=list)
    lam_reason: str = ""
    verdict: Verdict | None = None
    settings: Any = None  # RegistrationSettings (its module imports this one)

    @property
    def mean_dice(self) -> float | None:
        """Mean Dice over the scored labels, or None without label maps."""
        return None if self.dice is None else mean_of(self.dice.values())


def mean_of(values: Iterable[float]) -> float:
    """Mean of ``values`` ignoring NaN; NaN when nothing is left."""
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else float("nan")
