"""λ* tuning: the λ that maximises mean validation Dice, optionally under a folding limit.

:func:`tune_lambda` evaluates a coarse λ grid on every validation pair with one sweep per pair
(:meth:`~hyperreg.registration.pipeline.PreparedPair.register`), then refines inside the
bracket around the best value (λ bracketing), and reports the best λ per label too. Each λ is
registered as ``register`` runs it: the model's network passes, and the test-time refinement
given (``refine``; the command line gives the model's default, as ``register`` does).
:func:`write_tune_report` writes ``tune.json`` and ``tune.png``; :func:`read_tuned_lambda` reads
λ* back from ``tune.json`` (``register --lambda tune.json``). Must not import train or cli.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from hyperreg._errors import InputError, MissingInputError
from hyperreg._files import write_json
from hyperreg.apps.inputs import PairSpec, parse_lambdas
from hyperreg.figures.backend import pyplot, save_figure
from hyperreg.figures.curves import plot_lambda_curves
from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.method.model import HyperMorph
from hyperreg.registration.pairs import PathLike
from hyperreg.registration.pipeline import DEFAULT_INIT, PairResult, load_pair
from hyperreg.registration.refine import Refinement

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


@dataclass
class TuneResult:
    """Output of :func:`tune_lambda`.

    Attributes:
        lambda_star: λ with the highest mean validation Dice among the evaluated values that meet
            the folding limit (or, if none does, the one with the least folding); ties go to
            the larger λ.
        dice_at_star: Mean Dice over pairs at ``lambda_star`` (each pair: mean over its labels).
        folding_percent_at_star: Mean over pairs of the % of voxels with J <= 0 at λ*.
        constraint_met: False if no evaluated λ met ``max_folding``.
        per_label: ``{label: {"lambda": λ, "dice": Dice}}``: best evaluated λ per label (mean
            over the pairs holding it), among values meeting the folding limit.
        grid: One dict per evaluated λ, sorted by λ: ``lambda``, ``stage`` (``"coarse"`` or
            ``"bracket<n>"``), ``mean_dice``, ``folding_percent``, ``log_jacobian_std``,
            ``feasible``, ``dice_<label>``.
        pairs: Number of pairs.
        max_folding: The folding limit in percent, or None.
        lambda_star_range: ``(lo, hi)``: the smallest and largest evaluated feasible λ whose
            mean Dice is within ``dice_tolerance`` of the best (see :func:`lambda_star_range`);
            ``(λ*, λ*)`` when the folding limit is not met. λ in this range are
            indistinguishable from λ* on these pairs.
        dice_tolerance: The Dice difference treated as noise for that range.
        dice_before: Mean over pairs of the mean Dice without registration, or None.
        refine_steps: Test-time refinement steps each λ was registered with (0: the network
            alone).
        passes: Network passes each λ was registered with.
    """

    lambda_star: float
    dice_at_star: float
    folding_percent_at_star: float
    constraint_met: bool
    per_label: dict[int, dict[str, float]]
    grid: list[dict[str, Any]]
    pairs: int
    max_folding: float | None
    lambda_star_range: tuple[float, float] | None = None
    dice_tolerance: float | None = None
    dice_before: float | None = None
    refine_steps: int = 0
    passes: int = 1

    @property
    def lambda_star_rounded(self) -> str:
        """λ* with as many decimals as the range within noise supports (see
        :attr:`lambda_star_text`); all significant digits when no range is known."""
        if self.lambda_star_range is None:
            return f"{self.lambda_star:.4g}"
        lo, hi = self.lambda_star_range
        return _round(self.lambda_star, _decimals(hi - lo, self.grid, self.lambda_star))

    @property
    def lambda_star_text(self) -> str:
        """λ* rounded, with the range within noise, e.g. ``"0.33 (0.2 to 0.4 within noise)"``.

        The decimals are one more than the first significant digit of the range's width (or,
        when no other λ is within noise, of the spacing to the nearest evaluated λ), 1 to 4,
        without trailing zeros.
        """
        if self.lambda_star_range is None:
            return self.lambda_star_rounded
        lo, hi = self.lambda_star_range
        if hi <= lo:
            return f"{self.lambda_star_rounded} (no other λ within noise)"
        digits = _decimals(hi - lo, self.grid, self.lambda_star)
        span = f"{_round(lo, digits)} to {_round(hi, digits)}"
        return f"{self.lambda_star_rounded} ({span} within noise)"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (label ids as strings)."""
        return {
            "lambda_star": self.lambda_star,
            "dice_at_star": self.dice_at_star,
            "folding_percent_at_star": self.folding_percent_at_star,
            "constraint_met": self.constraint_met,
            "lambda_star_range": list(self.lambda_star_range or ()) or None,
            "dice_noise_tolerance": self.dice_tolerance,
            "dice_before": self.dice_before,
            "max_folding_percent": self.max_folding,
            "pairs": self.pairs,
            "refine_steps": self.refine_steps,
            "passes": self.passes,
            "per_label_lambda_star": {str(k): v for k, v in self.per_label.items()},
            "grid": self.grid,
        }


