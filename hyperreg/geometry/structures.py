"""Structure names for FreeSurfer label ids (a subset of ``FreeSurferColorLUT.txt``).

:data:`FREESURFER_NAMES` covers the aseg structures that FreeSurfer, SAMSEG and the Mindboggle
"CMA" labels use, and the cortical parcels of the Desikan-Killiany(-Tourville) atlases
(``ctx-lh-*`` = 1000 + parcel, ``ctx-rh-*`` = 2000 + parcel). :func:`structure_names` decides
whether a label map's ids are FreeSurfer's; :func:`read_label_names` reads a user's own names (a
FreeSurfer LUT or an ``id,name`` CSV). Imports only hyperreg's error class.

References:
    FreeSurfer ``FreeSurferColorLUT.txt`` (Fischl, NeuroImage 2012); Klein and Tourville,
    101 labeled brain images and a consistent human cortical labeling protocol (DKT),
    Front. Neurosci. 2012.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from pathlib import Path

from hyperreg._errors import InputError, MissingInputError

__all__ = [
    "FREESURFER_NAMES",
    "LABEL_NAMING",
    "freesurfer_misfit",
    "read_label_names",
    "structure_names",
]

LABEL_NAMING = ("auto", "freesurfer", "none")

_ASEG = {
    2: "Left-Cerebral-White-Matter",
    3: "Left-Cerebral-Cortex",
    4: "Left-Lateral-Ventricle",
    5: "Left-Inf-Lat-Vent",
    7: "Left-Cerebellum-White-Matter",
    8: "Left-Cerebellum-Cortex",
    10: "Left-Thalamus",
    11: "Left-Caudate",
    12: "Left-Putamen",
    13: "Left-Pallidum",
    14: "3rd-Ventricle",
    15: "4th-Ventricle",
    16: "Brain-Stem",
    17: "Left-Hippocampus",
    18: "Left-Amygdala",
    24: "CSF",
    26: "Left-Accumbens-area",
    28: "Left-VentralDC",
    30: "Left-vessel",
    31: "Left-choroid-plexus",
    41: "Right-Cerebral-White-Matter",
    42: "Right-Cerebral-Cortex",
    43: "Right-Lateral-Ventricle",
    44: "Right-Inf-Lat-Vent",
    46: "Right-Cerebellum-White-Matter",
    47: "Right-Cerebellum-Cortex",
    49: "Right-Thalamus",
    50: "Right-Caudate",
    51: "Right-Putamen",
    52: "Right-Pallidum",
    53: "Right-Hippocampus",
    54: "Right-Amygdala",
    58: "Right-Accumbens-area",
    60: "Right-VentralDC",
    62: "Right-vessel",
    63: "Right-choroid-plexus",
    72: "5th-Ventricle",
    77: "WM-hypointensities",
    78: "Left-WM-hypointensities",
    79: "Right-WM-hypointensities",
    80: "non-WM-hypointensities",
    81: "Left-non-WM-hypointensities",
    82: "Right-non-WM-hypointensities",
    85: "Optic-Chiasm",
    251: "CC_Posterior",
    252: "CC_Mid_Posterior",
    253: "CC_Central",
    254: "CC_Mid_Anterior",
    255: "CC_Anterior",
}

_CORTEX = {
    1: "bankssts",
    2: "caudalanteriorcingulate",
    3: "caudalmiddlefrontal",
    5: "cuneus",
    6: "entorhinal",
    7: "fusiform",
    8: "inferiorparietal",
    9: "inferiortemporal",
    10: "isthmuscingulate",
    11: "lateraloccipital",
    12: "lateralorbitofrontal",
    13: "lingual",
    14: "medialorbitofrontal",
    15: "middletemporal",
    16: "parahippocampal",
    17: "paracentral",
    18: "parsopercularis",
    19: "parsorbitalis",
    20: "parstriangularis",
    21: "pericalcarine",
    22: "postcentral",
    23: "posteriorcingulate",
    24: "precentral",
    25: "precuneus",
    26: "rostralanteriorcingulate",
    27: "rostralmiddlefrontal",
    28: "superiorfrontal",
    29: "superiorparietal",
    30: "superiortemporal",
    31: "supramarginal",
    32: "frontalpole",
    33: "temporalpole",
    34: "transversetemporal",
    35: "insula",
}

FREESURFER_NAMES: dict[int, str] = {
    **_ASEG,
    **{1000 + k: f"ctx-lh-{v}" for k, v in _CORTEX.items()},
    **{2000 + k: f"ctx-rh-{v}" for k, v in _CORTEX.items()},
}


def structure_names(labels: Iterable[int], naming: str = "auto") -> dict[int, str]:
    """Names for ``labels``: FreeSurfer's where the ids are FreeSurfer's, else the id itself.

    Args:
        labels: Non-zero label ids.
        naming: ``"freesurfer"`` (names from :data:`FREESURFER_NAMES`, the id for unknown ids),
            ``"none"`` (ids as text) or ``"auto"``: FreeSurfer names when **every** id is in the
            table and at least one is ``>= 41`` (a right-hemisphere or cortical id). Renumbered
            maps such as neurite-oasis ``seg35`` (1 = left white matter, not FreeSurfer's 2)
            then keep their numbers.

    Returns:
        ``{label: name}`` for every label.

    Raises:
        ValueError: If ``naming`` is not one of :data:`LABEL_NAMING`.
    """
    if naming not in LABEL_NAMING:
        raise ValueError(
            f"structure_names(): 'naming' must be one of {LABEL_NAMING}, got {naming!r}"
        )
    ids = sorted({int(label) for label in labels})
    use = naming == "freesurfer" or (
        naming == "auto"
        and bool(ids)
        and all(i in FREESURFER_NAMES for i in ids)
        and max(ids) >= 41
    )
    return {i: FREESURFER_NAMES.get(i, str(i)) if use else str(i) for i in ids}


def freesurfer_misfit(labels: Iterable[int]) -> str | None:
    """Why FreeSurfer's names may not fit ``labels``, or None when they do.

    They fit when most ids (at least half) are in :data:`FREESURFER_NAMES` and at least one is
    ``>= 41`` (a right-hemisphere or cortical id): the same evidence ``naming="auto"`` asks of
    every id. Maps of another atlas (DLMUSE/MUSE ids, renumbered maps such as ``seg24`` or
    ``seg35``) fail one of the two.

    Args:
        labels: Non-zero label ids.

    Returns:
        One clause naming what does not fit (how many ids are not FreeSurfer's, with up to five
        of them, or that none is ``>= 41``), or None.
    """
    ids = sorted({int(label) for label in labels})
    if not ids:
        return None
    foreign = [i for i in ids if i not in FREESURFER_NAMES]
    if 2 * len(foreign) > len(ids):
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        listed = ", ".join(map(str, foreign[:5]))
        return f"{len(foreign)} of {len(ids)} label ids are not FreeSurfer ids ({listed}{more})"
    if max(ids) < 41:
        return (
            f"every label id is below 41 ({ids[0]}-{ids[-1]}), as in a renumbered map (seg24, "
            "seg35), where FreeSurfer's names do not fit"
        )
    return None


def read_label_names(path: str | os.PathLike[str]) -> dict[int, str]:
    """Structure names from a file: a FreeSurfer colour table or a CSV of ids and names.

    Two formats, told apart line by line: a line with a comma is CSV (``17,Left-Hippocampus``;
    columns after the name are ignored; quoted names may hold commas), any other line is a
    FreeSurfer LUT line, whitespace-separated ``id name r g b a`` (as ``FreeSurferColorLUT.txt``;
    the colour is optional and ignored). Blank lines and ``#`` comments are skipped; a first
    line whose id is not an integer (``id,name``, ``label,structure``) is a header.

    Args:
        path: The file (any suffix).

    Returns:
        ``{id: name}``, in file order.

    Raises:
        FileNotFoundError: If ``path`` does not exist (a
            :class:`~hyperreg._errors.MissingInputError` of argument ``"path"``).
        ValueError: (An :class:`~hyperreg._errors.InputError` of argument ``"path"``, naming
            the file and line.) If a line has no name, its id is not an integer (after the
            header), an id is given twice with different names, or the file names no label.

    References:
        FreeSurfer ``FreeSurferColorLUT.txt`` format (``No. Label Name: R G B A``).
    """
    fn = "read_label_names"
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(fn, "no such file: '{path}'", "path", path=path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(fn, "cannot read '{path}': {err}", "path", path=path, err=err) from None
    names: dict[int, str] = {}
    header_allowed = True
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        fields = next(csv.reader([text])) if "," in text else text.split()
        fields = [f.strip() for f in fields]
        first, header_allowed = header_allowed, False
        try:
            label = int(fields[0])
        except ValueError:
            if first:
                continue  # a header: id,name
            label = None
        if label is None or len(fields) < 2 or not fields[1]:
            raise InputError(
                fn,
                "'{path}' line {number}: expected 'id name r g b a' (a FreeSurfer LUT) or "
                "'id,name' (CSV) with an integer id, got {text!r}",
                "path",
                path=path,
                number=number,
                text=text[:80],
            )
        if names.get(label, fields[1]) != fields[1]:
            raise InputError(
                fn,
                "'{path}' line {number}: id {label} is named twice ({old!r}, then {new!r})",
                "path",
                path=path,
                number=number,
                label=label,
                old=names[label],
                new=fields[1],
            )
        names[label] = fields[1]
    if not names:
        raise InputError(fn, "'{path}' names no label (no 'id name' line)", "path", path=path)
    return names
