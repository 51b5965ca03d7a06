"""Atomic file writes: the one place where hyperreg writes a file through a temporary name.

Every output (NIfTI, checkpoint, CSV, JSON, PNG) is written to a hidden temporary file in the
destination folder and renamed over the destination, so an interrupted write never leaves a
truncated or half-written file. Must not import any other hyperreg module.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from hyperreg._errors import MissingInputError

__all__ = ["atomic_text", "atomic_write", "write_csv", "write_json"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a hidden temporary path next to ``path``, then rename it.

    The temporary name keeps every suffix of ``path`` (``.nii.gz``, ``.png``), because writers
    such as nibabel and matplotlib choose the format from it. The parent folder is created.

    Args:
        path: Destination file.
        write: Writes the whole file to the path it is given.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: If the file cannot be written or renamed (no space left, over quota,
            read-only, ...): of the same errno (and subclass), its message naming ``path``,
            ``"cannot write '<path>': No space left on device"``.
        Whatever else ``write`` raises; the temporary file is removed first and ``path`` is
            untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = "".join(path.suffixes)
    stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
    tmp = path.with_name(f".{stem}.tmp-{os.getpid()}-{secrets.token_hex(4)}{suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, MissingInputError):  # an input the writer reads: its own message
            raise
        raise _naming(err, path) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _naming(err: OSError, path: Path) -> OSError:
    """``err`` as an OSError of the same errno (so of the same subclass) naming ``path``, the
    file being written (the temporary name in ``err``, if any, means nothing to a user)."""
    reason = err.strerror or str(err) or type(err).__name__
    if err.errno is None:
        return OSError(f"cannot write '{path}': {reason}")
    return OSError(err.errno, f"cannot write '{path}': {reason}")


def atomic_text(path: str | os.PathLike[str], write: Callable[[IO[str]], None]) -> Path:
    """Write a text file atomically: ``write(handle)`` gets an open text handle (``newline=""``)."""

    def to_file(tmp: Path) -> None:
        with tmp.open("w", newline="") as handle:
            write(handle)

    return atomic_write(path, to_file)


def write_json(path: str | os.PathLike[str], payload: Any, indent: int = 1) -> Path:
    """Write ``payload`` as indented JSON (NaN allowed, as Python's json writes it), atomically."""
    text = json.dumps(payload, indent=indent, allow_nan=True) + "\n"
    return atomic_text(path, lambda handle: handle.write(text))


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"  # NaN as 'nan'
    return value  # None is written as an empty cell by the csv module


def write_csv(
    path: str | os.PathLike[str], rows: Sequence[dict[str, Any]], columns: Sequence[str]
) -> Path:
    """Write ``rows`` under the header ``columns`` atomically; floats as ``%.6g``, NaN as ``nan``.

    A key missing from a row, or a None value, gives an empty cell.
    """

    def write(handle: IO[str]) -> None:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k, "")) for k in columns})

    return atomic_text(path, write)


def read_csv(fn: str, path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """``(header, rows)`` of a CSV file, header names and cells stripped of spaces (an empty or
    missing cell is ``""``).

    Raises:
        FileNotFoundError: If ``path`` does not exist (the message starts with ``fn``).
    """
    if not path.is_file():
        raise MissingInputError(fn, "no such file: '{path}'", "path", path=path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in (reader.fieldnames or [])]
        rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    return header, rows
