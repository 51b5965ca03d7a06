"""Where the seconds go (issue 22): the affine stage, the network, coarse-to-fine refinement and
one 3D ``register --refine`` end to end through the library, stage by stage.

Parts, one run:

1. The affine stage alone (:func:`hyperreg.geometry.affine.register_affine`) on the FreeSurfer
   native 256³ pair (``oasis1-freesurfer`` OAS1_0002 ``norm.mgz`` -> OAS1_0001, aseg Dice of the
   affine alone) and on the already aligned 160×192×224 neurite-oasis pair (identity kept?).
2. One 3D ``register --refine`` equivalent on the native pair with the bundled 3D model at
   ``--lambda``: load, affine, preparation (resampling, baselines), network, refinement,
   chain sampling (field to the fixed grid, moved image and label map through affine + field,
   composed field, Dice), writing; each stage timed.
3. With ``--old-refine``: today's refinement for comparison (fine level only, fixed 100 steps,
   no early stop, no foreground box) on the same prepared pair.
4. A refined 2D pair (bundled 2D model, neurite-oasis slices) end to end.
5. ANTs (antspyx) ``Affine`` and ``SyN`` on the native pair when importable; otherwise a note.

Dice: mean over the labels of both inputs, an erased label counting 0 (hyperreg's one
convention, :func:`hyperreg.method.metrics.registration_dice`); for the native pair every aseg
label is present in both maps, so this equals the mean over the labels present in both that
earlier results (``RESULTS_native.md``, ``RESULTS_3d.md``) report.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/bench_speed.py [--threads 1] [--old-refine]
[--write benchmarks/RESULTS_speed.md]``; stdout is the Markdown section, progress on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log, table, verdict


class _Clock:
    """Seconds per named stage; ``wrap`` times every call of a function under a stage name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def wrap(self, stage: str, fn):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            tic = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(stage, time.perf_counter() - tic)

        return timed


def _affine_rows(root: Path, seed: int) -> list[list[str]]:
    from hyperreg.geometry.affine import register_affine
    from hyperreg.geometry.io import load_volume
    from hyperreg.method.metrics import registration_dice
    from hyperreg.registration.chain import sample_volume

    rows = []
    native = root / "oasis1-freesurfer"
    moving = load_volume(native / "OAS1_0002_MR1" / "norm.mgz")
    fixed = load_volume(native / "OAS1_0001_MR1" / "norm.mgz")
    mseg = load_volume(native / "OAS1_0002_MR1" / "aseg.mgz", label=True)
    fseg = load_volume(native / "OAS1_0001_MR1" / "aseg.mgz", label=True)
    log("affine stage: native pair ...")
    t = register_affine(moving, fixed, "affine", seed=seed)
    moved = sample_volume(mseg, t, None, fixed, label=True).data
    dice = float(np.mean(list(registration_dice(moved, fseg.data, mseg.data).values())))
    rows.append(
        [
            "native 256³ (OAS1_0002 -> OAS1_0001 norm.mgz)",
            f"{t.seconds:.2f}",
            f"{dice:.4f}",
            "applied",
            "≤ 10 s",
            verdict(t.seconds <= 10),
        ]
    )
    aligned = root / "neurite-oasis"
    a = load_volume(aligned / "OASIS_OAS1_0002_MR1" / "aligned_norm.nii.gz")
    b = load_volume(aligned / "OASIS_OAS1_0001_MR1" / "aligned_norm.nii.gz")
    log("affine stage: aligned pair ...")
    t = register_affine(a, b, "affine", seed=seed)
    kept = "identity kept" if np.array_equal(t.matrix, np.eye(4)) else "applied"
    rows.append(
        [
            "aligned 160×192×224 (neurite-oasis)",
            f"{t.seconds:.2f}",
            "-",
            kept,
            "≤ 2 s",
            verdict(t.seconds <= 2),
        ]
    )
    return rows


def _describe(steps: int | None) -> str:
    """The refinement a run used, in words (the library default unless ``--steps``)."""
    from hyperreg.registration.refine import Refinement

    r = Refinement() if steps is None else Refinement(steps=steps)
    kind = "default Refinement" if steps is None else f"Refinement(steps={steps})"
    return f"{kind}: ≤ {r.steps} steps, lr {r.lr:g}, levels {r.levels}"