TUNE_FILE = "tune.json"
"""What :func:`write_tune_report` writes and :func:`read_tuned_lambda` reads."""


@dataclass(frozen=True)
class TunedLambda:
    """λ* read back from a ``tune.json`` (:func:`read_tuned_lambda`).

    Attributes:
        lam: λ* in [0, 1].
        source: One line saying where it comes from, e.g. ``"from tune.json: λ* over 8
            validation pairs, refined 30 steps, 2 network passes"``.
        refine_steps: Refinement steps λ* was measured with (0: the network alone; None: a
            file written before tune recorded it).
        passes: Network passes λ* was measured with, or None (not recorded).
    """

    lam: float
    source: str
    refine_steps: int | None = None
    passes: int | None = None


def read_tuned_lambda(path: PathLike, argument: str = "lam") -> TunedLambda:
    """λ* of a ``tune.json`` that :func:`write_tune_report` wrote (``hyperreg tune``).

    Args:
        path: The file (a folder: its ``tune.json``).
        argument: The caller's name for ``path``, stored in errors.

    Returns:
        A :class:`TunedLambda` with the pairs, refinement and passes λ* was measured with.

    Raises:
        MissingInputError: If ``path`` does not exist.
        InputError: If it is not JSON, or holds no ``lambda_star`` in [0, 1].
    """
    fn = "read_tuned_lambda"
    file = Path(path)
    if file.is_dir():
        file = file / TUNE_FILE
    if not file.is_file():
        raise MissingInputError(fn, "no such file: '{path}'", argument, path=file)
    try:
        record = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(
            fn, "'{path}' is not a tune.json ({reason})", argument, path=file, reason=err
        ) from err
    lam = record.get("lambda_star") if isinstance(record, dict) else None
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= lam <= 1.0:
        raise InputError(
            fn,
            "'{path}' holds no lambda_star in [0, 1] (got {lam!r}); give the tune.json that "
            "'hyperreg tune' wrote",
            argument,
            path=file,
            lam=lam,
        )
    pairs = record.get("pairs")
    refine = record.get("refine_steps")
    passes = record.get("passes")
    parts = [f"λ* over {pairs} validation pair{'s' if pairs != 1 else ''}"]
    if isinstance(refine, int):
        parts.append(f"refined {refine} steps" if refine else "the network alone")
    if isinstance(passes, int):
        parts.append(f"{passes} network pass{'es' if passes != 1 else ''}")
    return TunedLambda(
        float(lam),
        f"from {file.name}: " + ", ".join(parts),
        refine if isinstance(refine, int) else None,
        passes if isinstance(passes, int) else None,
    )


DICE_NOISE_FLOOR = 0.002
"""Smallest Dice difference treated as noise by :func:`lambda_star_range` (also the tolerance
with one validation pair, where no standard error exists)."""


class StarRange(NamedTuple):
    """Output of :func:`lambda_star_range`: ``lo`` and ``hi`` bound the λ range, ``tolerance``
    is the Dice difference treated as noise."""

    lo: float
    hi: float
    tolerance: float


def lambda_star_range(rows: Sequence[dict[str, Any]], star: float) -> StarRange:
    """The λ whose mean Dice is within noise of the best, from evaluated rows.

    Noise is the standard error over pairs of the mean Dice at λ* (``sem_dice`` of its row:
    sample standard deviation / sqrt(pairs)), but at least :data:`DICE_NOISE_FLOOR` (0.002); with
    one pair, or no ``sem_dice``, it is 0.002. The range spans every **feasible** row whose
    ``mean_dice`` is at least the best minus that tolerance (from the smallest such λ to the
    largest, so a dip inside does not split it). If the λ* row is not feasible (no λ met the
    folding limit), the range is ``(star, star)``.

    Args:
        rows: Rows as in :attr:`TuneResult.grid`: ``lambda``, ``mean_dice``, ``feasible`` and
            optionally ``sem_dice`` (None or NaN counts as absent).
        star: λ*, the ``lambda`` of one row.

    Returns:
        A :class:`StarRange` ``(lo, hi, tolerance)`` with ``lo <= star <= hi``.

    Raises:
        ValueError: If no row has ``lambda == star``.
    """
    best = next((r for r in rows if r["lambda"] == star), None)
    if best is None:
        raise ValueError(
            f"lambda_star_range(): 'star' must be the λ of one row, got {star} not in "
            f"{sorted(r['lambda'] for r in rows)[:8]}"
        )
    sem = best.get("sem_dice")
    sem = 0.0 if sem is None or math.isnan(sem) else float(sem)
    tolerance = max(sem, DICE_NOISE_FLOOR)
    if not best["feasible"]:
        return StarRange(star, star, tolerance)
    close = [
        r["lambda"]
        for r in rows
        if r["feasible"]
        and not math.isnan(r["mean_dice"])
        and r["mean_dice"] >= best["mean_dice"] - tolerance
    ]
    return StarRange(min(close + [star]), max(close + [star]), tolerance)


