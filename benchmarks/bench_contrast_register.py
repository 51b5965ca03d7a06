"""Registration of other contrasts with the default ``register`` (benchmarks/RESULTS_contrast.md).

Each row is ``hyperreg.apps.register.register_files`` with the bundled model and every default
(what ``hyperreg register --moving M --fixed F --warp W [--moving-seg ... --fixed-seg ...]``
runs), once with ``contrast="auto"`` (the default) and once with ``contrast="same"`` (the code
before: local NCC whatever the pair). Groups:

* ``aligned``: each multicontrast-2d person's T2 slice to their own T1 (already aligned): mean
  and 95th percentile of |displacement| of the written field (fixed voxels).
* ``2d``: a T2-like and a FLAIR-like slice synthesised from OAS1_0002's seg4 map
  (:func:`bench_contrast.render_seg4`) to OAS1_0001's T1 slice, against OAS1_0002's T1 slice;
  mean Dice over the seg24 labels.
* ``3d``: IXI012 -> IXI239 (DLMUSE labels): a synthetic T2 of IXI012
  (:func:`bench_contrast.synthetic_t2_3d`) against its T1.
* ``gains``: every ordered multicontrast-2d T2 -> T1 pair (8 of one person, 56 of two): by how
  much the network's field raises the verdict's similarity for other contrasts (normalised
  gradient fields) over the best of the pair as it came and the affine alone, at the λ
  ``register`` uses; the share :data:`hyperreg.registration.verdict.MIN_GAINS` was set on it.

Synthetic images are written to ``--work`` (a scratch folder, never the repository).
Usage: ``python benchmarks/bench_contrast_register.py --work /tmp/contrast aligned 2d 3d gains``.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log
from bench_contrast import MC, SEG4_FLAIR, SEG4_T2, T1, T2, render_seg4, synthetic_t2_3d

from hyperreg.registration.defaults import model_default_lambda
from hyperreg.apps.models import resolve_model
from hyperreg.apps.register import register_files
from hyperreg.registration.contrast import contrast_lambda, contrast_similarity
from hyperreg.registration.pipeline import load_pair
from hyperreg.registration.verdict import MIN_GAINS


def run(model, moving, fixed, contrast, work: Path, **segs) -> tuple[float, float, object, float]:
    """``(mean |u|, 95th percentile |u|, Dice, CPU seconds)`` of one default registration;
    ``run.kept`` is what its verdict kept."""
    warp = work / "warp.nii.gz"
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = register_files(model, moving, fixed, warp_out=warp, contrast=contrast, **segs)
    seconds = time.process_time() - start
    run.kept = result.verdict.kept if result.verdict is not None else "registered"
    field = np.asarray(nib.load(warp).dataobj, dtype=np.float64)
    norm = np.linalg.norm(field.reshape(-1, field.shape[-1]), axis=1)
    return float(norm.mean()), float(np.percentile(norm, 95)), result.mean_dice, seconds


def save_like(path: Path, data: np.ndarray, like: Path) -> Path:
    """``data`` with the header of ``like`` (trailing axis of a 2D slice restored)."""
    image = nib.load(like)
    if len(image.shape) == data.ndim + 1:
        data = data[..., None]
    nib.save(nib.Nifti1Image(data.astype(np.float32), image.affine), path)
    return path


def aligned(work: Path) -> None:
    mc = DATA_ROOT / MC
    model = resolve_model(None, image=mc / "S1" / T1).model
    print("| person | auto: mean / p95 abs u (voxels) | auto kept | same (NCC): mean / p95 |")
    print("|---|---|---|---|")
    means = {"auto": [], "same": []}
    for person in sorted(p.name for p in mc.iterdir() if p.is_dir()):
        cells, kept = [], None
        for contrast in ("auto", "same"):
            mean, p95, _, _ = run(model, mc / person / T2, mc / person / T1, contrast, work)
            means[contrast].append(mean)
            cells.append(f"{mean:.2f} / {p95:.1f}")
            kept = run.kept if contrast == "auto" else kept
        print(f"| {person} | {cells[0]} | {kept} | {cells[1]} |")
    print(f"| mean | {np.mean(means['auto']):.2f} | | {np.mean(means['same']):.2f} |\n")


def two_d(work: Path) -> None:
    oasis = DATA_ROOT / "neurite-oasis"
    s1, s2 = (oasis / f"OASIS_OAS1_000{i}_MR1" for i in (1, 2))
    model = resolve_model(None, image=s1 / "slice_norm.nii.gz").model
    seg = np.asarray(nib.load(s2 / "slice_seg4.nii.gz").dataobj)[..., 0]
    segs = dict(moving_seg=s2 / "slice_seg24.nii.gz", fixed_seg=s1 / "slice_seg24.nii.gz")
    moving = {"T1 (real)": s2 / "slice_norm.nii.gz"}
    for i, (name, values) in enumerate((("T2-like", SEG4_T2), ("FLAIR-like", SEG4_FLAIR))):
        image = render_seg4(seg, values, seed=i)
        moving[name] = save_like(work / f"{name}.nii.gz", image, s2 / "slice_norm.nii.gz")
    print("| moving (OAS1_0002) -> T1 OAS1_0001 | Dice auto | auto kept | Dice same (NCC) |")
    print("|---|---|---|---|")
    for name, path in moving.items():
        dice, kept = [], None
        for contrast in ("auto", "same"):
            dice.append(run(model, path, s1 / "slice_norm.nii.gz", contrast, work, **segs)[2])
            kept = run.kept if contrast == "auto" else kept
        print(f"| {name} | {dice[0]:.4f} | {kept} | {dice[1]:.4f} |")
    print()


def three_d(work: Path) -> None:
    ixi = DATA_ROOT / "ixi-2mm"
    a, b = "IXI012-HH-1211", "IXI239-HH-2296"
    model = resolve_model(None, image=ixi / f"{a}_T1.nii.gz").model
    labels = np.asarray(nib.load(ixi / f"{a}_DLMUSE.nii.gz").dataobj)
    t1 = np.asarray(nib.load(ixi / f"{a}_T1.nii.gz").dataobj, dtype=np.float32)
    t2 = save_like(work / f"{a}_T2syn.nii.gz", synthetic_t2_3d(t1, labels), ixi / f"{a}_T1.nii.gz")
    segs = dict(moving_seg=ixi / f"{a}_DLMUSE.nii.gz", fixed_seg=ixi / f"{b}_DLMUSE.nii.gz")
    print(f"| {a} -> {b} | contrast | Dice | CPU s |")
    print("|---|---|---|---|")
    for name, path, contrast in (
        ("T1", ixi / f"{a}_T1.nii.gz", "auto"),
        ("synthetic T2", t2, "auto"),
        ("synthetic T2", t2, "same"),
    ):
        _, _, dice, seconds = run(model, path, ixi / f"{b}_T1.nii.gz", contrast, work, **segs)
        print(f"| {name} | {contrast} | {dice:.4f} | {seconds:.0f} |")
        log(name, contrast, dice)
    print()


def gains(work: Path) -> None:
    mc = DATA_ROOT / MC
    model = resolve_model(None, image=mc / "S1" / T1).model
    default = model_default_lambda(model).lam
    people = sorted(p.name for p in mc.iterdir() if p.is_dir())
    found: dict[bool, list[float]] = {True: [], False: []}
    lam = None
    for a, b in itertools.product(people, people):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pair = load_pair(mc / a / T2, mc / b / T1, model=model)
            similarity = contrast_similarity(pair, "auto")
            lam = contrast_lambda(default, similarity) or default
            verdict = pair.register(model, [lam], None, similarity=similarity)[0].verdict
        best = np.nanmax([verdict.similarity_before, verdict.similarity_affine])
        found[a == b].append(float(verdict.similarity_after / best - 1))
    gain = MIN_GAINS["ngf"]
    print(f"λ {lam:g}; a field is kept when it raises NGF by at least {100 * gain:g} %\n")
    print("| T2 -> T1 pairs | pairs | gain min | median | max | below the share (affine kept) |")
    print("|---|---|---|---|---|---|")
    for same, name in ((True, "one person (aligned)"), (False, "two people")):
        g = np.asarray(found[same])
        row = f"{g.min():.3f} | {np.median(g):.3f} | {g.max():.3f} | {(g < gain).sum()}"
        print(f"| {name} | {g.size} | {row} |")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="+", choices=("aligned", "2d", "3d", "gains"))
    parser.add_argument("--work", type=Path, required=True, help="scratch folder")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    for group in args.groups:
        print(f"### {group}\n")
        {"aligned": aligned, "2d": two_d, "3d": three_d, "gains": gains}[group](args.work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
