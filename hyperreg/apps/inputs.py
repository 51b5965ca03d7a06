"""The input files of the applications, read and checked before any work.

Pair lists (:func:`read_pairs`: a CSV of ``moving``, ``fixed``, optional ``moving_seg``,
``fixed_seg`` and ``lambda``; :func:`shard` for several processes), label maps
(:func:`check_label_map`: integer ids, not an intensity image) and λ lists
(:func:`parse_lambdas`). Used by ``batch``, ``tune``, ``sweep`` and the command line. Light to
import (no torch); must not import cli.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hyperreg._errors import InputError, passed_as
from hyperreg._files import read_csv

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hyperreg.registration.pairs import PathLike

__all__ = [
    "MAX_LABELS",
    "PairSpec",
    "check_label_map",
    "parse_lambdas",
    "read_pairs",
    "shard",
]

PAIR_COLUMNS = ("moving", "fixed", "moving_seg", "fixed_seg", "lambda")


@dataclass(frozen=True)
class PairSpec:
    """One row of a pair CSV.

    Attributes:
        index: 0-based row number (header excluded); it names the pair's output folder.
        moving: Moving image path.
        fixed: Fixed image path.
        moving_seg: Moving label map path, or None.
        fixed_seg: Fixed label map path, or None.
        lam: The row's λ, or None when its ``lambda`` cell is empty or absent.
        initial_affine: The row's initial transform file (ITK ``.mat``/``.tfm``, as
            ``--initial-affine``), or None when its ``initial_affine`` cell is empty or absent.
    """

    index: int
    moving: Path
    fixed: Path
    moving_seg: Path | None = None
    fixed_seg: Path | None = None
    lam: float | None = None
    initial_affine: Path | None = None

    @property
    def name(self) -> str:
        """Output folder name, ``pair00042`` for row 42."""
        return f"pair{self.index:05d}"


def read_pairs(path: PathLike, *, require_segs: bool = False) -> list[PairSpec]:
    """Read a pair CSV.

    Args:
        path: CSV with a header holding ``moving`` and ``fixed``, optionally ``moving_seg``,
            ``fixed_seg``, ``lambda`` and ``initial_affine`` (other columns are ignored). Empty
            cells mean "none". Relative paths are relative to the CSV's folder. Files are not
            opened here.
        require_segs: Every row must name both label maps (for λ tuning on Dice).

    Returns:
        One :class:`PairSpec` per data row, in file order.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the header lacks ``moving`` or ``fixed``, a row has an empty ``moving``
            or ``fixed`` cell, a ``lambda`` cell is not a number in [0, 1], a label map is
            missing with ``require_segs``, or there are no rows.
    """
    fn = "read_pairs"
    path = Path(path)
    header, rows = read_csv(fn, path)
    missing = [c for c in ("moving", "fixed") if c not in header]
    if missing:
        raise InputError(
            fn,
            "'{path}' must have a header with columns {required} (optional {optional}), got "
            "{header}",
            "path",
            path=path,
            required=PAIR_COLUMNS[:2],
            optional=PAIR_COLUMNS[2:],
            header=tuple(header),
        )
    if not rows:
        raise InputError(fn, "'{path}' has a header but no pairs", "path", path=path)
    base = path.parent

    def resolve(text: str) -> Path | None:
        return (base / text) if text else None

    pairs = []
    for index, row in enumerate(rows):
        where = f"'{path}' row {index} (line {index + 2})"
        if not row.get("moving") or not row.get("fixed"):
            raise InputError(fn, "{where} must name both 'moving' and 'fixed'", "path", where=where)
        lam = None
        if row.get("lambda"):
            try:
                lam = float(row["lambda"])
            except ValueError:
                lam = math.nan
            if math.isnan(lam) or not 0.0 <= lam <= 1.0:
                raise InputError(
                    fn,
                    "{where}: 'lambda' must be a number in [0, 1], got {lam!r}",
                    "path",
                    where=where,
                    lam=row["lambda"],
                )
        spec = PairSpec(
            index=index,
            moving=base / row["moving"],
            fixed=base / row["fixed"],
            moving_seg=resolve(row.get("moving_seg", "")),
            fixed_seg=resolve(row.get("fixed_seg", "")),
            lam=lam,
            initial_affine=resolve(row.get("initial_affine", "")),
        )
        if require_segs and (spec.moving_seg is None or spec.fixed_seg is None):
            raise InputError(
                fn, "{where} must name 'moving_seg' and 'fixed_seg'", "path", where=where
            )
        pairs.append(spec)
    return pairs


def shard(pairs: Sequence[PairSpec], rank: int, world_size: int) -> list[PairSpec]:
    """Rows ``rank::world_size``: the shards of ranks ``0..N-1`` cover every row exactly once.

    Raises:
        ValueError: Unless ``0 <= rank < world_size``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"shard(): 'rank' must lie in [0, world_size), got rank {rank}, world_size {world_size}"
        )
    return list(pairs[rank::world_size])


