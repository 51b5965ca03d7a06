"""The input files of the applications, read and checked before any work.

Pair lists (:func:`read_pairs`: a CSV of ``moving``, ``fixed``, optional ``moving_seg``,
``fixed_seg``, ``lambda``, ``initial_affine``, ``fixed_mask``, ``moving_mask``, ``contrast`` and
``name``, each pair named after its files
unless its row names it; :func:`shard` for several processes), label maps
(:func:`check_label_map`: integer ids, not an intensity image; :func:`read_label_map`: the
same check on the one read a registration makes) and λ lists
(:func:`parse_lambdas`). Used by ``batch``, ``tune``, ``sweep`` and the command line. Light to
import (no torch); must not import cli.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hyperreg._errors import InputError, passed_as
from hyperreg._files import read_csv

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hyperreg.geometry.io import Volume
    from hyperreg.registration.pairs import PathLike

__all__ = [
    "MAX_LABELS",
    "PairSpec",
    "check_label_map",
    "check_pair_masks",
    "parse_lambdas",
    "read_label_map",
    "read_pairs",
    "shard",
]

PAIR_COLUMNS = (
    "moving",
    "fixed",
    "moving_seg",
    "fixed_seg",
    "lambda",
    "initial_affine",
    "fixed_mask",
    "moving_mask",
    "contrast",
    "name",
)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")  # a pair's folder: safe anywhere
IMAGE_SUFFIXES = (".nii.gz", ".nii", ".mgz", ".mgh", ".npz")


@dataclass(frozen=True)
class PairSpec:
    """One row of a pair CSV.

    Attributes:
        index: 0-based row number (header excluded).
        moving: Moving image path.
        fixed: Fixed image path.
        moving_seg: Moving label map path, or None.
        fixed_seg: Fixed label map path, or None.
        lam: The row's λ, or None when its ``lambda`` cell is empty or absent.
        initial_affine: The row's initial transform file (ITK ``.mat``/``.tfm``, as
            ``--initial-affine``), or None when its ``initial_affine`` cell is empty or absent.
        fixed_mask: The row's fixed cost mask (as ``--fixed-mask``: a NIfTI/MGZ of 0 and 1),
            or None when its ``fixed_mask`` cell is empty or absent.
        moving_mask: The row's moving cost mask (as ``--moving-mask``), or None.
        contrast: The row's ``contrast`` cell (as ``--contrast``: ``"auto"``, ``"same"`` or
            ``"different"``), or None when it is empty or absent (the batch's own).
        name: The pair's name (its output folder in ``batch``): the row's ``name`` cell, else
            one made from the file names (:func:`read_pairs`); ``pair00042`` for row 42 when
            none is given here.
    """

    index: int
    moving: Path
    fixed: Path
    moving_seg: Path | None = None
    fixed_seg: Path | None = None
    lam: float | None = None
    initial_affine: Path | None = None
    fixed_mask: Path | None = None
    moving_mask: Path | None = None
    contrast: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", f"pair{self.index:05d}")


def read_pairs(path: PathLike, *, require_segs: bool = False) -> list[PairSpec]:
    """Read a pair CSV.

    Args:
        path: CSV with a header holding ``moving`` and ``fixed``, optionally ``moving_seg``,
            ``fixed_seg``, ``lambda``, ``initial_affine``, ``fixed_mask``, ``moving_mask``,
            ``contrast`` and ``name`` (other columns are ignored). Empty cells mean "none".
            Relative paths are relative to the CSV's folder. Files are not opened here (a
            mask's contents are checked when its pair runs:
            :func:`hyperreg.registration.masks.load_mask`).
        require_segs: Every row must name both label maps (for λ tuning on Dice).

    Returns:
        One :class:`PairSpec` per data row, in file order. Its ``name`` is the row's ``name``
        cell, else ``<moving>__to__<fixed>``: the two file names without their extension,
        characters other than letters, digits and ``._+-`` as ``_``; where rows would share a
        name, the folders above the files are added until they differ
        (``subjA_mri_brain__to__subjB_mri_brain``), and rows of the same two files get ``-2``,
        ``-3`` … in row order. A name depends on the rows alone, never on a shard.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the header lacks ``moving`` or ``fixed``, a row has an empty ``moving``
            or ``fixed`` cell, a ``lambda`` cell is not a number in [0, 1], a ``contrast`` cell
            is not ``auto``, ``same`` or ``different``, a ``name`` cell is
            not a folder name (letters, digits and ``._+-``, starting with a letter or digit,
            at most 200 characters) or is another row's, a label map is missing with
            ``require_segs``, or there are no rows.
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
            fixed_mask=resolve(row.get("fixed_mask", "")),
            moving_mask=resolve(row.get("moving_mask", "")),
            contrast=_contrast_cell(fn, where, row.get("contrast", "")),
        )
        if require_segs and (spec.moving_seg is None or spec.fixed_seg is None):
            raise InputError(
                fn, "{where} must name 'moving_seg' and 'fixed_seg'", "path", where=where
            )
        pairs.append(spec)
    given = _given_names(fn, path, [row.get("name", "") for row in rows])
    unnamed = [spec for spec, name in zip(pairs, given) if not name]
    made = _made_names(unnamed, {name for name in given if name}) if unnamed else {}
    return [
        PairSpec(**{**vars(spec), "name": name or made[spec.index]})
        for spec, name in zip(pairs, given)
    ]


