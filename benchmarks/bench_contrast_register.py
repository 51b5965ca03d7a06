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
* ``mind``: the refinement's similarity on synthetic 3D T2 -> T1 pairs (IXI012 -> IXI239,
  IXI162 -> IXI174) and IXI012's T2 to its own T1: ``--mind`` variants, each
  ``NAME[:RADIUS:DILATION[:WEIGHT]][@STEPS]`` (steps: default the model's) with NAME ``ncc``
  (the default ``register``), ``mind`` (``--refine-sim mind``: MIND-SSC on the remapped
  image), ``mind-read`` (a probe: the network
  sees the remapped image, refinement MIND-SSC on the moving image as read, patched into
  :mod:`hyperreg.registration.passes`), ``t1`` (the T1 itself) or ``t1-drawn`` (a T1 drawn
  from the labels as the T2 is, :func:`bench_contrast.synthetic_t2_3d` with ``classes=None``).
* ``gains``: every ordered multicontrast-2d T2 -> T1 pair (8 of one person, 56 of two): by how
  much the network's field raises the verdict's similarity for other contrasts (normalised
  gradient fields) over the best of the pair as it came and the affine alone, at the λ
  ``register`` uses; the share :data:`hyperreg.registration.verdict.MIN_GAINS` was set on it.

Synthetic images are written to ``--work`` (a scratch folder, never the repository).
Usage: ``python benchmarks/bench_contrast_register.py --work /tmp/contrast aligned 2d 3d gains``;
``... --work /tmp/contrast mind --mind ncc mind:1:2 mind-read:1:2``.
"""

from __future__ import annotations

import argparse
import functools
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
from bench_contrast import T2_CLASSES as T2C

import hyperreg.method.mind as mind_module
import hyperreg.method.objective as objective_module
import hyperreg.registration.engine as engine_module
import hyperreg.registration.passes as passes_module
from hyperreg.apps.models import resolve_model
from hyperreg.registration.defaults import DefaultSteps, model_default_lambda
from hyperreg.apps.register import register_files
from hyperreg.registration.contrast import contrast_lambda, contrast_similarity
from hyperreg.registration.pairs import network_inputs
from hyperreg.registration.pipeline import load_pair
from hyperreg.registration.prepared import PreparedPair
from hyperreg.registration.refine import Refinement
from hyperreg.registration.verdict import MIN_GAINS


def run(
    model, moving, fixed, contrast, work: Path, refine=None, **segs
) -> tuple[float, float, object, float]:
    """``(mean |u|, 95th percentile |u|, Dice, CPU seconds)`` of one default registration;
    ``run.kept`` is what its verdict kept."""
    warp = work / "warp.nii.gz"
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = register_files(
            model, moving, fixed, warp_out=warp, contrast=contrast, refine=refine, **segs
        )
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


IXI_PAIRS = {
    "IXI012 -> IXI239": ("IXI012-HH-1211", "IXI239-HH-2296"),
    "IXI162 -> IXI174": ("IXI162-HH-1548", "IXI174-HH-1571"),
    "IXI012 T2 -> own T1": ("IXI012-HH-1211", "IXI012-HH-1211"),
}


def set_mind(radius: int, dilation: int, weight: float) -> None:
    """The objective's MIND-SSC with ``radius``, ``dilation`` and the loss times ``weight``."""
    objective_module.mind_ssc = functools.partial(
        mind_module.mind_ssc, radius=radius, dilation=dilation
    )

    def loss(*args, **keywords):
        keywords.update(radius=radius, dilation=dilation)
        return weight * mind_module.mind_loss(*args, **keywords)

    objective_module.mind_loss = loss


def read_image_passes(model, moving, fixed, lam, passes, refinement, **keywords):
    """``register_passes`` whose refinement warps the moving image as read
    (``read_image_passes.aligned``) while every network pass sees ``moving`` (the remapped
    image): the network's flow of the last pass is the refinement's start."""
    device = next(model.parameters()).device
    read, _, _ = network_inputs(
        model, read_image_passes.aligned, fixed, keywords.get("normalization"), device, []
    )
    total, original_call, original_refine = [None], type(model).__call__, passes_module.refine_flow

    def call(self, *args, **kw):  # the composed field of the passes so far
        out = original_call(self, *args, **kw)
        total[0] = (
            out.disp
            if total[0] is None
            else passes_module.compose_displacements(total[0], out.disp)
        )
        return out

    def refine_flow(model_, current, fixed_t, lam_, refinement_, masks=None):
        flow = model_.predict_flow(current, fixed_t, lam_)
        source = read if total[0] is None else passes_module.warp(read, total[0])
        return original_refine(model_, source, fixed_t, lam_, refinement_, flow=flow, masks=masks)

    type(model).__call__, passes_module.refine_flow = call, refine_flow
    try:
        return passes_module.register_passes(
            model, moving, fixed, lam, passes, refinement, **keywords
        )
    finally:
        type(model).__call__, passes_module.refine_flow = original_call, original_refine


def mind_variant(model, variant: str, moving, fixed, work: Path, segs) -> tuple:
    """One row of the ``mind`` group: ``(mean |u|, p95 |u|, Dice, CPU s, kept)``."""
    variant, _, steps = variant.partition("@")
    name, *numbers = variant.split(":")
    radius, dilation, *weight = numbers or (mind_module.MIND_RADIUS, mind_module.MIND_DILATION)
    set_mind(int(radius), int(dilation), float(weight[0]) if weight else 1.0)
    sim = "mind" if name.startswith("mind") else None
    refine = Refinement(steps=int(steps), sim=sim) if steps else DefaultSteps(sim=sim)
    network_image = PreparedPair.network_image
    if name == "mind-read":

        def spy(pair):
            read_image_passes.aligned = pair.aligned
            return network_image(pair)

        PreparedPair.network_image, engine_module.register_passes = spy, read_image_passes
    try:
        found = run(model, moving, fixed, "auto", work, refine, **segs)
    finally:
        PreparedPair.network_image = network_image
        engine_module.register_passes = passes_module.register_passes
    return (*found, run.kept)


def mind(work: Path, variants: Sequence[str]) -> None:
    ixi = DATA_ROOT / "ixi-2mm"
    model = resolve_model(None, image=ixi / "IXI012-HH-1211_T1.nii.gz").model
    print("| pair | moving | refinement | Dice | kept | mean / p95 abs u (voxels) | CPU s |")
    print("|---|---|---|---|---|---|---|")
    for title, (a, b) in IXI_PAIRS.items():
        segs = {} if a == b else dict(
            moving_seg=ixi / f"{a}_DLMUSE.nii.gz", fixed_seg=ixi / f"{b}_DLMUSE.nii.gz"
        )  # fmt: skip
        t1 = np.asarray(nib.load(ixi / f"{a}_T1.nii.gz").dataobj, dtype=np.float32)
        labels = np.asarray(nib.load(ixi / f"{a}_DLMUSE.nii.gz").dataobj)
        for variant in variants:
            name = variant.split(":")[0].split("@")[0]
            if name.startswith("t1") and a == b:
                continue
            moving = ixi / f"{a}_T1.nii.gz"
            if name != "t1":
                drawn = synthetic_t2_3d(t1, labels, classes=None if name == "t1-drawn" else T2C)
                moving = save_like(work / f"{a}_{name}.nii.gz", drawn, ixi / f"{a}_T1.nii.gz")
            mean, p95, dice, seconds, kept = mind_variant(
                model, variant, moving, ixi / f"{b}_T1.nii.gz", work, segs
            )
            shown = "-" if dice is None else f"{dice:.4f}"
            kind = {"t1": "T1", "t1-drawn": "T1 drawn from labels"}.get(name, "synthetic T2")
            print(f"| {title} | {kind} | {variant} | {shown} | {kept} | {mean:.2f} / {p95:.1f} "
                  f"| {seconds:.0f} |", flush=True)  # fmt: skip
            log(title, variant, dice)
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="+", choices=("aligned", "2d", "3d", "gains", "mind"))
    parser.add_argument("--work", type=Path, required=True, help="scratch folder")
    parser.add_argument(
        "--mind", nargs="+", default=["ncc", "mind:1:2", "mind-read:1:2"], help="mind variants"
    )
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    for group in args.groups:
        print(f"### {group}\n")
        if group == "mind":
            mind(args.work, args.mind)
            continue
        {"aligned": aligned, "2d": two_d, "3d": three_d, "gains": gains}[group](args.work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
