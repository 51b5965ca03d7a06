"""What λ* tuning reports: its result, the λ range within noise of λ*, and its files.

:class:`TuneResult` holds what :func:`hyperreg.apps.tune.tune_lambda` found, with λ* rounded to
what the data support; :func:`lambda_star_range` gives the λ whose mean Dice is within noise of
the best. :func:`write_tune_report` writes ``tune.json`` and ``tune.png``;
:func:`read_tuned_lambda` reads λ* back from ``tune.json`` (``register --lambda tune.json``).
Nothing here registers images; :mod:`hyperreg.apps.tune` re-exports every public name.
Must not import :mod:`hyperreg.apps.tune` (which imports this module), train or cli.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from hyperreg._errors import InputError, MissingInputError
from hyperreg._files import write_json
from hyperreg.figures.curves import sweep_curves
from hyperreg.registration.pairs import PathLike

__all__ = [
    "DICE_NOISE_FLOOR",
    "TUNE_FILE",
    "StarRange",
    "TuneResult",
    "TunedLambda",
    "lambda_star_range",
    "read_tuned_lambda",
    "write_tune_report",
]


@dataclass
class TuneResult:
    """Output of :func:`~hyperreg.apps.tune.tune_lambda`.

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


def write_tune_report(result: TuneResult, out: PathLike) -> list[Path]:
    """Write ``tune.json`` (:meth:`TuneResult.to_dict`) and ``tune.png`` into ``out``, atomically.

    The figure (:func:`hyperreg.figures.curves.sweep_curves`) shows, against every evaluated
    λ, the mean Dice on an axis fitted to it with the Dice without registration (dashed), and
    below it std log J and folding (with the folding limit): λ* (dotted) and the range within
    noise of the best Dice (shaded) on both; the title gives λ* rounded to what that range
    supports.
    """
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_json(out_dir / TUNE_FILE, result.to_dict(), indent=2)]
    rows = result.grid
    span = result.lambda_star_range
    tolerance = "" if result.dice_tolerance is None else f" (±{result.dice_tolerance:.3g})"
    before = "" if result.dice_before is None else f", {result.dice_before:.3f} unregistered"
    png = sweep_curves(
        out_dir / "tune.png",
        [r["lambda"] for r in rows],
        [r["folding_percent"] for r in rows],
        [r.get("log_jacobian_std", math.nan) for r in rows],
        dice=[r["mean_dice"] for r in rows],
        dice_before=result.dice_before,
        title=f"validation, {result.pairs} pair(s): λ* = {result.lambda_star_text}\n"
        f"mean Dice {result.dice_at_star:.3f} at λ*{before}",
        star=result.lambda_star,
        star_label=f"λ* = {result.lambda_star_rounded}",
        star_range=span if span is not None and span[1] > span[0] else None,
        star_range_label=f"Dice within noise of best{tolerance}",
        max_folding=result.max_folding,
    )
    paths.append(png)
    return paths
