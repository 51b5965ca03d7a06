"""Trust on every pair: the never-worse rule and the verdict on identical, re-stored, normal pairs.

Measures, through :func:`hyperreg.registration.pipeline.load_pair` and
:meth:`~hyperreg.registration.pipeline.PreparedPair.register` (the path every command runs):

* ``2d``: a neurite-oasis slice registered to itself and to a copy stored flipped (axis 0
  reversed, affine adjusted: the same image in world space), with ``--refine 0`` and
  ``--refine 30``, with the rule on and off: mean Dice, mean/max displacement (voxels), the
  similarities before / after the affine / registered and the verdict.
* ``margin``: mindboggle-trt20-2d slice pairs of different people, λ in a grid, rule off: the
  relative change of the similarity ``(after - best) / |best|`` (what the margin must stay below
  for normal pairs) beside the same change for identical pairs.
* ``3d``: an IXI head at 2 mm registered to itself and to its copy stored LIA (against RAS),
  ``--refine 0`` and the model's default; and held-out IXI pairs (DLMUSE labels) with the
  model's default λ and refinement: the verdict, what was kept and Dice.

stdout: Markdown tables; progress on stderr. Times are those of a shared machine.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log, table

DATA = [DATA_ROOT]  # --data replaces it

IXI_PAIRS = (
    ("IXI012-HH-1211", "IXI239-HH-2296"),
    ("IXI239-HH-2296", "IXI338-HH-1971"),
    ("IXI338-HH-1971", "IXI405-HH-2052"),
)


def _restored(volume, order: str):
    """``volume`` stored with axis codes ``order`` (e.g. ``"LIA"``), same world image."""
    import nibabel as nib

    from hyperreg.geometry.io import Volume

    data = volume.data if volume.ndim == 3 else volume.data[..., None]
    start = nib.orientations.io_orientation(volume.affine)
    target = nib.orientations.axcodes2ornt(tuple(order))
    transform = nib.orientations.ornt_transform(start, target)
    if volume.ndim == 2:  # keep the slice axis last
        transform[2] = [2, 1]
    moved = nib.orientations.apply_orientation(data, transform)
    affine = volume.affine @ nib.orientations.inv_ornt_aff(transform, data.shape)
    moved = np.ascontiguousarray(moved if volume.ndim == 3 else moved[..., 0])
    return Volume(data=moved, affine=affine, disk_shape=moved.shape + (1,) * (3 - moved.ndim))


def _flipped_2d(volume):
    """A 2D slice with axis 0 reversed and its affine adjusted (same world image)."""
    from hyperreg.geometry.io import Volume

    flip = np.eye(4)
    flip[0, 0], flip[0, 3] = -1, volume.data.shape[0] - 1
    data = np.ascontiguousarray(volume.data[::-1])
    return Volume(data=data, affine=volume.affine @ flip, disk_shape=volume.disk_shape)


def _row(name, setting, result):
    v = result.verdict
    size = np.sqrt((result.disp**2).sum(0))
    dice = "" if result.mean_dice is None else f"{result.mean_dice:.4f}"
    return [
        name,
        setting,
        dice,
        f"{size.mean():.3f}",
        f"{size.max():.2f}",
        f"{v.similarity_before:.4f}",
        f"{v.similarity_affine:.4f}",
        f"{v.similarity_after:.4f}",
        v.kept,
        v.text,
    ]


HEADER = [
    "pair",
    "setting",
    "mean Dice",
    "mean disp (vox)",
    "max disp",
    "sim before",
    "sim affine",
    "sim registered",
    "kept",
    "verdict",
]


def _run(pair, model, lam, refine, never_worse):
    tic = time.perf_counter()
    result = pair.register(model, [lam], refine, never_worse=never_worse)[0]
    return result, time.perf_counter() - tic


def section_2d(lam: float) -> None:
    import hyperreg
    from hyperreg.geometry.io import load_volume
    from hyperreg.registration.pipeline import load_pair
    from hyperreg.registration.refine import Refinement

    model = hyperreg.load_pretrained(ndim=2)
    rows = []
    for person in ("OASIS_OAS1_0001_MR1", "OASIS_OAS1_0002_MR1"):
        root = DATA[0] / "neurite-oasis" / person
        image = load_volume(root / "slice_norm.nii.gz")
        seg = load_volume(root / "slice_seg24.nii.gz", label=True)
        cases = {
            "identical": (image, seg),
            "flipped copy": (_flipped_2d(image), _flipped_2d(seg)),
        }
        for case, (moving, moving_seg) in cases.items():
            pair = load_pair(moving, image, model=model, moving_seg=moving_seg, fixed_seg=seg)
            for steps in (0, 30):
                for rule in (False, True):
                    result, seconds = _run(pair, model, lam, Refinement(steps=steps), rule)
                    setting = f"refine {steps}, rule {'on' if rule else 'off'}"
                    rows.append(_row(f"{person[6:15]} {case}", setting, result))
                    log(rows[-1], f"{seconds:.1f} s")
    print(f"### 2D slices (bundled 2D model, λ {lam:g}, init affine)\n")
    print(table(HEADER, rows) + "\n")


def _shift_changes(model, path, shifts) -> list[str]:
    """Relative change of the model's similarity of ``path`` against itself resampled shifted by
    each of ``shifts`` voxels along both axes (border values beyond the edge)."""
    import torch

    from hyperreg.geometry.io import load_volume
    from hyperreg.method.spatial import warp
    from hyperreg.registration.similarity import (
        network_input,
        network_similarity,
        on_fixed_grid,
    )

    image = load_volume(path)
    data = torch.from_numpy(image.data.astype(np.float32))[None, None]
    volumes = [image]
    for shift in shifts:
        disp = torch.full((1, 2, *image.data.shape), float(shift))
        moved = warp(data, disp, padding="border")[0, 0].numpy()
        volumes.append(on_fixed_grid(moved, image, image))
    fixed = network_input(model, image, image, "minmax")
    scores = [
        network_similarity(model.objective, network_input(model, v, image, "minmax"), fixed)
        for v in volumes
    ]
    return [f"{(x - scores[0]) / abs(scores[0]):+.4f}" for x in scores[1:]]


def section_margin(lams: list[float], count: int) -> None:
    import hyperreg
    from hyperreg.registration.pipeline import load_pair

    model = hyperreg.load_pretrained(ndim=2)
    root = DATA[0] / "mindboggle-trt20-2d"
    people = sorted(p.name for p in root.iterdir() if p.is_dir())[: count + 1]
    images = {p: next((root / p).glob(f"{p}_slice*.nii.gz")) for p in people}
    changes: dict[str, list[float]] = {"different people": [], "identical": []}
    rows = []
    for moving, fixed in [*itertools.pairwise(people), *((p, p) for p in people[:count])]:
        kind = "identical" if moving == fixed else "different people"
        pair = load_pair(images[moving], images[fixed], model=model)
        results = pair.register(model, lams, None, never_worse=False)
        for lam, result in zip(lams, results):
            v = result.verdict
            best = np.nanmax([v.similarity_before, v.similarity_affine])
            change = (v.similarity_after - best) / abs(best)
            changes[kind].append(change)
            rows.append([f"{moving} -> {fixed}", f"{lam:g}", f"{best:.4f}", f"{change:+.4f}"])
        log(rows[-1])
    shifts = (0.05, 0.1, 0.25)
    shift_rows = [[p, *_shift_changes(model, images[p], shifts)] for p in people[:count]]
    print("### Similarity change of a slice resampled shifted along both axes (no registration)\n")
    header = ["slice", *(f"shift {s:g} voxel" for s in shifts)]
    print(table(header, shift_rows) + "\n")
    print(f"### Similarity change (registered vs best of before/affine), λ {lams}\n")
    print(table(["pair", "λ", "best before/affine", "relative change"], rows) + "\n")
    for kind, values in changes.items():
        print(
            f"- {kind}: {len(values)} registrations, relative change min {min(values):+.4f}, "
            f"max {max(values):+.4f}"
        )
    print()


def section_3d(heldout: int, restored: bool) -> None:
    import hyperreg
    from hyperreg.apps.models import model_default_lambda, pair_refinement
    from hyperreg.geometry.io import load_volume
    from hyperreg.registration.pipeline import load_pair
    from hyperreg.registration.refine import Refinement

    model = hyperreg.load_pretrained(ndim=3)
    lam = model_default_lambda(model).lam
    default = pair_refinement(model, None)
    root = DATA[0] / "ixi-2mm"
    rows = []
    if restored:
        person = "IXI012-HH-1211"
        image = load_volume(root / f"{person}_T1.nii.gz")
        seg = load_volume(root / f"{person}_DLMUSE.nii.gz", label=True)
        ras, ras_seg = _restored(image, "RAS"), _restored(seg, "RAS")
        lia, lia_seg = _restored(image, "LIA"), _restored(seg, "LIA")
        cases = {"identical": (image, seg, image, seg), "LIA vs RAS": (lia, lia_seg, ras, ras_seg)}
        for case, (moving, moving_seg, fixed, fixed_seg) in cases.items():
            pair = load_pair(moving, fixed, model=model, moving_seg=moving_seg, fixed_seg=fixed_seg)
            for refine, label in ((Refinement(steps=0), "refine 0"), (default, "default")):
                for rule in (True, False):  # off only where on changed the result
                    result, seconds = _run(pair, model, lam, refine, rule)
                    setting = f"{label}, rule {'on' if rule else 'off'}"
                    rows.append(_row(f"{person} {case}", setting, result) + [f"{seconds:.0f}"])
                    log(rows[-1])
                    if result.verdict.kept == "registered":
                        break
    for moving, fixed in IXI_PAIRS[:heldout]:
        pair = load_pair(
            root / f"{moving}_T1.nii.gz",
            root / f"{fixed}_T1.nii.gz",
            model=model,
            moving_seg=root / f"{moving}_DLMUSE.nii.gz",
            fixed_seg=root / f"{fixed}_DLMUSE.nii.gz",
        )
        result, seconds = _run(pair, model, lam, default, True)
        rows.append(_row(f"{moving} -> {fixed}", "default, rule on", result) + [f"{seconds:.0f}"])
        log(rows[-1])
    steps = default.steps if default is not None else 0
    print(f"### 3D IXI at 2 mm (bundled 3D model, λ {lam:g}; default: refine {steps})\n")
    print(table([*HEADER, "seconds (shared machine)"], rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="+", choices=("2d", "margin", "3d"))
    parser.add_argument("--lambda", dest="lam", type=float, default=0.1, help="2D λ")
    parser.add_argument("--margin-lambdas", default="0,0.1,0.3,0.6,1")
    parser.add_argument("--margin-pairs", type=int, default=5)
    parser.add_argument("--heldout", type=int, default=2, help="3D held-out pairs (0-3)")
    parser.add_argument("--no-restored", action="store_true", help="3D: skip identical/LIA")
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="the shared data folder")
    args = parser.parse_args(argv)
    DATA[0] = args.data
    logging.basicConfig(level=logging.ERROR)
    import torch

    torch.set_num_threads(1)
    if "2d" in args.sections:
        section_2d(args.lam)
    if "margin" in args.sections:
        lams = [float(x) for x in args.margin_lambdas.split(",")]
        section_margin(lams, args.margin_pairs)
    if "3d" in args.sections:
        section_3d(args.heldout, not args.no_restored)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