def _decimals(width: float, rows: Sequence[dict[str, Any]], star: float) -> int:
    """Decimals for λ*: one more than the first significant digit of ``width`` (the range
    within noise, else the spacing from λ* to the nearest evaluated λ), between 1 and 4."""
    if width <= 0:
        gaps = [abs(r["lambda"] - star) for r in rows if r["lambda"] != star]
        width = min(gaps) if gaps else 1.0
    return int(min(4, max(1, math.ceil(-math.log10(width)) + 1)))


def _round(value: float, decimals: int) -> str:
    """``value`` to ``decimals`` places, trailing zeros dropped (0.30 -> "0.3", 1.0 -> "1")."""
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


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
) -> tuple[list[dict[str, Any]], list[float]]:
    """Mean-over-pairs Dice/folding per λ (one batched sweep per pair), and the mean Dice
    without registration of each pair. Each pair's affine stage runs once: its transform is
    kept in ``transforms`` (position -> transform, None without a stage) for later rounds,
    which reload the pair with it (memory stays that of one pair). With ``refine`` each λ is
    refined for the pair, as ``register`` runs it. Dice scores the original
    label map sampled once through the affine and the field, as ``register`` writes it."""
    per_lam: list[list[PairResult]] = [[] for _ in lambdas]
    before: list[float] = []
    transforms = {} if transforms is None else transforms
    for position, spec in enumerate(pairs):
        known = position in transforms
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
        results = pair.register(model, list(lambdas), refine, chunk=chunk, amp=amp, judged=False)
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

    Returns:
        A :class:`TuneResult`. If no evaluated λ meets ``max_folding``, λ* is the value with the
        least folding, ``constraint_met`` is False and a warning is issued.

    Raises:
        FileNotFoundError: If a file is missing.
        ValueError: If ``pairs`` is empty, a pair lacks a label map, the grid has fewer than 2
            distinct values or values outside [0, 1], ``max_folding`` is negative or NaN, or
            ``bracket_rounds`` / ``bracket_points`` is negative / below 1; or a pair cannot be
            registered (:func:`~hyperreg.registration.pipeline.load_pair`: e.g. a constant
            image; an :class:`~hyperreg._errors.InputError` of argument ``"pairs"`` naming the
            row).
    """
    fn = "tune_lambda"
    grid = _check_tune(fn, pairs, lambdas, max_folding, bracket_rounds, bracket_points)
    refine = refine if refine is not None and refine.steps > 0 else None
    options = dict(
        refine=refine,
        chunk=chunk,
        amp=amp,
        normalization=normalization,
        resample=resample,
        init=init,
        transforms={},
        replace_nonfinite=replace_nonfinite,
    )

    def feasible(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for row in rows:
            row["feasible"] = max_folding is None or row["folding_percent"] <= max_folding
        return rows

    coarse, before = _evaluate(model, pairs, grid, "coarse", **options)  # type: ignore[arg-type]
    rows = feasible(coarse)
    for round_ in range(1, bracket_rounds + 1):
        rows.sort(key=lambda r: r["lambda"])
        lams = [r["lambda"] for r in rows]
        best = _best(rows)
        at = lams.index(best["lambda"])
        lo, hi = lams[max(at - 1, 0)], lams[min(at + 1, len(lams) - 1)]
        new = [
            round(v, 10)
            for v in np.linspace(lo, hi, bracket_points + 2)[1:-1].tolist()
            if round(v, 10) not in lams
        ]
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


def write_tune_report(result: TuneResult, out: PathLike) -> list[Path]:
    """Write ``tune.json`` (:meth:`TuneResult.to_dict`) and ``tune.png`` into ``out``, atomically.

    The figure shows mean Dice and folding against every evaluated λ, the mean Dice without
    registration (dashed), λ* (dotted) and the range within noise of the best Dice (shaded); the
    title gives λ* rounded to what that range supports.
    """
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_json(out_dir / TUNE_FILE, result.to_dict(), indent=2)]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.8, 4.4), layout="constrained")
    rows = result.grid
    span = result.lambda_star_range
    tolerance = "" if result.dice_tolerance is None else f" (±{result.dice_tolerance:.3g})"
    plot_lambda_curves(
        ax,
        [r["lambda"] for r in rows],
        [r["mean_dice"] for r in rows],
        [r["folding_percent"] for r in rows],
        baseline=result.dice_before,
        star=result.lambda_star,
        star_label=f"λ* = {result.lambda_star_rounded}",
        star_range=span if span is not None and span[1] > span[0] else None,
        star_range_label=f"Dice within noise of best{tolerance}",
        max_folding=result.max_folding,
    )
    ax.set_title(
        f"validation, {result.pairs} pair(s): λ* = {result.lambda_star_text}\n"
        f"mean Dice {result.dice_at_star:.3f} at λ*"
        + ("" if result.dice_before is None else f", {result.dice_before:.3f} unregistered"),
        fontsize=9,
    )
    png = out_dir / "tune.png"
    save_figure(fig, png)
    paths.append(png)
    return paths