def _end_to_end(root: Path, lam: float, steps: int | None, old: bool) -> tuple[list, list, dict]:
    import hyperreg.registration.passes as passes
    import hyperreg.registration.pipeline as pipeline
    import hyperreg.registration.prepared as prepared
    import hyperreg.registration.refine as refine
    import hyperreg.registration.refine_levels as refine_levels
    from hyperreg import load_pretrained
    from hyperreg.geometry.affine import register_affine
    from hyperreg.apps.register import write_result
    from hyperreg.geometry.io import load_volume
    from hyperreg.registration.refine import Refinement

    native = root / "oasis1-freesurfer"
    clock = _Clock()
    model = load_pretrained(ndim=3)
    model.predict_flow = clock.wrap("network", model.predict_flow)  # type: ignore[method-assign]
    # the first of the model's passes runs forward() (it does not call predict_flow)
    model.forward = clock.wrap("network", model.forward)  # type: ignore[method-assign]
    total = time.perf_counter()
    tic = time.perf_counter()
    moving = load_volume(native / "OAS1_0002_MR1" / "norm.mgz")
    fixed = load_volume(native / "OAS1_0001_MR1" / "norm.mgz")
    mseg = load_volume(native / "OAS1_0002_MR1" / "aseg.mgz", label=True)
    fseg = load_volume(native / "OAS1_0001_MR1" / "aseg.mgz", label=True)
    clock.add("load (4 MGZ files)", time.perf_counter() - tic)
    tic = time.perf_counter()
    transform = register_affine(moving, fixed, "affine")
    clock.add("affine stage", time.perf_counter() - tic)
    tic = time.perf_counter()
    pair = pipeline.load_pair(
        moving,
        fixed,
        model=model,
        moving_seg=mseg,
        fixed_seg=fseg,
        init="none",
        initial_affine=transform,
    )
    clock.add("prepare (resample through the affine, baselines)", time.perf_counter() - tic)
    shared = {
        "refine_flow": "refine_flow",
        "network_inputs": "network inputs (resample to 2 mm)",
        "result_from_output": "field to the fixed grid, warp, folding",
    }
    # the model's network passes (register_passes) import these names from refine; the
    # chain and Dice of PreparedPair.register are looked up in registration.prepared
    originals = {
        (module, name): stage for module in (refine, passes) for name, stage in shared.items()
    }
    originals |= {
        (prepared, "sample_volume"): "chain: moved image and label map",
        (prepared, "composed_displacement"): "chain: composed field",
        (prepared, "registration_dice"): "Dice",
    }
    saved = {key: getattr(*key) for key in originals}
    for (module, name), stage in originals.items():
        setattr(module, name, clock.wrap(stage, saved[(module, name)]))
    try:
        refinement = Refinement() if steps is None else Refinement(steps=steps)
        log(f"end to end: register at λ {lam} with {refinement} ...")
        result = pair.register(model, [lam], refinement)[0]
        with tempfile.TemporaryDirectory() as tmp:
            tic = time.perf_counter()
            write_result(  # as `register` writes them (side by side, one thread per core)
                result,
                pair,
                moved=Path(tmp) / "moved.nii.gz",
                moved_seg=Path(tmp) / "moved_seg.nii.gz",
                warp_out=Path(tmp) / "warp.nii.gz",
            )
            clock.add("write (moved, moved label map, warp)", time.perf_counter() - tic)
        wall = time.perf_counter() - total
        old_row = None
        if old:
            log("today's refinement (fine level, 100 fixed steps, whole grid) ...")
            patience, box = refine_levels._PATIENCE, refine.foreground_box
            refine_levels._PATIENCE = 10**9
            refine.foreground_box = lambda model, m, f, w: refine_levels.LossBox(  # type: ignore[assignment]
                (slice(None),) * (m.ndim - 2), (slice(None),) * (m.ndim - 2)
            )
            before = dict(clock.seconds)
            try:
                old_result = pair.register(model, [lam], Refinement(steps=100, levels=1))[0]
            finally:
                refine_levels._PATIENCE, refine.foreground_box = patience, box
            old_row = (old_result, clock.seconds["refine_flow"] - before["refine_flow"])
            clock.seconds = before
    finally:
        for (module, name), fn in saved.items():
            setattr(module, name, fn)
    stages = dict(clock.seconds)
    network = stages.pop("network", 0.0)
    refine_total = stages.pop("refine_flow", 0.0)
    order = [
        "load (4 MGZ files)",
        "affine stage",
        "prepare (resample through the affine, baselines)",
        "network inputs (resample to 2 mm)",
    ]
    rows = [[name, f"{stages.pop(name, 0.0):.2f}"] for name in order]
    rows.append(["network (U-Net at λ)", f"{network:.2f}"])
    stats = result.refinement
    rows.append(
        [
            f"refinement ({_describe(steps)}, early stop, foreground box)"
            + (f": loss {stats.loss_before:.4f} -> {stats.loss_after:.4f}" if stats else ""),
            f"{refine_total - network:.2f}",
        ]
    )
    rows += [[name, f"{seconds:.2f}"] for name, seconds in stages.items()]
    rows.append(["**total (wall)**", f"**{wall:.2f}**"])
    accounted = sum(float(r[1].strip("*")) for r in rows[:-1])
    rows.append(["(not in a stage above: PairResult, checks)", f"{wall - accounted:.2f}"])
    summary = {
        "wall": wall,
        "refine": refine_total - network,
        "network": network,
        "dice": result.mean_dice,
        "dice_affine": pair.dice_affine,
        "dice_before": pair.dice_before,
        "folding": result.folding_fraction,
    }
    quality = [
        ["no registration (headers)", f"{pair.dice_before:.4f}", "-", "-"],
        ["affine alone", f"{pair.dice_affine:.4f}", "-", f"{transform.seconds:.1f}"],
        [
            f"affine + network + refinement ({_describe(steps)})",
            f"{result.mean_dice:.4f}",
            f"{100 * result.folding_fraction:.3f}",
            f"{refine_total - network:.1f} (refinement)",
        ],
    ]
    if old_row is not None:
        old_result, seconds = old_row
        network_share = network  # one more network pass inside; counted in seconds
        quality.append(
            [
                "affine + network + today's refinement (100 steps, fine grid)",
                f"{old_result.mean_dice:.4f}",
                f"{100 * old_result.folding_fraction:.3f}",
                f"{seconds - network_share:.1f} (refinement)",
            ]
        )
    return rows, quality, summary


