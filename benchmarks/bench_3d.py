"""3D: the bundled 3D model beside ANTs on the OASIS volume pair, side by side in one run.

Two parts:

1. ``neurite-oasis`` OAS1_0002 ``aligned_norm`` -> OAS1_0001 (both already in one affine template
   space, 160 × 192 × 224 at 1 mm): mean Dice over the seg35 labels of both input maps (an erased
   label counts 0), folding (% of voxels with J ≤ 0) and wall time, for no registration, hyperreg
   at every λ of ``--lambdas`` (one batched pass, :func:`hyperreg.apps.sweep.sweep_lambdas`; the
   model runs at its own voxel size and the field comes back to the 1 mm grid), hyperreg with
   test-time refinement (``--refine-steps``) at λ*, ANTs ``SyNOnly`` with its default metric
   (Mattes MI) and, with ``--syn-cc``, ``syn_metric="CC"``. Label maps are warped with nearest
   neighbour (hyperreg) and ``genericLabel`` (ANTs).
2. With ``--native``: ``oasis1-freesurfer`` OAS1_0002 ``norm.mgz`` -> OAS1_0001 (native 256³
   spaces, not aligned): hyperreg's affine stage then the model at λ* (one chain,
   :func:`hyperreg.registration.pipeline.load_pair`) against ANTs ``SyN`` (affine + SyN),
   Dice over the labels of both input label maps (``registration_dice``).

λ* is the grid value with the best mean Dice on this same pair (an optimistic pick; the whole
grid is printed). The model card says which people trained the model: OAS1_0002 (the moving
person here) must not be among them.

    python benchmarks/bench_3d.py --model hyperreg/pretrained/hypermorph-3d.pt --refine-steps 100

Benchmark-only dependency: ``pip install -e ".[bench]"`` (antspyx).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log, table

from hyperreg.geometry.io import load_volume
from hyperreg.method.metrics import mean_registration_dice

LAMBDAS = (0.01, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7)


def _files(root: Path, native: bool) -> dict[str, Path]:
    if native:
        folder = root / "oasis1-freesurfer"
        m, f = folder / "OAS1_0002_MR1", folder / "OAS1_0001_MR1"
        return {
            "moving": m / "norm.mgz",
            "fixed": f / "norm.mgz",
            "moving_seg": m / "aseg.mgz",
            "fixed_seg": f / "aseg.mgz",
        }
    folder = root / "neurite-oasis"
    m, f = folder / "OASIS_OAS1_0002_MR1", folder / "OASIS_OAS1_0001_MR1"
    return {
        "moving": m / "aligned_norm.nii.gz",
        "fixed": f / "aligned_norm.nii.gz",
        "moving_seg": m / "aligned_seg35.nii.gz",
        "fixed_seg": f / "aligned_seg35.nii.gz",
    }


def _load(files: dict[str, Path]) -> dict:
    return {key: load_volume(path, label=key.endswith("seg")) for key, path in files.items()}


def ants_registration(files: dict[str, Path], kind: str, metric: str | None = None) -> dict:
    """antspyx ``registration`` of the pair's files: seconds, Dice (genericLabel), folding %."""
    import ants

    fixed, moving = ants.image_read(str(files["fixed"])), ants.image_read(str(files["moving"]))
    kwargs = {} if metric is None else {"syn_metric": metric}
    start = time.perf_counter()
    reg = ants.registration(fixed, moving, type_of_transform=kind, **kwargs)
    seconds = time.perf_counter() - start
    moved_seg = ants.apply_transforms(
        fixed,
        ants.image_read(str(files["moving_seg"])),
        reg["fwdtransforms"],
        interpolator="genericLabel",
    )
    fixed_seg = ants.image_read(str(files["fixed_seg"]))
    moving_seg = ants.image_read(str(files["moving_seg"]))
    dice = mean_registration_dice(
        np.rint(moved_seg.numpy()).astype(np.int32),
        np.rint(fixed_seg.numpy()).astype(np.int32),
        np.rint(moving_seg.numpy()).astype(np.int32),
    )
    warp = next(t for t in reg["fwdtransforms"] if t.endswith((".nii", ".nii.gz")))
    jacobian = ants.create_jacobian_determinant_image(fixed, warp).numpy()
    return {"seconds": seconds, "dice": dice, "folding": 100.0 * float((jacobian <= 0).mean())}


