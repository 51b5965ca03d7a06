"""λ* tuning: the λ that maximises mean validation Dice, optionally under a folding limit.

:func:`tune_lambda` evaluates a coarse λ grid on every validation pair with one sweep per pair
(:meth:`~hyperreg.registration.pipeline.PreparedPair.register`), then refines inside the
bracket around the best value (λ bracketing), and reports the best λ per label too. Each λ is
registered as ``register`` runs it: the model's network passes, and the test-time refinement
given (``refine``; the command line gives the model's default, as ``register`` does).
:func:`write_tune_report` writes ``tune.json`` and ``tune.png``; :func:`read_tuned_lambda` reads
λ* back from ``tune.json`` (``register --lambda tune.json``); both, :class:`TuneResult` and
:func:`lambda_star_range` live in :mod:`hyperreg.apps.tune_report` and are re-exported here.
Must not import train or cli.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hyperreg._checks import check_option
from hyperreg._errors import InputError
from hyperreg.apps.inputs import PairSpec, parse_lambdas
from hyperreg.apps.tune_report import (
    DICE_NOISE_FLOOR,
    TUNE_FILE,
    StarRange,
    TuneResult,
    TunedLambda,
    lambda_star_range,
    read_tuned_lambda,
    write_tune_report,
)
from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.method.model import HyperMorph
from hyperreg.registration.contrast import CONTRAST_CHOICES, contrast_options
from hyperreg.registration.pipeline import DEFAULT_INIT, PairResult, load_pair
from hyperreg.registration.refine import Refinement
from hyperreg.registration.settings import resolve_settings

__all__ = [
    "DICE_NOISE_FLOOR",
    "TUNE_FILE",
    "StarRange",
    "TuneResult",
    "TunedLambda",
    "lambda_star_range",
    "read_tuned_lambda",
    "tune_lambda",
    "write_tune_report",
]

logger = logging.getLogger(__name__)


def _evaluate(
    model: HyperMorph,
    pairs: Sequence[PairSpec],
    lambdas: Sequence[float],
    stage: str,
    *,
    chunk: int | None,
    amp: bool,
    normalization: str,
    resample: bool,
    init: str = DEFAULT_INIT,
    transforms: dict[int, AffineTransform | None] | None = None,
    replace_nonfinite: float | None = None,
    refine: Refinement | None = None,
    contrast: str = "auto",
) -> tuple[list[dict[str, Any]], list[float]]:
    """Mean-over-pairs Dice/folding per λ (one batched sweep per pair), and the mean Dice
    without registration of each pair. Each pair's affine stage runs once: its transform is
    kept in ``transforms`` (position -> transform, None without a stage) for later rounds,
    which reload the pair with it (memory stays that of one pair). With ``refine`` each λ is
    refined for the pair, as ``register`` runs it, and ``contrast`` is handled as ``register``
    handles it (:func:`~hyperreg.registration.contrast.contrast_options`: for other contrasts
    the network and refinement see the moving image drawn in the fixed image's intensities).
    Dice scores the original label map sampled once through the affine and the field, as
    ``register`` writes it."""
    per_lam: list[list[PairResult]] = [[] for _ in lambdas]
    before: list[float] = []
    transforms = {} if transforms is None else transforms
    for position, spec in enumerate(pairs):
        known, asked = position in transforms, spec.contrast or contrast  # the row's first
        try:
            pair = load_pair(
                spec.moving,
                spec.fixed,
                model=model,
                moving_seg=spec.moving_seg,
                fixed_seg=spec.fixed_seg,
                init="none" if known else init,
                initial_affine=transforms.get(position) if known else spec.initial_affine,
                normalization=normalization,
                resample=resample,
                replace_nonfinite=replace_nonfinite,
                contrast=asked,  # a known transform is reused as it is (no second run)
            )
        except InputError as err:  # a pair's file, not an option: the row of 'pairs' says which
            if err.argument not in ("moving", "fixed", "moving_seg", "fixed_seg"):
                raise
            raise type(err)(  # a missing file stays a FileNotFoundError (MissingInputError)
                "tune_lambda", "{0} row {row}: {detail}", "pairs", row=spec.index, detail=err.detail
            ) from err
        if not known:
            aligned = init != "none" or spec.initial_affine is not None
            transforms[position] = pair.transform if aligned else None
        # the model's own curve over λ: every field scored as it is (no verdict, so no
        # never-worse rule; register applies both at the λ chosen)
        options = contrast_options(pair, asked, refine)  # refinement, similarity
        results = pair.register(model, list(lambdas), chunk=chunk, amp=amp, judged=False, **options)
        for slot, result in zip(per_lam, results):
            slot.append(result)
        before.append(float(pair.dice_before))  # type: ignore[arg-type]
    rows = []
    for lam, results in zip(lambdas, per_lam):
        row: dict[str, Any] = {
            "lambda": float(lam),
            "stage": stage,
            "mean_dice": float(np.mean([r.mean_dice for r in results])),
            "sem_dice": (
                float(np.std([r.mean_dice for r in results], ddof=1) / math.sqrt(len(results)))
                if len(results) > 1
                else None
            ),
            "folding_percent": float(np.mean([100 * r.folding_fraction for r in results])),
            "log_jacobian_std": float(np.mean([r.log_jacobian_std for r in results])),
        }
        labels = sorted({label for r in results for label in (r.dice or {})})
        for label in labels:
            values = [r.dice[label] for r in results if r.dice and label in r.dice]
            row[f"dice_{label}"] = float(np.nanmean(values))
        rows.append(row)
    return rows, before


def _best(rows: Sequence[dict[str, Any]], key: str = "mean_dice") -> dict[str, Any]:
    """Feasible row with the highest ``key``, else the least-folding row; ties go to the larger
    λ (the smoother field at equal score)."""
    feasible = [r for r in rows if r["feasible"] and key in r and not math.isnan(r[key])]
    if feasible:
        return max(feasible, key=lambda r: (r[key], r["lambda"]))
    return min(rows, key=lambda r: (r["folding_percent"], -r["lambda"]))


def _check_tune(
    fn: str,
    pairs: Sequence[PairSpec],
    lambdas: Sequence[float] | None,
    max_folding: float | None,
    bracket_rounds: int,
    bracket_points: int,
) -> list[float]:
    """The arguments of :func:`tune_lambda` checked before any work; the coarse grid, sorted."""
    if not pairs:
        raise ValueError(f"{fn}(): 'pairs' must hold at least one pair, got none")
    for pair in pairs:
        if pair.moving_seg is None or pair.fixed_seg is None:
            raise ValueError(
                f"{fn}(): pair {pair.index} ('{pair.moving}' -> '{pair.fixed}') must have "
                "moving_seg and fixed_seg: λ* is chosen on Dice"
            )
    grid = parse_lambdas("0:1:11") if lambdas is None else [float(v) for v in lambdas]
    grid = sorted(set(grid))
    if len(grid) < 2 or any(math.isnan(v) or not 0 <= v <= 1 for v in grid):
        raise InputError(
            fn,
            "{0} must hold at least 2 distinct values in [0, 1], got {grid}",
            "lambdas",
            grid=grid,
        )
    if max_folding is not None and (math.isnan(max_folding) or max_folding < 0):
        raise InputError(
            fn, "{0} must be a percentage >= 0, got {value}", "max_folding", value=max_folding
        )
    if bracket_rounds < 0 or bracket_points < 1:
        raise InputError(
            fn,
            "{0} must be >= 0 and {1} >= 1, got {rounds} and {points}",
            "bracket_rounds" if bracket_rounds < 0 else "bracket_points",
            "bracket_points" if bracket_rounds < 0 else "bracket_rounds",
            rounds=bracket_rounds,
            points=bracket_points,
        )
    return grid


def _per_label(rows: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Best feasible λ (and its Dice) per label over every evaluated row."""
    keys = sorted({k for r in rows for k in r if k.startswith("dice_")}, key=lambda k: int(k[5:]))
    per_label = {}
    for key in keys:
        label_best = _best(rows, key)
        per_label[int(key[5:])] = {"lambda": label_best["lambda"], "dice": label_best.get(key)}
    return per_label


def _bracket(rows: list[dict[str, Any]], points: int) -> tuple[float, float, list[float]]:
    """The bracket ``(lo, hi)`` between the evaluated neighbours of the best row so far, and the
    ``points`` evenly spaced λ strictly inside it (rounded to 10 decimals) not yet evaluated.
    Sorts ``rows`` by λ in place."""
    rows.sort(key=lambda r: r["lambda"])
    lams = [r["lambda"] for r in rows]
    best = _best(rows)
    at = lams.index(best["lambda"])
    lo, hi = lams[max(at - 1, 0)], lams[min(at + 1, len(lams) - 1)]
    new = [
        round(v, 10)
        for v in np.linspace(lo, hi, points + 2)[1:-1].tolist()
        if round(v, 10) not in lams
    ]
    return lo, hi, new


@torch.no_grad()
def tune_lambda(
    model: HyperMorph,
    pairs: Sequence[PairSpec],
    *,
    lambdas: Sequence[float] | None = None,
    max_folding: float | None = None,
    bracket_rounds: int = 2,
    bracket_points: int = 8,
    refine: Refinement | None = None,
    chunk: int | None = None,
    amp: bool = False,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = True,
    init: str = DEFAULT_INIT,
    replace_nonfinite: float | None = None,
    contrast: str = "auto",
) -> TuneResult:
    """Find λ* maximising mean validation Dice, optionally under a folding limit.

    1. Coarse grid: every pair is swept over ``lambdas`` in one batched call (default 11 values
       0, 0.1, ..., 1). A λ is *feasible* when the mean folding over pairs is at most
       ``max_folding`` percent.
    2. ``bracket_rounds`` times: take the bracket between the evaluated neighbours of the best
       feasible λ so far and evaluate ``bracket_points`` evenly spaced values strictly inside it
       (again one batched call per pair). With the defaults λ* is resolved to about 0.002.

    Each λ runs with the model's network passes and, with ``refine``, test-time refinement
    (one refinement per λ and pair: ``refine.steps`` times the cost of the network alone, or
    more), so λ* is that of what ``register`` runs with the same refinement.

    Per-label λ* is the best feasible value for each label over all evaluated λ, so it has the
    coarse grid's resolution away from the global λ* (the refinement brackets that one only).
    Each pair is reloaded per round, so memory stays that of one pair; its affine stage runs
    once (the transform is kept for later rounds).

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        pairs: Validation pairs; each needs ``moving_seg`` and ``fixed_seg``.
        lambdas: Coarse grid (values in [0, 1], at least 2); default ``0:1:11``.
        max_folding: Largest mean folding, in percent of voxels with J <= 0, or None.
        bracket_rounds: Bracketing rounds (0 = coarse grid only).
        bracket_points: New values per bracketing round.
        refine: Test-time refinement of every λ's field
            (:class:`~hyperreg.registration.refine.Refinement`), or None: the network alone.
        chunk: See :func:`sweep_lambdas`.
        amp: See :func:`sweep_lambdas`.
        normalization: Intensity normalisation.
        resample: Resample inputs on other grids onto the fixed grid (default True).
        init: ``"affine"`` (default), ``"rigid"`` or ``"none"``: the affine stage, once per
            pair (:func:`hyperreg.registration.pipeline.load_pair`) before the λ work; Dice
            "before" is that with no registration.
        replace_nonfinite: The value NaN/inf voxels of the images take (logged with their
            count; label maps must be finite); None (default): such an image is an error.
        contrast: ``"auto"`` (default), ``"same"`` or ``"different"``, for every pair without
            a ``contrast`` cell of its own (:class:`~hyperreg.apps.inputs.PairSpec`): as in
            :func:`~hyperreg.apps.register.register_files` (other contrasts: the affine stage
            run again on the moving image drawn in the fixed image's intensities, which the
            network and refinement then see).

    Returns:
        A :class:`TuneResult`. If no evaluated λ meets ``max_folding``, λ* is the value with the
        least folding, ``constraint_met`` is False and a warning is issued.

    Raises:
        FileNotFoundError: If a file is missing.
        ValueError: If ``pairs`` is empty, a pair lacks a label map, the grid has fewer than 2
            distinct values or values outside [0, 1], ``max_folding`` is negative or NaN, or
            ``bracket_rounds`` / ``bracket_points`` is negative / below 1, ``contrast`` is
            unknown; or a pair cannot be
            registered (:func:`~hyperreg.registration.pipeline.load_pair`: e.g. a constant
            image; an :class:`~hyperreg._errors.InputError` of argument ``"pairs"`` naming the
            row).
    """
    fn = "tune_lambda"
    grid = _check_tune(fn, pairs, lambdas, max_folding, bracket_rounds, bracket_points)
    check_option(fn, "contrast", contrast, CONTRAST_CHOICES)
    refine = refine if refine is not None and refine.steps > 0 else None
    resolve_settings(model, grid, refine, chunk=chunk, amp=amp, fn=fn)  # before any pair's work
    options = dict(
        refine=refine,
        chunk=chunk,
        amp=amp,
        normalization=normalization,
        resample=resample,
        init=init,
        transforms={},
        replace_nonfinite=replace_nonfinite,
        contrast=contrast,
    )

    def feasible(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for row in rows:
            row["feasible"] = max_folding is None or row["folding_percent"] <= max_folding
        return rows

    coarse, before = _evaluate(model, pairs, grid, "coarse", **options)  # type: ignore[arg-type]
    rows = feasible(coarse)
    for round_ in range(1, bracket_rounds + 1):
        lo, hi, new = _bracket(rows, bracket_points)
        if not new:
            break
        logger.info("round %d brackets λ in [%.4g, %.4g]", round_, lo, hi)
        bracketed, _ = _evaluate(model, pairs, new, f"bracket{round_}", **options)  # type: ignore[arg-type]
        rows += feasible(bracketed)
    rows.sort(key=lambda r: r["lambda"])
    best = _best(rows)
    met = bool(best["feasible"])
    if not met:
        warnings.warn(
            f"no evaluated λ keeps mean folding <= {max_folding} %; λ* = "
            f"{best['lambda']:.4g} has the least ({best['folding_percent']:.3f} %)",
            stacklevel=2,
        )
    per_label = _per_label(rows)
    span = lambda_star_range(rows, best["lambda"])
    return TuneResult(
        lambda_star=best["lambda"],
        dice_at_star=best["mean_dice"],
        folding_percent_at_star=best["folding_percent"],
        constraint_met=met,
        per_label=per_label,
        grid=rows,
        pairs=len(pairs),
        max_folding=max_folding,
        lambda_star_range=(span.lo, span.hi),
        dice_tolerance=span.tolerance,
        dice_before=float(np.mean(before)),
        refine_steps=0 if refine is None else int(refine.steps),
        passes=int(model.config.passes),
    )
