"""Learn2Reg-style evaluation of finished registrations: label overlap, surface distance, folding.

:func:`read_evaluation_csv` reads a CSV with columns ``moved_seg`` and ``fixed_seg`` (label maps
of integer ids on one grid) and optionally ``warp`` (the displacement field, either format of
:func:`hyperreg.geometry.fields.load_displacement`), ``moving_seg`` and ``name``.
:func:`evaluate_pair` scores one row: Dice and HD95 per structure
(:func:`hyperreg.method.metrics.registration_dice`, the one convention of every command;
:func:`~hyperreg.method.metrics.hd95_per_label`, MONAI, in mm from the fixed map's voxel size).
With a field it adds the folding percentage (central-difference ``J ≤ 0``), the standard
deviation of ``log J``, and the non-diffeomorphic volume as the Learn2Reg LUMIR challenge
reports it (NDV, %: :func:`hyperreg.method.diffeomorphism.non_diffeomorphic_volume`).
:func:`evaluate_csv` runs every row. A row that fails (missing file, unreadable file, maps on
different grids) is recorded and the rest are evaluated. It writes ``evaluation.csv``,
``structures.csv``, ``evaluation_boxplot.png`` and, when a row failed, ``failures.csv``. Must
not import train or cli.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyperreg._errors import InputError, failure_text, passed_as
from hyperreg._files import read_csv, write_csv
from hyperreg.figures.structures import structure_boxplots
from hyperreg.geometry.fields import load_displacement
from hyperreg.geometry.io import load_volume
from hyperreg.geometry.structures import freesurfer_misfit, read_label_names, structure_names
from hyperreg.method.diffeomorphism import non_diffeomorphic_volume
from hyperreg.method.metrics import (
    field_summary,
    hd95_per_label,
    input_labels,
    registration_dice,
)
from hyperreg.registration.pairs import PathLike

__all__ = [
    "EvaluationReport",
    "EvaluationRow",
    "PairScores",
    "evaluate_csv",
    "evaluate_pair",
    "read_evaluation_csv",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationRow:
    """One row of an evaluation CSV (paths resolved against the CSV's folder)."""

    index: int
    name: str
    moved_seg: Path
    fixed_seg: Path
    warp: Path | None = None
    moving_seg: Path | None = None


@dataclass
class PairScores:
    """Scores of one pair.

    Attributes:
        index: Row number (0-based, header excluded).
        name: The row's ``name`` cell, or ``row<index>``.
        dice: ``{label: Dice}`` over the labels of the inputs
            (:func:`~hyperreg.method.metrics.registration_dice`).
        hd95: ``{label: HD95}`` in mm (NaN where undefined).
        folding_percent: % of voxels with central-difference ``J ≤ 0`` (None without a field).
        log_jacobian_std: Standard deviation of ``log J`` (None without a field).
        ndv_percent: Non-diffeomorphic volume, % of the grid (None without a field).
    """

    index: int
    name: str
    dice: dict[int, float]
    hd95: dict[int, float]
    folding_percent: float | None = None
    log_jacobian_std: float | None = None
    ndv_percent: float | None = None

    @property
    def mean_dice(self) -> float:
        return _nanmean(self.dice.values())

    @property
    def mean_hd95(self) -> float:
        return _nanmean(self.hd95.values())


def _nanmean(values: Any) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else float("nan")


@dataclass
class EvaluationReport:
    """Output of :func:`evaluate_csv`.

    Attributes:
        pairs: Scores of every row that could be evaluated.
        failures: ``(index, name, error)`` of every row that could not.
        names: ``{label: structure name}`` used in the tables and the plot.
        files: Files written.
    """

    pairs: list[PairScores]
    failures: list[tuple[int, str, str]]
    names: dict[int, str]
    files: list[Path] = field(default_factory=list)


def read_evaluation_csv(path: PathLike) -> list[EvaluationRow]:
    """Read an evaluation CSV: ``moved_seg``, ``fixed_seg``, optional ``warp``, ``moving_seg``
    (the label map before registration: its labels are scored too) and ``name``.

    Files are not opened here (a missing file fails its row in :func:`evaluate_csv`).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the header lacks ``moved_seg`` or ``fixed_seg``, a row leaves one of them
            empty, or there are no rows.
    """
    fn = "read_evaluation_csv"
    path = Path(path)
    header, rows = read_csv(fn, path)
    if "moved_seg" not in header or "fixed_seg" not in header:
        raise InputError(
            fn,
            "'{path}' must have columns ('moved_seg', 'fixed_seg') (optional 'warp', 'name'), "
            "got {header}",
            "path",
            path=path,
            header=tuple(header),
        )
    if not rows:
        raise InputError(fn, "'{path}' has a header but no rows", "path", path=path)
    out = []
    for index, row in enumerate(rows):
        if not row.get("moved_seg") or not row.get("fixed_seg"):
            raise InputError(
                fn,
                "'{path}' row {index} (line {line}) must name both 'moved_seg' and 'fixed_seg'",
                "path",
                path=path,
                index=index,
                line=index + 2,
            )
        warp, moving_seg = row.get("warp", ""), row.get("moving_seg", "")
        out.append(
            EvaluationRow(
                index=index,
                name=row.get("name") or f"row{index}",
                moved_seg=path.parent / row["moved_seg"],
                fixed_seg=path.parent / row["fixed_seg"],
                warp=path.parent / warp if warp else None,
                moving_seg=path.parent / moving_seg if moving_seg else None,
            )
        )
    return out


def evaluate_pair(
    moved_seg: PathLike,
    fixed_seg: PathLike,
    warp: PathLike | None = None,
    *,
    index: int = 0,
    name: str = "",
    labels: Sequence[int] | None = None,
    moving_seg: PathLike | None = None,
) -> PairScores:
    """Score one registered pair from its files.

    Args:
        moved_seg: Moved label map (integer ids), on the fixed grid.
        fixed_seg: Fixed label map; its voxel size sets the HD95 unit (mm).
        warp: Displacement field on the fixed grid (voxel or ITK format), or None.
        index: Row number, stored in the result.
        name: Pair name, stored in the result.
        labels: Label ids to score; default hyperreg's convention
            (:func:`~hyperreg.method.metrics.registration_dice`): the non-zero ids of the input
            label maps, ``moving_seg`` (or, without it, ``moved_seg``) and ``fixed_seg``; a
            label missing from ``moved_seg`` or ``fixed_seg`` scores Dice 0 (HD95 NaN).
        moving_seg: The moving label map before registration (any grid), or None.

    Returns:
        :class:`PairScores`.

    Raises:
        FileNotFoundError: If a file is missing.
        ValueError: If a file is unreadable, the two maps have different shapes, or the field's
            grid differs from the maps'.
    """
    fn = "evaluate_pair"
    moved = load_volume(moved_seg, label=True)
    fixed = load_volume(fixed_seg, label=True)
    if moved.spatial_shape != fixed.spatial_shape:
        raise ValueError(
            f"{fn}(): 'moved_seg' '{moved_seg}' and 'fixed_seg' '{fixed_seg}' must share a grid, "
            f"got shapes {moved.spatial_shape} and {fixed.spatial_shape}"
        )
    if labels is None:
        before = load_volume(moving_seg, label=True).data if moving_seg is not None else moved.data
        labels = input_labels(before, fixed.data)
    labels = list(labels)
    scores = PairScores(
        index=index,
        name=name or f"row{index}",
        dice=registration_dice(moved.data, fixed.data, labels=labels),
        hd95=hd95_per_label(moved.data, fixed.data, labels, spacing=fixed.spacing),
    )
    if warp is not None:
        disp = load_displacement(warp).disp
        if tuple(disp.shape[1:]) != fixed.spatial_shape:
            raise ValueError(
                f"{fn}(): 'warp' '{warp}' must lie on the label maps' grid "
                f"{fixed.spatial_shape}, got {tuple(disp.shape[1:])}"
            )
        tensor = torch.from_numpy(np.ascontiguousarray(disp))[None]
        summary = field_summary(tensor)
        scores.folding_percent = 100.0 * summary["folding_fraction"]
        scores.log_jacobian_std = summary["log_jacobian_std"]
        scores.ndv_percent = 100.0 * non_diffeomorphic_volume(tensor)
    return scores


def evaluate_csv(
    pairs_csv: PathLike,
    out: PathLike,
    *,
    naming: str = "auto",
    label_names: PathLike | None = None,
) -> EvaluationReport:
    """Evaluate every row of an evaluation CSV and write tables and a box plot to ``out``.

    Outputs (each written atomically):

    * ``evaluation.csv``: one row per evaluated pair: ``index, name, mean_dice, mean_hd95,
      folding_percent, log_jacobian_std, ndv_percent``, then ``dice_<label>`` and
      ``hd95_<label>`` per structure (empty where a pair lacks it);
    * ``structures.csv``: one row per structure: ``label, structure, pairs, dice_mean,
      dice_std, hd95_mean, hd95_std`` (over pairs, NaN ignored);
    * ``failures.csv``, only when a row could not be evaluated: ``index, name, error`` of each
      (one from an earlier run into ``out`` is removed when none failed);
    * ``evaluation_boxplot.png``: Dice (left) and HD95 (right) per structure over the pairs,
      one named line each, sorted by median Dice; over 40 structures, the 20 lowest and the 20
      highest (:func:`hyperreg.figures.structures.structure_boxplots`).

    Args:
        pairs_csv: CSV (:func:`read_evaluation_csv`).
        out: Output folder (created).
        naming: Structure names: ``"auto"``, ``"freesurfer"`` or ``"none"``
            (:func:`hyperreg.geometry.structures.structure_names`).
        label_names: A file of structure names, a FreeSurfer LUT or an ``id,name`` CSV
            (:func:`hyperreg.geometry.structures.read_label_names`), read before any work; it
            replaces ``naming``. A label it lacks keeps its id (a warning lists them).
            With ``naming="freesurfer"``, ids that do not look like FreeSurfer's
            (:func:`hyperreg.geometry.structures.freesurfer_misfit`) are named anyway, with a
            warning.

    Returns:
        An :class:`EvaluationReport`. Rows that failed are in ``failures``, never raised.

    Raises:
        FileNotFoundError: If the CSV or ``label_names`` is missing.
        ValueError: If the CSV is malformed, ``naming`` is unknown or ``label_names`` is not a
            names file (an ``InputError`` of argument ``"label_names"`` naming its line).
    """
    structure_names([], naming)  # checks 'naming' before any work
    table = None
    if label_names is not None:
        with passed_as(path="label_names"):
            table = read_label_names(label_names)
    rows = read_evaluation_csv(pairs_csv)
    pairs: list[PairScores] = []
    failures: list[tuple[int, str, str]] = []
    for row in rows:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # e.g. an empty label in HD95
                pairs.append(
                    evaluate_pair(
                        row.moved_seg,
                        row.fixed_seg,
                        row.warp,
                        index=row.index,
                        name=row.name,
                        moving_seg=row.moving_seg,
                    )
                )
        except (OSError, ValueError, TypeError, RuntimeError) as err:
            logger.debug("evaluate_csv(): row %d (%s) failed: %s", row.index, row.name, err)
            failures.append((row.index, row.name, failure_text(err)))
    labels = sorted({label for p in pairs for label in p.dice})
    misfit = freesurfer_misfit(labels) if naming == "freesurfer" and table is None else None
    if misfit:
        logger.warning(
            "label names 'freesurfer': %s; check structures.csv, or give a names file", misfit
        )
    names = structure_names(labels, naming) if table is None else _named(labels, table, label_names)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    files = [
        _write_pairs(folder / "evaluation.csv", pairs, labels),
        _write_structures(folder / "structures.csv", pairs, labels, names),
    ]
    failed = folder / "failures.csv"
    if failures:
        rows = [{"index": i, "name": n, "error": e} for i, n, e in failures]
        files.append(write_csv(failed, rows, ["index", "name", "error"]))
    else:  # none failed: no file, and none left from an earlier run into this folder
        failed.unlink(missing_ok=True)
    if pairs and labels:
        files.append(_boxplot(folder / "evaluation_boxplot.png", pairs, labels, names))
    return EvaluationReport(pairs=pairs, failures=failures, names=names, files=files)


def _named(labels: Sequence[int], table: dict[int, str], source: PathLike) -> dict[int, str]:
    """``{label: name}`` from a names file; a label it lacks keeps its id, with a warning."""
    missing = [label for label in labels if label not in table]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        logger.warning(
            "'%s' has no name for %d of %d labels (%s%s): they keep their ids",
            source,
            len(missing),
            len(labels),
            ", ".join(str(label) for label in missing[:5]),
            more,
        )
    return {label: table.get(label, str(label)) for label in labels}


def _write_pairs(path: Path, pairs: Sequence[PairScores], labels: Sequence[int]) -> Path:
    columns = ["index", "name", "mean_dice", "mean_hd95", "folding_percent"]
    columns += ["log_jacobian_std", "ndv_percent"]
    columns += [f"dice_{label}" for label in labels] + [f"hd95_{label}" for label in labels]
    rows = []
    for p in pairs:
        row: dict[str, Any] = {
            "index": p.index,
            "name": p.name,
            "mean_dice": p.mean_dice,
            "mean_hd95": p.mean_hd95,
            "folding_percent": "" if p.folding_percent is None else p.folding_percent,
            "log_jacobian_std": "" if p.log_jacobian_std is None else p.log_jacobian_std,
            "ndv_percent": "" if p.ndv_percent is None else p.ndv_percent,
        }
        row.update({f"dice_{k}": v for k, v in p.dice.items()})
        row.update({f"hd95_{k}": v for k, v in p.hd95.items()})
        rows.append(row)
    return write_csv(path, rows, columns)


def _per_structure(pairs: Sequence[PairScores], label: int, what: str) -> list[float]:
    values = [getattr(p, what).get(label, float("nan")) for p in pairs]
    return [v for v in values if not math.isnan(v)]


def _write_structures(
    path: Path, pairs: Sequence[PairScores], labels: Sequence[int], names: dict[int, str]
) -> Path:
    rows = []
    for label in labels:
        dice = _per_structure(pairs, label, "dice")
        hd95 = _per_structure(pairs, label, "hd95")
        rows.append(
            {
                "label": label,
                "structure": names[label],
                "pairs": len(dice),
                "dice_mean": float(np.mean(dice)) if dice else float("nan"),
                "dice_std": float(np.std(dice)) if dice else float("nan"),
                "hd95_mean": float(np.mean(hd95)) if hd95 else float("nan"),
                "hd95_std": float(np.std(hd95)) if hd95 else float("nan"),
            }
        )
    columns = ["label", "structure", "pairs", "dice_mean", "dice_std", "hd95_mean", "hd95_std"]
    return write_csv(path, rows, columns)


def _boxplot(
    path: Path, pairs: Sequence[PairScores], labels: Sequence[int], names: dict[int, str]
) -> Path:
    """evaluation_boxplot.png: Dice and HD95 per structure, one horizontal line each
    (:func:`hyperreg.figures.structures.structure_boxplots`: at most the 20 lowest and 20
    highest median Dice when there are more than 40 structures)."""
    return structure_boxplots(
        path,
        [names[label] for label in labels],
        [_per_structure(pairs, label, "dice") for label in labels],
        [_per_structure(pairs, label, "hd95") for label in labels],
        title=f"per-structure Dice and HD95 over {len(pairs)} pair(s)",
    )
