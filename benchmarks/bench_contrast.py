"""Contrast detection on the shared data (benchmarks/RESULTS_contrast.md).

For every pair: the affine stage of ``hyperreg register`` (``load_pair``, default settings),
then :func:`hyperreg.registration.contrast.compare_contrasts` on the moving image after it and
the fixed image. Pairs: T1 -> T1 (multicontrast-2d people, Mindboggle slices, neurite-oasis
slices, IXI 2 mm heads in 3D, OASIS FreeSurfer norm in 3D), T2 -> T1 and T1 -> T2
(multicontrast-2d, the same person and two people), T2-like and FLAIR-like slices synthesised
from neurite-oasis seg4 maps, a T2-like IXI head synthesised from its DLMUSE map (see
:func:`synthetic_t2_3d`), and monotone changes of T1 (gamma 0.5, gamma 2).

Usage: ``python benchmarks/bench_contrast.py [--ixi N] > table.md`` (stdout: a Markdown table
per group; progress on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy.ndimage import gaussian_filter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log, table

from hyperreg.geometry.io import Volume
from hyperreg.registration.contrast import compare_contrasts
from hyperreg.registration.inputs import load_input
from hyperreg.registration.pipeline import load_pair

MC = "multicontrast-2d"
T1 = "structInSpaceOfTemplateCoronalSlice.nii.gz"
T2 = "T2_" + T1
# seg4 classes: 0 background, 1 cortex, 2 subcortical GM, 3 white matter, 4 CSF
SEG4_T2 = (0.0, 0.6, 0.55, 0.35, 1.0)
SEG4_FLAIR = (0.0, 0.7, 0.65, 0.5, 0.08)
T2_CLASSES = (1.0, 0.6, 0.35)  # CSF, GM, WM (relative to the T1's brain 99th percentile)


def render_seg4(seg: np.ndarray, values: Sequence[float], seed: int) -> np.ndarray:
    """A contrast drawn from a seg4 map: one value per class, blurred (σ 0.7 voxel), 2 %
    Gaussian noise inside the head, clipped at 0."""
    image = np.asarray(values, dtype=np.float64)[seg.astype(int)]
    image = gaussian_filter(image, 0.7)
    noise = np.random.default_rng(seed).normal(0.0, 0.02, image.shape)
    return np.clip(image + noise * (image > 0.01), 0.0, None).astype(np.float32)


def synthetic_t2_3d(
    t1: np.ndarray,
    labels: np.ndarray,
    seed: int = 0,
    classes: Sequence[float] | None = T2_CLASSES,
) -> np.ndarray:
    """A T2-like head from a T1 head and its parcellation: each brain label (``labels > 0``)
    becomes CSF, GM or WM by its median T1 intensity (nearest of three 1D k-means centres of
    the brain's T1 intensities), and takes that class's T2-like value (``classes``, default
    :data:`T2_CLASSES`, times the brain's 99th T1 percentile; None: the T1's own class centres,
    a T1 drawn the same way); outside the brain the T1 at half its intensity (the scalp and
    skull). Blurred (σ 0.6 voxel), 2 % noise."""
    brain = labels > 0
    values = t1[brain].astype(np.float64)
    centres = np.percentile(values, [15, 50, 85])
    for _ in range(20):  # 1D k-means, 3 classes
        nearest = np.argmin(np.abs(values[:, None] - centres[None]), axis=1)
        centres = np.array([values[nearest == k].mean() for k in range(3)])
    top = float(np.percentile(values, 99))
    classes = centres / top if classes is None else classes
    out = 0.5 * t1.astype(np.float64)
    for label in np.unique(labels[brain]):
        where = labels == label
        kind = int(np.argmin(np.abs(centres - np.median(t1[where]))))  # 0 CSF, 1 GM, 2 WM
        out[where] = classes[kind] * top
    out = gaussian_filter(out, 0.6)
    noise = np.random.default_rng(seed).normal(0.0, 0.02 * top, out.shape)
    return np.clip(out + noise * (out > 0.01 * top), 0.0, None).astype(np.float32)


def volume(path: Path, data: np.ndarray | None = None) -> Volume:
    """The :class:`Volume` of ``path`` as ``register`` reads it, or ``data`` (its shape) with
    its header."""
    read = load_input(path, warn_constant=False)
    return read if data is None else dataclasses.replace(read, data=data.astype(np.float32))


def check(moving: Path | Volume, fixed: Path | Volume) -> tuple[bool, float, float]:
    """``(differ, rise, correlation)`` after the affine stage of ``register``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pair = load_pair(moving, fixed)
    found = compare_contrasts(pair.aligned.data, pair.fixed.data)
    return found.differ, found.rise, found.correlation


def groups(ixi: int) -> dict[str, list[tuple[str, object, object]]]:
    """Named groups of ``(name, moving, fixed)``."""
    mc = DATA_ROOT / MC
    people = sorted(p.name for p in mc.iterdir() if p.is_dir())
    out: dict[str, list[tuple[str, object, object]]] = {}
    out["T1 -> T1, multicontrast-2d, two people"] = [
        (f"{a}->{b}", mc / a / T1, mc / b / T1) for a, b in itertools.permutations(people, 2)
    ]
    mb = sorted(
        p
        for p in (DATA_ROOT / "mindboggle-trt20-2d").glob("*/*_slice118.nii.gz")
        if "labels" not in p.name
    )
    out["T1 -> T1, Mindboggle slices, two people"] = [
        (f"{a.parent.name}->{b.parent.name}", a, b) for a, b in itertools.combinations(mb, 2)
    ]
    oasis = DATA_ROOT / "neurite-oasis"
    s1, s2 = (oasis / f"OASIS_OAS1_000{i}_MR1" for i in (1, 2))
    out["T1 -> T1, neurite-oasis"] = [
        ("slice 2->1", s2 / "slice_norm.nii.gz", s1 / "slice_norm.nii.gz"),
        ("slice_orig 2->1", s2 / "slice_orig.nii.gz", s1 / "slice_orig.nii.gz"),
    ]
    t1 = volume(s2 / "slice_norm.nii.gz")
    out["monotone change of T1 (neurite-oasis slice 2 -> 1)"] = [
        (f"gamma {g}", volume(t1.path, t1.data**g), s1 / "slice_norm.nii.gz") for g in (0.5, 2.0)
    ]
    out["T2 -> T1, multicontrast-2d, same person"] = [(p, mc / p / T2, mc / p / T1) for p in people]
    out["T1 -> T2, multicontrast-2d, same person"] = [(p, mc / p / T1, mc / p / T2) for p in people]
    out["T2 -> T1, multicontrast-2d, two people"] = [
        (f"{a}->{b}", mc / a / T2, mc / b / T1) for a, b in itertools.permutations(people, 2)
    ]
    synth = []
    for i, (name, values) in enumerate((("T2-like", SEG4_T2), ("FLAIR-like", SEG4_FLAIR))):
        for src, dst in ((s2, s1), (s1, s2)):
            seg = volume(src / "slice_seg4.nii.gz")
            image = volume(src / "slice_seg4.nii.gz", render_seg4(seg.data, values, seed=i))
            synth.append((f"{name} of {src.name[6:14]} -> T1", image, dst / "slice_norm.nii.gz"))
    out["synthetic T2/FLAIR -> T1, neurite-oasis seg4 slices"] = synth
    ixi_dir = DATA_ROOT / "ixi-2mm"
    names = sorted(p.name[: -len("_DLMUSE.nii.gz")] for p in ixi_dir.glob("*_DLMUSE.nii.gz"))
    names = names[:ixi]
    out["T1 -> T1, IXI 2 mm heads (3D)"] = [
        (f"{a}->{b}", ixi_dir / f"{a}_T1.nii.gz", ixi_dir / f"{b}_T1.nii.gz")
        for a, b in itertools.pairwise(names)
    ]
    fs = DATA_ROOT / "oasis1-freesurfer"
    out["T1 -> T1, OASIS FreeSurfer norm (3D)"] = [
        ("OAS1_0002->0001", fs / "OAS1_0002_MR1/norm.mgz", fs / "OAS1_0001_MR1/norm.mgz")
    ]
    t2 = []
    for a, b in itertools.pairwise(names):
        head = volume(ixi_dir / f"{a}_T1.nii.gz")
        labels = np.asarray(nib.load(ixi_dir / f"{a}_DLMUSE.nii.gz").dataobj)
        image = volume(head.path, synthetic_t2_3d(head.data, labels))
        t2.append((f"synthetic T2 {a}->{b}", image, ixi_dir / f"{b}_T1.nii.gz"))
    out["synthetic T2 -> T1, IXI 2 mm (3D)"] = t2
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ixi", type=int, default=6, help="IXI people (consecutive pairs)")
    args = parser.parse_args(argv)
    for title, pairs in groups(args.ixi).items():
        rows, flagged, rises = [], 0, []
        for name, moving, fixed in pairs:
            differ, rise, correlation = check(moving, fixed)
            log(title, name, differ, f"{rise:.3f}", f"{correlation:.3f}")
            flagged += differ
            rises.append(rise)
            rows.append((name, "differ" if differ else "same", f"{rise:.2f}", f"{correlation:.2f}"))
        print(f"### {title}\n")
        print(
            f"{flagged} of {len(pairs)} flagged as other contrasts; rank correlation "
            f"{min(rises):.2f} to {max(rises):.2f}\n"
        )
        if len(rows) <= 16:
            print(table(("pair", "found", "rank correlation", "Pearson r"), rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