def _ants_syn(root: Path) -> tuple[float, float]:
    """ANTs ``SyN`` (antspyx ``type_of_transform="SyN"``: affine + SyN, its defaults) on the
    native pair: ``(seconds of ants.registration, mean aseg Dice)``
    with hyperreg's Dice convention."""
    import ants

    from hyperreg.geometry.io import load_volume
    from hyperreg.method.metrics import registration_dice

    native = root / "oasis1-freesurfer"
    fixed_p, moving_p = native / "OAS1_0001_MR1" / "norm.mgz", native / "OAS1_0002_MR1" / "norm.mgz"
    fixed, moving = ants.image_read(str(fixed_p)), ants.image_read(str(moving_p))
    log("ANTs SyN on the native pair ...")
    tic = time.perf_counter()
    reg = ants.registration(fixed, moving, type_of_transform="SyN")
    seconds = time.perf_counter() - tic
    moved = ants.apply_transforms(
        fixed,
        ants.image_read(str(native / "OAS1_0002_MR1" / "aseg.mgz")),
        reg["fwdtransforms"],
        interpolator="genericLabel",
    )
    fseg = load_volume(native / "OAS1_0001_MR1" / "aseg.mgz", label=True).data
    mseg = load_volume(native / "OAS1_0002_MR1" / "aseg.mgz", label=True).data
    dice = registration_dice(np.rint(moved.numpy()).astype(np.int32), fseg, mseg)
    return seconds, float(np.mean(list(dice.values())))


