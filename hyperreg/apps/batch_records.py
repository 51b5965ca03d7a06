"""The records of a batch run on disk: one per pair, merged into ``summary.csv`` and
``failures.csv``.

A pair is done when ``pairs/<name>/record.json`` exists, matches the pair's identity (its files,
λ, refinement and affine stage: :func:`pair_identity`) and every output it lists is on disk
(:func:`finished`). :func:`merge_records` turns the records into the two CSV files; it is
idempotent. Written by :mod:`hyperreg.apps.batch_pair` (one pair) and :mod:`hyperreg.apps.batch`
(the merge); no torch here.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperreg._files import write_csv

if TYPE_CHECKING:  # annotations only
    from hyperreg.apps.inputs import PairSpec
    from hyperreg.registration.pairs import PathLike

__all__ = [
    "FAILURE",
    "FAILURE_COLUMNS",
    "RECORD",
    "SUMMARY_COLUMNS",
    "changed_settings",
    "finished",
    "merge_records",
    "pair_identity",
    "read_record",
    "scores",
]

logger = logging.getLogger(__name__)

RECORD = "record.json"
FAILURE = "failure.json"
OUTPUTS = ("moved", "warp", "moved_seg")

SUMMARY_COLUMNS = (
    "index",
    "name",
    "moving",
    "fixed",
    "moving_seg",
    "fixed_seg",
    "fixed_mask",
    "moving_mask",
    "contrast",
    "lambda",
    "lambda_chosen",
    "lambda_reason",
    "mean_dice",
    "dice_affine",
    "dice_before",
    "folding_percent",
    "log_jacobian_std",
    "seconds",
    "refine_seconds",
    "refine_similarity_before",
    "refine_similarity_after",
    "verdict",
    "kept",
    "contrast_used",
    "similarity_before",
    "similarity_affine",
    "similarity_after",
    "affine_shape",
    "rank",
    "moved",
    "warp",
    "moved_seg",
    "resampled",
    "warnings",
)
FAILURE_COLUMNS = ("index", "name", "moving", "fixed", "moving_seg", "fixed_seg", "lambda", "error")


def pair_identity(
    pair: PairSpec,
    lam: float | str,
    refine: Any,
    init: str,
    passes: int = 1,
    flip_average: bool = False,
) -> dict[str, Any]:
    """What a finished record of ``pair`` must match: its files (its cost masks when it has
    them: which masks were used), λ (a number or ``"auto"``),
    the refinement's steps, similarity and learning rate (when it refines), the affine
    stage (when there is one), the network passes (when more than 1) and flip averaging (when
    on)."""
    identity: dict[str, Any] = {
        "index": pair.index,
        "moving": str(pair.moving),
        "fixed": str(pair.fixed),
        "moving_seg": str(pair.moving_seg or ""),
        "fixed_seg": str(pair.fixed_seg or ""),
        "lambda": lam,
    }
    for column in ("fixed_mask", "moving_mask"):  # absent from records made without masks
        if getattr(pair, column) is not None:
            identity[column] = str(getattr(pair, column))
    if refine is not None and refine.steps > 0:
        identity["refine"] = f"{refine.steps} {refine.sim} {refine.lr:g}"
    if init != "none":
        identity["init"] = init
    if passes != 1:
        identity["passes"] = passes
    if flip_average:
        identity["flip_average"] = True
    return identity


def read_record(folder: Path) -> dict[str, Any] | None:
    """The pair's ``record.json`` in ``folder``, or None when there is none (or it is
    unreadable, e.g. being replaced)."""
    try:
        return json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None


def finished(folder: Path, record: dict[str, Any] | None, identity: dict[str, Any]) -> bool:
    """``record`` (:func:`read_record` of ``folder``) is for this exact identity
    (:func:`pair_identity`) and every output it lists is on disk."""
    if record is None or changed_settings(record, identity):
        return False
    return all((folder / record[k]).is_file() for k in OUTPUTS if record.get(k))


def changed_settings(record: dict[str, Any] | None, identity: dict[str, Any]) -> list[str]:
    """The settings of an earlier ``record`` that differ from ``identity``, as
    ``"<key> <old> -> <new>"`` (``refine`` and ``init`` read ``none`` when absent, ``passes``
    1, ``flip_average``, ``bias_correct`` and ``keep_worse`` False, the masks ``""``,
    ``contrast`` ``auto``; the
    row's ``index`` is not a setting: a pair keeps its folder, named after it, when rows are
    added or reordered); empty when there is no record or nothing changed."""
    if record is None:
        return []
    absent = {
        "refine": "none",
        "init": "none",
        "passes": 1,
        "flip_average": False,
        "bias_correct": False,
        "keep_worse": False,
        "fixed_mask": "",
        "moving_mask": "",
        "contrast": "auto",
    }
    keys = [k for k in (*identity, *(k for k in absent if k not in identity)) if k != "index"]
    changed = []
    for key in keys:
        old, new = record.get(key, absent.get(key)), identity.get(key, absent.get(key))
        if old != new:
            changed.append(f"{key} {old} -> {new}")
    return changed


def scores(result: Any) -> dict[str, Any]:
    """The summary cells of one :class:`~hyperreg.registration.pipeline.PairResult`: mean Dice
    (registered, affine alone, unregistered; empty without label maps), folding (% of voxels
    with J ≤ 0), std log J, the refinement's seconds and similarity before/after, and the
    verdict (:class:`~hyperreg.registration.verdict.Verdict`: ``ok`` or ``check: <reason>``,
    what was kept, the model's similarity as the pair came, after the affine and registered,
    the affine's scales and shears)."""
    refined = result.refinement
    labelled = result.dice is not None
    verdict = result.verdict
    judged = {}
    if verdict is not None:
        judged = {
            "verdict": verdict.text,
            "kept": verdict.kept,
            "similarity_before": verdict.similarity_before,
            "similarity_affine": (
                None if math.isnan(verdict.similarity_affine) else verdict.similarity_affine
            ),
            "similarity_after": verdict.similarity_after,
            "affine_shape": verdict.affine.text() if verdict.affine is not None else "",
        }
    return {
        **judged,
        "mean_dice": result.mean_dice if labelled else None,
        "dice_affine": result.dice_affine if labelled else None,
        "dice_before": result.dice_before if labelled else None,
        "folding_percent": 100.0 * result.folding_fraction,
        "log_jacobian_std": result.log_jacobian_std,
        "refine_seconds": refined.seconds if refined else None,
        "refine_similarity_before": refined.similarity_before if refined else None,
        "refine_similarity_after": refined.similarity_after if refined else None,
    }


def merge_records(
    out: PathLike, pairs: Sequence[PairSpec] | None = None
) -> tuple[Path, Path, int, int]:
    """Merge the ``pairs/<name>/record.json`` files into ``summary.csv`` and each
    ``failure.json`` of a pair without a record into ``failures.csv`` (both sorted by index,
    written atomically).

    ``summary.csv`` columns: :data:`SUMMARY_COLUMNS`, then ``dice_<label>`` for every label of
    any pair (empty where a pair lacks it). Output paths are relative to ``out``. Merging is
    idempotent: run it again at any time (a batch does after every pair).

    Args:
        out: The batch's output folder.
        pairs: The job's pairs (every rank's): only their folders are merged, each record's
            ``index`` their row's. None: every folder under ``pairs/``.

    Returns:
        ``(summary_path, failures_path, rows, failures)``.

    Raises:
        OSError: If ``summary.csv`` or ``failures.csv`` cannot be written (the message names it).
    """
    root = Path(out)
    records, failures = [], []
    if pairs is None:
        rows = {p.name: None for p in sorted((root / "pairs").glob("*")) if p.is_dir()}
    else:
        rows = {pair.name: pair.index for pair in pairs}
    for name, index in rows.items():
        folder = root / "pairs" / name
        record_path, failure_path = folder / RECORD, folder / FAILURE
        try:
            if record_path.is_file():
                record = json.loads(record_path.read_text())
                record["name"] = folder.name
                record["index"] = record["index"] if index is None else index
                for key in OUTPUTS:
                    if record.get(key):
                        record[key] = f"pairs/{folder.name}/{record[key]}"
                for label, dice in record.pop("dice", {}).items():
                    record[f"dice_{label}"] = dice
                records.append(record)
            elif failure_path.is_file():
                failure = json.loads(failure_path.read_text())
                failure["name"] = folder.name
                failure["index"] = failure["index"] if index is None else index
                failures.append(failure)
        except (OSError, ValueError) as err:  # a record being replaced right now
            logger.warning("cannot read the results in %s: %s", folder, err)
    records.sort(key=lambda r: r["index"])
    failures.sort(key=lambda r: r["index"])
    labels = {k for r in records for k in r if k.startswith("dice_") and k[5:].isdigit()}
    labels = sorted(labels, key=lambda k: int(k[5:]))
    summary = write_csv(root / "summary.csv", records, [*SUMMARY_COLUMNS, *labels])
    failed = write_csv(root / "failures.csv", failures, FAILURE_COLUMNS)
    return summary, failed, len(records), len(failures)