def _contrast_cell(fn: str, where: str, cell: str) -> str | None:
    """A row's ``contrast`` cell, checked: None when empty, else one of
    :data:`~hyperreg.registration.contrast.CONTRAST_CHOICES` (surrounding spaces and case
    ignored)."""
    if not cell.strip():
        return None
    from hyperreg.registration.contrast import CONTRAST_CHOICES  # only for rows that name one

    value = cell.strip().lower()
    if value not in CONTRAST_CHOICES:
        raise InputError(
            fn,
            "{where}, column 'contrast': must be one of {choices}, got {cell!r}",
            "path",
            where=where,
            choices=", ".join(CONTRAST_CHOICES),
            cell=cell,
        )
    return value


def _given_names(fn: str, path: Path, cells: list[str]) -> list[str]:
    """The ``name`` cells, checked: folder names, each used once (``""`` where empty)."""
    first: dict[str, int] = {}
    for index, name in enumerate(cells):
        if not name:
            continue
        where = f"'{path}' row {index} (line {index + 2})"
        if not NAME_PATTERN.fullmatch(name):
            raise InputError(
                fn,
                "{where}: 'name' must be a folder name (letters, digits and ._+-, starting with a "
                "letter or digit, at most 200 characters), got {name!r}",
                "path",
                where=where,
                name=name,
            )
        if name in first:
            raise InputError(
                fn,
                "{where}: 'name' {name!r} is also row {other}'s; each pair needs its own",
                "path",
                where=where,
                name=name,
                other=first[name],
            )
        first[name] = index
    return cells


def _made_names(pairs: Sequence[PairSpec], taken: set[str]) -> dict[int, str]:
    """``{index: name}`` made from the file names for each of ``pairs`` (the rows without a
    ``name`` cell; see :func:`read_pairs`), none of them in ``taken``."""

    def part(path: Path, depth: int) -> str:
        parts = Path(os.path.normpath(path)).parts[-depth:]
        last = parts[-1]
        cut = next((s for s in IMAGE_SUFFIXES if last.lower().endswith(s)), Path(last).suffix)
        text = "_".join([*parts[:-1], last[: len(last) - len(cut)] if cut else last])
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("._-+")[-90:] or "image"

    def name(pair: PairSpec, depth: int) -> str:
        return f"{part(pair.moving, depth)}__to__{part(pair.fixed, depth)}"

    deepest = max(len(Path(p).parts) for pair in pairs for p in (pair.moving, pair.fixed))
    names: dict[int, str] = {}
    for depth in range(1, deepest + 1):  # one more folder where rows share a name
        left = [pair for pair in pairs if pair.index not in names]
        if not left:
            break
        counts = Counter(name(pair, depth) for pair in pairs)
        for pair in left:
            if counts[candidate := name(pair, depth)] == 1 and candidate not in taken:
                names[pair.index] = candidate
    used = set(taken)
    for pair in pairs:  # the same two files in several rows: -2, -3 … in row order
        base = names.get(pair.index) or name(pair, 1)
        candidate, number = base, 1
        while candidate in used:
            number += 1
            candidate = f"{base}-{number}"
        names[pair.index] = candidate
        used.add(candidate)
    return names


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
    if -(2**31) <= ids.min() and ids.max() < 2**31:  # int32 sorts faster than int64 counts
        ids = ids.astype(np.int32)
    _check_label_count(fn, name, path, ids)