def _two_d(root: Path, lam: float, steps: int | None) -> list[list[str]]:
    from hyperreg import load_pretrained
    from hyperreg.registration.pipeline import load_pair
    from hyperreg.registration.refine import Refinement

    folder = root / "neurite-oasis"
    model = load_pretrained(ndim=2)
    files = {
        k: folder / f"OASIS_OAS1_000{n}_MR1" / name
        for k, n, name in (
            ("moving", 2, "slice_norm.nii.gz"),
            ("fixed", 1, "slice_norm.nii.gz"),
            ("moving_seg", 2, "slice_seg24.nii.gz"),
            ("fixed_seg", 1, "slice_seg24.nii.gz"),
        )
    }
    rows = []
    for label, refinement in (
        ("network only", None),
        (
            f"refined ({_describe(steps)})",
            Refinement() if steps is None else Refinement(steps=steps),
        ),
    ):
        load_pair(files["moving"], files["fixed"], model=model)  # warm-up (weights, caches)
        tic = time.perf_counter()
        pair = load_pair(
            files["moving"],
            files["fixed"],
            model=model,
            moving_seg=files["moving_seg"],
            fixed_seg=files["fixed_seg"],
        )
        result = pair.register(model, [lam], refinement)[0]
        seconds = time.perf_counter() - tic
        rows.append(
            [
                label,
                f"{result.mean_dice:.4f}",
                f"{seconds:.2f}",
                "≤ 1 s" if refinement else "-",
                verdict(seconds <= 1) if refinement else "-",
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared/data folder")
    parser.add_argument("--lambda", dest="lam", type=float, default=0.1)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="refinement steps per level (default: the library's Refinement() as it is)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch and ITK threads")
    parser.add_argument("--old-refine", action="store_true", help="also today's refinement")
    parser.add_argument("--write", type=Path, default=None, help="also write the section here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ants", action="store_true", help="also ANTs SyN on the native pair (about 100 s)"
    )
    args = parser.parse_args(argv)
    os.environ["ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS"] = str(args.threads)  # before ants loads
    import SimpleITK as sitk
    import torch

    torch.set_num_threads(args.threads)
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(args.threads)
    load_before = os.getloadavg()
    affine_rows = _affine_rows(args.data, args.seed)
    stages, quality, summary = _end_to_end(args.data, args.lam, args.steps, args.old_refine)
    two_d = _two_d(args.data, args.lam, args.steps)
    syn = _ants_syn(args.data) if args.ants else None
    load_after = os.getloadavg()
    command = "OMP_NUM_THREADS=1 python benchmarks/bench_speed.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    out = [
        "# Where the seconds go: affine stage, network, coarse-to-fine refinement (issue 22)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} CPU cores, {platform.python_version()}, torch "
        f"{torch.__version__}, SimpleITK {sitk.Version.VersionString()}; torch and ITK at "
        f"{args.threads} thread(s). **Load:** 1-minute load average {load_before[0]:.1f} before "
        f"and {load_after[0]:.1f} after (what ran beside it is said wherever these numbers are "
        "quoted).",
        "",
        "## The affine stage alone",
        "",
        table(
            ["pair", "seconds", "Dice (affine alone, aseg)", "result", "target", ""], affine_rows
        ),
        "",
        f"## One 3D `register --refine` through the library, native 256³ pair, λ {args.lam:g}",
        "",
        table(["stage", "seconds"], stages),
        "",
        table(["result", "mean Dice (aseg)", "folding %", "seconds"], quality),
        "",
        f"End to end {summary['wall']:.1f} s (target ≤ 30 s: {verdict(summary['wall'] <= 30)}); "
        f"refinement alone {summary['refine']:.1f} s (target ≤ 15 s: "
        f"{verdict(summary['refine'] <= 15)}).",
        "",
        f"## A refined 2D pair (bundled 2D model, neurite-oasis slices, λ {args.lam:g})",
        "",
        table(
            [
                "registration",
                "mean Dice (seg24)",
                "seconds (load, affine, network, refinement, chain)",
                "target",
                "",
            ],
            two_d,
        ),
        "",
        "## ANTs side by side",
        "",
    ]
    if syn is not None:
        seconds, dice = syn
        ratio = summary["wall"] / seconds
        out += [
            table(
                ["method (native 256³ pair)", "mean Dice (aseg)", "seconds", "hyperreg / ANTs"],
                [
                    [
                        "ANTs SyN (antspyx `SyN`: affine + SyN, its defaults)",
                        f"{dice:.4f}",
                        f"{seconds:.1f}",
                        "-",
                    ],
                    [
                        "hyperreg `register --refine` end to end (above)",
                        f"{summary['dice']:.4f}",
                        f"{summary['wall']:.1f}",
                        f"{ratio:.2f}",
                    ],
                ],
            ),
            "",
            f"ANTs ran in this run at {args.threads} thread(s) (ITK), on the same pair. hyperreg "
            f"end to end is {ratio:.2f} × ANTs SyN's registration time (target ≤ 1/3: "
            f"{verdict(ratio <= 1 / 3)}; ANTs' time excludes reading and writing).",
        ]
    elif importlib.util.find_spec("ants") is None:
        out.append("antspyx is not importable here, so ANTs was not run in this benchmark.")
    else:
        out.append("ANTs was not run in this benchmark (`--ants` runs SyN on the same pair).")
    text = "\n".join(out) + "\n"
    print(text)
    if args.write is not None:
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