LABEL_TOLERANCE = 1e-2  # |x - rint(x)| above this: not a label id (as in geometry.io)
MAX_LABELS = 2000  # more distinct values than this: an intensity image, not a label map


def check_label_map(fn: str, name: str, path: PathLike) -> None:
    """Raise unless ``path`` holds a label map: integer ids, at most :data:`MAX_LABELS` of them.

    :func:`hyperreg.geometry.io.load_volume` reads any image as a label map when asked (rounding,
    with a warning for values far from integers); Dice on an intensity image read that way is
    meaningless (typically no label in common, mean Dice NaN). This check makes that an error.
    The rule: every voxel within ``1e-2`` of an integer, and at most :data:`MAX_LABELS`
    distinct values (FreeSurfer's aparc.a2009s+aseg has about 190, Schaefer-1000 about 1000;
    an intensity image stored as integers has thousands).

    Args:
        fn: Name of the calling function, for the message.
        name: Name of the argument (or CSV column) that gave ``path``.
        path: Label map file (NIfTI, MGZ or npz).

    Raises:
        FileNotFoundError: If ``path`` is missing.
        ValueError: If it is unreadable (see ``load_volume``), has values that are not
            integers, or more than :data:`MAX_LABELS` distinct values.
    """
    from hyperreg.geometry.io import load_volume

    with warnings.catch_warnings():  # e.g. "constant" for an empty label map: not a concern
        warnings.simplefilter("ignore")
        # float32, finite, 2D or 3D; only the values matter here, so an npz needs no geometry
        with passed_as(path=name):  # the file's errors name the argument that gave it
            data = load_volume(path, assume_identity=True).data
    if not data.size:
        return
    ids = np.rint(data)
    deviation = float(np.max(np.abs(data - ids)))
    if deviation > LABEL_TOLERANCE:
        raise InputError(
            fn,
            "{0} must be a label map of integer ids, but '{path}' has values up to "
            "{deviation:.3g} away from an integer (range [{lo:g}, {hi:g}]); is it an intensity "
            "image?",
            name,
            path=path,
            deviation=deviation,
            lo=data.min(),
            hi=data.max(),
        )
    ids = ids.astype(np.int64).ravel()
    if ids.min() >= 0 and ids.max() < 2**20:
        count = int(np.count_nonzero(np.bincount(ids)))
    else:
        count = len(np.unique(ids))
    if count > MAX_LABELS:
        raise InputError(
            fn,
            "{0} must be a label map (at most {limit} distinct ids), but '{path}' has {count} "
            "distinct values; is it an intensity image?",
            name,
            limit=MAX_LABELS,
            path=path,
            count=count,
        )


def parse_lambdas(text: str) -> list[float]:
    """Parse a λ list: ``"start:stop:count"`` (inclusive, evenly spaced) or ``"0.1,0.3,0.5"``.

    Args:
        text: ``"0:1:11"`` gives 0, 0.1, ..., 1; a comma list gives its values in order; a single
            number gives one value.

    Returns:
        The values, each in [0, 1], rounded to 10 decimals (``0.30000000000000004`` -> ``0.3``).

    Raises:
        ValueError: If the text is malformed, ``count`` is not a positive integer, ``start >
            stop``, a value lies outside [0, 1] (NaN included), or the list is empty.
    """
    fn = "parse_lambdas"
    usage = "'start:stop:count' (inclusive, e.g. 0:1:11) or a comma list such as 0.1,0.3,0.5"
    text = str(text).strip()
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise ValueError
            start, stop = float(parts[0]), float(parts[1])
            count = int(parts[2])
            if count < 1:
                raise InputError(
                    fn, "'count' must be a positive integer, got {count!r}", "text", count=parts[2]
                )
            if start > stop:
                raise InputError(fn, "'start' must be <= 'stop', got {text!r}", "text", text=text)
            values = np.linspace(start, stop, count).tolist() if count > 1 else [start]
        else:
            values = [float(item) for item in text.split(",")]
    except InputError:
        raise
    except ValueError:
        raise InputError(
            fn, "λ list must be {usage}, got {text!r}", "text", usage=usage, text=text
        ) from None
    bad = [v for v in values if math.isnan(v) or not 0.0 <= v <= 1.0]
    if bad:
        raise InputError(
            fn, "every λ must lie in [0, 1], got {bad} in {text!r}", "text", bad=bad[:4], text=text
        )
    return [round(v, 10) for v in values]