def _aligned(
    model,
    files: dict[str, Path],
    lambdas: Sequence[float],
    steps: int,
    refine_lam: float | None,
    syn_cc: bool,
    ants: bool = True,
) -> tuple[list[str], float]:
    from hyperreg.apps.sweep import sweep_lambdas
    from hyperreg.registration.refine import Refinement, refine_pair

    v = _load(files)
    segs = {"moving_seg": v["moving_seg"], "fixed_seg": v["fixed_seg"]}
    before = mean_registration_dice(v["moving_seg"].data, v["fixed_seg"].data)
    rows = [("no registration", f"{before:.4f}", "-", "-")]
    log("3D aligned: hyperreg sweep ...")
    start = time.perf_counter()
    results = sweep_lambdas(model, v["moving"], v["fixed"], lambdas, **segs)
    seconds = time.perf_counter() - start
    for r in results:
        fold = f"{100 * r.folding_fraction:.3f}"
        rows.append(
            (
                f"hyperreg λ={r.lam:g}",
                f"{r.mean_dice:.4f}",
                fold,
                f"{seconds / len(results):.1f} (mean of one batched pass)",
            )
        )
    best = max(results, key=lambda r: r.mean_dice)
    if steps > 0:
        lam = best.lam if refine_lam is None else refine_lam
        log(f"3D aligned: hyperreg refine {steps} steps at λ={lam:g} ...")
        start = time.perf_counter()
        refined = refine_pair(model, v["moving"], v["fixed"], lam, Refinement(steps=steps), **segs)
        rows.append(
            (
                f"hyperreg λ={lam:g} + refine {steps} steps",
                f"{refined.mean_dice:.4f}",
                f"{100 * refined.folding_fraction:.3f}",
                f"{time.perf_counter() - start:.1f}",
            )
        )
    if not ants:
        rows.append(("ANTs (--no-ants)", "not measured", "-", "-"))
    elif importlib.util.find_spec("ants") is None:
        rows.append(("ANTs (antspyx not installed)", "not measured", "-", "-"))
    else:
        for name, metric in [("ANTs SyNOnly (Mattes MI)", None)] + (
            [("ANTs SyNOnly (CC)", "CC")] if syn_cc else []
        ):
            log(f"3D aligned: {name} ...")
            out = ants_registration(files, "SyNOnly", metric)
            rows.append(
                (name, f"{out['dice']:.4f}", f"{out['folding']:.3f}", f"{out['seconds']:.1f}")
            )
    lines = [
        "### 3D aligned pair: OAS1_0002 -> OAS1_0001 (neurite-oasis, seg35, 1 mm)",
        "",
        table(["method", "mean Dice", "folding %", "wall time (s)"], rows),
    ]
    return lines, best.lam


def _native(model, files: dict[str, Path], lam: float, steps: int, syn: bool) -> list[str]:
    from hyperreg.registration.pipeline import load_pair
    from hyperreg.registration.refine import Refinement

    v = _load(files)
    segs = {"moving_seg": v["moving_seg"], "fixed_seg": v["fixed_seg"]}
    log("3D native: hyperreg affine + deformable ...")
    start = time.perf_counter()
    pair = load_pair(v["moving"], v["fixed"], model=model, init="affine", **segs)
    result = pair.register(model, [lam])[0]
    seconds = time.perf_counter() - start
    rows = [
        ("no registration (headers)", f"{result.dice_before:.4f}", "-", "-"),
        ("hyperreg affine", f"{result.dice_affine:.4f}", "0", f"{pair.transform.seconds:.1f}"),
        (
            f"hyperreg affine + λ={lam:g}",
            f"{result.mean_dice:.4f}",
            f"{100 * result.folding_fraction:.3f}",
            f"{seconds:.1f}",
        ),
    ]
    if steps > 0:
        log(f"3D native: hyperreg affine + refine {steps} steps ...")
        start = time.perf_counter()
        refined = pair.register(model, [lam], Refinement(steps=steps))[0]
        seconds = time.perf_counter() - start + pair.transform.seconds
        rows.append(
            (
                f"hyperreg affine + λ={lam:g} + refine {steps} steps",
                f"{refined.mean_dice:.4f}",
                f"{100 * refined.folding_fraction:.3f}",
                f"{seconds:.1f}",
            )
        )
    if syn and importlib.util.find_spec("ants") is not None:
        log("3D native: ANTs SyN (affine + SyN) ...")
        out = ants_registration(files, "SyN")
        rows.append(
            (
                "ANTs SyN (affine + SyN)",
                f"{out['dice']:.4f}",
                f"{out['folding']:.3f}",
                f"{out['seconds']:.1f}",
            )
        )
    else:
        rows.append(("ANTs SyN (affine + SyN)", "not measured (--native-syn)", "-", "-"))
    return [
        "### 3D native pair: OAS1_0002 norm.mgz -> OAS1_0001 norm.mgz (aseg)",
        "",
        table(["method", "mean Dice", "folding %", "wall time (s)"], rows),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="3D hyperreg checkpoint")
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared data folder")
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS))
    parser.add_argument("--refine-steps", type=int, default=0, help="test-time refinement (0: off)")
    parser.add_argument("--refine-lambda", type=float, help="λ of the refinement (default λ*)")
    parser.add_argument("--syn-cc", action="store_true", help="also ANTs SyNOnly with CC (slow)")
    parser.add_argument("--native", action="store_true", help="also the native 256³ pair")
    parser.add_argument("--native-syn", action="store_true", help="ANTs SyN on it (slow)")
    parser.add_argument("--no-ants", action="store_true", help="no ANTs rows (smoke)")
    args = parser.parse_args(argv)
    from hyperreg.method.model import load_checkpoint

    model, payload = load_checkpoint(args.model)
    if model.config.ndim != 3:
        raise SystemExit(f"bench_3d.py: '{args.model}' is a {model.config.ndim}D model")
    trained = payload.get("train_config", {})
    step = payload.get("step", "?")
    lines = [
        f"Model `{args.model}` (step {step}, {model.config.spacing:g} mm): "
        f"trained on {trained.get('data', '?')} with people {trained.get('holdout', '?')} "
        "held out.",
        "",
    ]
    aligned, lam = _aligned(
        model,
        _files(args.data, False),
        args.lambdas,
        args.refine_steps,
        args.refine_lambda,
        args.syn_cc,
        not args.no_ants,
    )
    lines += aligned
    if args.native:
        native_lam = lam if args.refine_lambda is None else args.refine_lambda
        lines += [
            "",
            *_native(
                model, _files(args.data, True), native_lam, args.refine_steps, args.native_syn
            ),
        ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