def read_label_map(fn: str, name: str, path: PathLike) -> Volume | PathLike:
    """A label map read once and checked as :func:`check_label_map` checks it.

    For a file with a header, one read as a label map
    (:func:`~hyperreg.geometry.io.load_volume` with ``label=True``: int32 ids, the file's
    geometry), then at most :data:`MAX_LABELS` distinct ids; a file that cannot be read as a
    label map (values that are not integer ids, NaN) raises :func:`check_label_map`'s error,
    so the messages are the same as those of the check before a registration. A header-less
    file (npz) takes its geometry from the pair (the caller's ``npz_geometry``): it is
    checked by :func:`check_label_map` and its path returned, to be read by the pipeline.

    Args:
        fn: Name of the calling function, for the message.
        name: Name of the argument that gave ``path``.
        path: Label map file (NIfTI, MGZ or npz).

    Returns:
        The :class:`~hyperreg.geometry.io.Volume` (int32 ids) as
        :func:`~hyperreg.registration.inputs.load_input` reads a label map, or ``path``
        itself for an npz file.

    Raises:
        FileNotFoundError: If ``path`` is missing.
        ValueError: As :func:`check_label_map`.
    """
    from hyperreg.geometry.io import has_header, load_volume

    if not has_header(path):
        check_label_map(fn, name, path)
        return path
    try:
        with passed_as(path=name):  # the file's errors name the argument that gave it
            volume = load_volume(path, label=True)
    except InputError:
        check_label_map(fn, name, path)  # its own message for an intensity image
        raise
    _check_label_count(fn, name, path, volume.data)
    return volume


def _check_label_count(fn: str, name: str, path: PathLike, ids: np.ndarray) -> None:
    """Raise unless the integer map ``ids`` holds at most :data:`MAX_LABELS` distinct values
    (0 included; counted by :func:`~hyperreg.method.metrics.input_labels`: ``np.bincount``
    in blocks for ids in ``[0, 2**20]``, ``np.unique`` otherwise)."""
    from hyperreg.method.metrics import input_labels

    count = len(input_labels(ids, ids)) + int(ids.size > 0 and not np.all(ids))
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


def check_pair_masks(fn: str, path: PathLike, pairs: Sequence[PairSpec]) -> None:
    """Check the mask cells of a pair CSV's rows before any work: every ``fixed_mask`` and
    ``moving_mask`` file that exists holds only 0 and 1 and at least one 1
    (:func:`hyperreg.registration.masks.check_mask_values`; each file read once however many
    rows name it). A missing file is left to the pair (it fails; the others run). Whether a
    mask lies on its image's grid is decided when its pair runs
    (:func:`hyperreg.registration.masks.load_mask`).

    Args:
        fn: Name of the calling function, for the message.
        path: The pair CSV (named in the message).
        pairs: Its rows (:func:`read_pairs`).

    Raises:
        ValueError: (an :class:`InputError` of ``"path"``) naming the first bad mask's row,
            line and column, e.g. ``"'pairs.csv' row 3 (line 5), column 'moving_mask': the mask
            'a.nii.gz' holds values other than 0 and 1 (2)"``; also an unreadable mask file.
    """
    from hyperreg.geometry.io import load_volume
    from hyperreg.registration.masks import check_mask_values

    seen: set[Path] = set()
    for pair in pairs:
        for column in ("fixed_mask", "moving_mask"):
            mask = getattr(pair, column)
            if mask is None or mask in seen or not Path(mask).is_file():
                continue
            seen.add(mask)
            try:
                with warnings.catch_warnings():  # a constant mask is refused below
                    warnings.simplefilter("ignore")
                    data = load_volume(mask, assume_identity=True).data
                check_mask_values(fn, data, mask, column)
            except ValueError as err:
                raise InputError(
                    fn,
                    "'{csv}' row {index} (line {line}), column '{column}': {detail}",
                    "path",
                    csv=path,
                    index=pair.index,
                    line=pair.index + 2,
                    column=column,
                    detail=getattr(err, "detail", str(err)),
                ) from None


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
