"""Scores of the ``cut`` and ``cavity`` cases of benchmarks/clinical_cases.py (RESULTS_clinical.md).

``cut``: mean Dice over the labels wholly inside the cut moving scan (every voxel of the label
in the cropped DLMUSE map), for a registration of the uncut scan and one of the cut scan.
``cavity``: mean Dice over the moving labels touching the cavity (within one voxel of the
sphere), for two registrations, and the cavity's volume (voxels of the fixed grid, label 1 of
the sphere warped with ``hyperreg warp``) against the sphere's before.

Usage::

    python benchmarks/clinical_masks_score.py cut <full DLMUSE> <cut DLMUSE> <fixed DLMUSE> \
        <moved seg uncut> <moved seg cut>
    python benchmarks/clinical_masks_score.py cavity <moving DLMUSE> <sphere> <fixed DLMUSE> \
        <moved seg intact> <moved seg cavity> [<warped sphere>]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import nibabel as nib
import numpy as np
from scipy import ndimage


def _load(path: str) -> np.ndarray:
    return np.asarray(nib.load(path).dataobj).astype(np.int64)


def _mean_dice(moved: np.ndarray, fixed: np.ndarray, labels: Sequence[int]) -> float:
    scores = []
    for label in labels:
        a, b = moved == label, fixed == label
        total = a.sum() + b.sum()
        scores.append(2.0 * (a & b).sum() / total if total else np.nan)
    return float(np.nanmean(scores))


def main(argv: Sequence[str]) -> int:
    kind, *paths = argv
    if kind == "cut":
        full, cut, fixed, uncut_run, cut_run = (_load(p) for p in paths)
        ids, counts = np.unique(full[full > 0], return_counts=True)
        cut_counts = dict(zip(*np.unique(cut[cut > 0], return_counts=True)))
        inside = [int(i) for i, n in zip(ids, counts) if cut_counts.get(i, 0) == n]
        print(f"{len(inside)} labels wholly inside the cut scan (of {len(ids)})")
        for name, run in (("uncut", uncut_run), ("cut", cut_run)):
            print(f"{name}: mean Dice over them {_mean_dice(run, fixed, inside):.4f}")
        return 0
    moving, sphere, fixed, intact_run, cavity_run, *warped = paths
    labels_map, ball = _load(moving), _load(sphere) > 0
    near = ndimage.binary_dilation(ball, iterations=1)
    touching = sorted(int(i) for i in np.unique(labels_map[near]) if i > 0)
    fixed_map = _load(fixed)
    print(f"{len(touching)} labels touch the cavity: {touching}")
    for name, run in (("intact", intact_run), ("cavity", cavity_run)):
        print(f"{name}: mean Dice over them {_mean_dice(_load(run), fixed_map, touching):.4f}")
    if warped:
        size = abs(np.linalg.det(nib.load(sphere).affine[:3, :3]))
        after = (_load(warped[0]) > 0).sum() * np.prod(nib.load(warped[0]).header.get_zooms()[:3])
        print(f"cavity volume {ball.sum() * size:.0f} mm3 before, {after:.0f} mm3 after warping")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
