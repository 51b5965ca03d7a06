"""Telling label maps from intensity images among the files of a training folder.

A file is a label map when its name says so (:data:`LABEL_WORDS`), else when its NIfTI header
says so (a label or NeuroNames intent), else when its content looks like one
(:func:`~hyperreg.geometry.inspect.looks_like_label_map` on its central slices: integer values,
few distinct ids, piecewise constant). :mod:`hyperreg.training.sources` uses it to pair each
label map with its image and never train on a label map as an image. Must not import model,
train, inference or cli.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np

from hyperreg.geometry.inspect import looks_like_label_map
from hyperreg.geometry.io import load_volume

__all__ = ["LABEL_WORDS", "has_label_name", "is_label_map"]

LABEL_WORDS = ("seg", "label", "parc", "dlmuse")
"""A file whose name holds one of these (any case) is a label map: ``seg``, ``aseg``,
``dseg``, ``label``, ``aparc``, ``parc``, ``DLMUSE``. Other files are told by content
(:func:`is_label_map`)."""
_NIFTI_LABEL_INTENTS = (1002, 1003)  # NIFTI_INTENT_LABEL, NIFTI_INTENT_NEURONAME
_SLAB = 16  # slices of a 3D file read to judge its content (the central ones)


def has_label_name(path: str | Path) -> bool:
    """Whether a file's name holds one of :data:`LABEL_WORDS` (any case); no file is read."""
    return any(word in Path(path).name.lower() for word in LABEL_WORDS)


def _central_slab(path: Path) -> np.ndarray | bool | None:
    """The file's central :data:`_SLAB` slices along its last spatial axis (all of a 2D file);
    True for a NIfTI whose intent says it holds label (or NeuroNames) ids; None when it cannot
    be judged here (not 2D or 3D: the loader reports that later)."""
    if path.name.lower().endswith(".npz"):
        try:
            return load_volume(path, assume_identity=True, warn_constant=False).data
        except (OSError, ValueError):
            return None
    img = nib.load(path)
    if isinstance(img, nib.Nifti1Image) and int(img.header["intent_code"]) in _NIFTI_LABEL_INTENTS:
        return True
    shape = [int(n) for n in img.shape]
    while len(shape) > 2 and shape[-1] == 1:
        shape.pop()
    if len(shape) not in (2, 3):
        return None
    index: tuple[slice | int, ...] = (slice(None),) * len(shape)
    if len(shape) == 3 and shape[2] > _SLAB:
        start = (shape[2] - _SLAB) // 2
        index = (slice(None), slice(None), slice(start, start + _SLAB))
    index += (0,) * (len(img.shape) - len(shape))
    return np.asarray(img.dataobj[index])


def is_label_map(path: str | Path) -> bool:
    """Whether a scan file holds a label map rather than an intensity image.

    By name first (:data:`LABEL_WORDS`, no voxel read), then by header (a NIfTI intent of label
    or NeuroNames ids), then by content: the central :data:`_SLAB` slices of a 3D file (all of
    a 2D one) judged by :func:`~hyperreg.geometry.inspect.looks_like_label_map` (integer values,
    few distinct ids, piecewise constant). An unreadable file is an image here (its loader
    says what is wrong with it).

    Args:
        path: A scan file (NIfTI, MGH/MGZ or npz).

    Returns:
        True for a label map (or a binary mask), False for an image.
    """
    path = Path(path)
    if has_label_name(path):
        return True
    try:
        slab = _central_slab(path)
    except Exception:  # nibabel raises many types for a foreign or truncated file
        return False
    if isinstance(slab, bool) or slab is None:
        return bool(slab)
    return slab.dtype.kind in "biuf" and looks_like_label_map(slab)
