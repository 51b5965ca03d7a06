"""3D on people the model never saw: default `hyperreg register` beside ANTs, pair by pair.

Pairs (native spaces, each person in their own position and storage order):

* ixi-2mm: the five IXI people held out of the 3D model's training (its card), in a cycle
  (each to the next): heads at 2 mm, DLMUSE parcellation (up to 149 labels);
* oasis1-freesurfer: OAS1_0002 (held out) -> OAS1_0001 ``norm.mgz`` (256³, 1 mm, aseg).

hyperreg runs as a user runs it: the CLI, ``hyperreg register`` with its defaults (affine stage
on), at ``--lambda`` (the model's validation λ*; the grid of ``--lambdas`` is printed too), and
with ``--refine``. ANTs (antspyx ``ants.registration``): ``SyN`` (rigid + affine + SyN, Mattes
MI) and ``SyNCC`` (rigid + affine + SyN with CC), label maps warped with ``genericLabel``.

Dice: mean over the non-zero labels of the moving and fixed inputs; a label that vanishes after
warping counts 0. Folding: share of voxels with J ≤ 0 (central differences) of each method's
displacement on the fixed grid. NDV: LUMIR's non-diffeomorphic volume (% of the grid,
:func:`hyperreg.method.diffeomorphism.non_diffeomorphic_volume`). Threads: ``--threads`` for
both hyperreg (torch) and ANTs (ITK).

    python benchmarks/bench_3d_heldout.py --model hyperreg/pretrained/hypermorph-3d.pt \\
        --lambda 0.3 --out benchmarks/RESULTS_3d_heldout.md

Benchmark-only dependency: ``pip install -e ".[bench]"`` (antspyx).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log, table

from hyperreg.method.metrics import mean_registration_dice

IXI_HELD_OUT = (
    "IXI012-HH-1211",
    "IXI239-HH-2296",
    "IXI338-HH-1971",
    "IXI452-HH-2213",
    "IXI603-HH-2701",
)


def pairs(root: Path) -> list[dict]:
    ixi = root / "ixi-2mm"
    out = []
    for i, moving in enumerate(IXI_HELD_OUT):
        fixed = IXI_HELD_OUT[(i + 1) % len(IXI_HELD_OUT)]
        out.append(
            {
                "name": f"{moving} -> {fixed}",
                "moving": ixi / f"{moving}_T1.nii.gz",
                "fixed": ixi / f"{fixed}_T1.nii.gz",
                "moving_seg": ixi / f"{moving}_DLMUSE.nii.gz",
                "fixed_seg": ixi / f"{fixed}_DLMUSE.nii.gz",
            }
        )
    fs = root / "oasis1-freesurfer"
    m, f = fs / "OAS1_0002_MR1", fs / "OAS1_0001_MR1"
    out.append(
        {
            "name": "OAS1_0002 -> OAS1_0001 (256³)",
            "moving": m / "norm.mgz",
            "fixed": f / "norm.mgz",
            "moving_seg": m / "aseg.mgz",
            "fixed_seg": f / "aseg.mgz",
        }
    )
    return out


def field_metrics(disp_voxels: np.ndarray) -> tuple[float, float]:
    """Folding % and NDV % of a displacement ``(3, I, J, K)`` in fixed voxels."""
    import torch

    from hyperreg.method.diffeomorphism import non_diffeomorphic_volume
    from hyperreg.method.metrics import folding_fraction

    disp = torch.from_numpy(np.ascontiguousarray(disp_voxels, dtype=np.float32))[None]
    return 100.0 * folding_fraction(disp), float(non_diffeomorphic_volume(disp))


def labels(path: Path) -> np.ndarray:
    from hyperreg.geometry.io import load_volume

    return load_volume(path, label=True).data


def hyperreg_cli(
    model: str, pair: dict, lam: float, refine: int, work: Path, extra: Sequence[str] = ()
) -> dict:
    """One `hyperreg register` call with the defaults and ``extra`` options (e.g. ``--passes
    1``); Dice, folding, NDV, seconds."""
    import nibabel as nib

    moved_seg, field = work / "moved_seg.nii.gz", work / "field.nii.gz"
    # `python -m hyperreg`: the CLI of this interpreter, also when its bin/ is not on PATH
    command = [
        sys.executable,
        "-m",
        "hyperreg",
        "register",
        "--model",
        model,
        "--moving",
        str(pair["moving"]),
        "--fixed",
        str(pair["fixed"]),
        "--moving-seg",
        str(pair["moving_seg"]),
        "--fixed-seg",
        str(pair["fixed_seg"]),
        "--lambda",
        f"{lam:g}",
        "--moved",
        str(work / "moved.nii.gz"),
        "--moved-seg",
        str(moved_seg),
        "--field-out",
        str(field),
    ]
    command += ["--refine", str(refine)]  # 0 too: the bundled 3D model refines by default
    command += list(extra)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-400:]}")
    fixed_seg, moving_seg = labels(pair["fixed_seg"]), labels(pair["moving_seg"])
    dice = mean_registration_dice(np.asarray(nib.load(moved_seg).dataobj), fixed_seg, moving_seg)
    disp = np.moveaxis(np.asarray(nib.load(field).dataobj, dtype=np.float32), -1, 0)
    folding, ndv = field_metrics(disp)
    return {"dice": dice, "folding": folding, "ndv": ndv, "seconds": seconds}


def ants_run(pair: dict, kind: str) -> dict:
    """antspyx registration; Dice (genericLabel), folding and NDV of its warp field."""
    import ants
    import nibabel as nib

    fixed, moving = ants.image_read(str(pair["fixed"])), ants.image_read(str(pair["moving"]))
    start = time.perf_counter()
    reg = ants.registration(fixed, moving, type_of_transform=kind)
    seconds = time.perf_counter() - start
    moved = ants.apply_transforms(
        fixed,
        ants.image_read(str(pair["moving_seg"])),
        reg["fwdtransforms"],
        interpolator="genericLabel",
    )
    fixed_seg, moving_seg = labels(pair["fixed_seg"]), labels(pair["moving_seg"])
    dice = mean_registration_dice(np.rint(moved.numpy()).astype(np.int32), fixed_seg, moving_seg)
    warp = next(t for t in reg["fwdtransforms"] if t.endswith((".nii", ".nii.gz")))
    # ANTs' warp: LPS mm on the fixed grid, (I, J, K, 1, 3); as fixed voxels, i/j/k order
    image = nib.load(warp)
    mm = np.asarray(image.dataobj, dtype=np.float64).reshape(*image.shape[:3], 3)
    ras = mm * np.array([-1.0, -1.0, 1.0])
    voxels = np.einsum("ab,...b->...a", np.linalg.inv(image.affine[:3, :3]), ras)
    folding, ndv = field_metrics(np.moveaxis(voxels, -1, 0))
    return {"dice": dice, "folding": folding, "ndv": ndv, "seconds": seconds}


def mean_rows(summary: dict[str, list], pairs_kept: set | None) -> list[list[str]]:
    """One row per method: the mean over its pairs (or over ``pairs_kept`` only)."""
    out = []
    for name, found in summary.items():
        rs = [r for n, r in found if pairs_kept is None or n in pairs_kept]
        if not rs:
            continue
        cells = [np.mean([r[key] for r in rs]) for key in ("dice", "folding", "ndv", "seconds")]
        out.append([name, str(len(rs)), *(f"{c:.4f}" for c in cells[:3]), f"{cells[3]:.1f}"])
    return out


def cached_ants(
    cache: Path | None, pair: dict, kind: str, threads: int, only: bool = False
) -> dict | None:
    """``ants_run`` of the pair, or its earlier result from ``cache`` (a JSON file), which
    then says when it ran and with how many threads; with ``only``, None when not cached."""
    import datetime
    import json

    known = json.loads(cache.read_text()) if cache and cache.is_file() else {}
    key = f"{pair['name']} | {kind}"
    if key in known:
        found = known[key]
        return {**found, "cached": f"{found['threads']} threads, {found['date']}"}
    if only:
        return None
    log(f"{pair['name']}: ANTs {kind} ...")
    result = ants_run(pair, kind)
    if cache is not None:
        known = json.loads(cache.read_text()) if cache.is_file() else {}  # another run may add
        date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        known[key] = {**result, "threads": threads, "date": date}
        cache.write_text(json.dumps(known, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--model", required=True)
    parser.add_argument("--lambda", dest="lam", type=float, required=True)
    parser.add_argument("--refine", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-ants", action="store_true")
    parser.add_argument(
        "--no-syncc",
        action="store_true",
        help="ANTs SyN only (SyNCC took over 7 minutes on one 2 mm IXI pair)",
    )
    parser.add_argument("--pairs", type=int, default=0, help="only the first N pairs (smoke)")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="OPTIONS",
        help="one more network-alone row with these register options (--also='OPTIONS', e.g. "
        "'--passes 1 --no-flip-average'; the other rows use the model's own); repeatable",
    )
    parser.add_argument(
        "--ants-cache",
        type=Path,
        help="JSON of ANTs results per pair and kind: rows found there are reused (and marked "
        "so, with the threads and date they ran with), new ones are added. ANTs' result does "
        "not depend on the hyperreg model, and SyNCC takes many minutes a pair",
    )
    parser.add_argument(
        "--ants-only", action="store_true", help="ANTs only (e.g. to fill the cache)"
    )
    parser.add_argument(
        "--syncc-cached-only",
        action="store_true",
        help="SyNCC only from --ants-cache: a pair without a cached SyNCC result gets a 'not "
        "measured' row and is left out of SyNCC's mean (the means over the pairs every method "
        "has are printed too)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS"] = str(args.threads)
    have_ants = not args.no_ants and importlib.util.find_spec("ants") is not None
    methods = [f"hyperreg λ {args.lam:g}", f"hyperreg λ {args.lam:g} + refine {args.refine}"]
    also = {f"hyperreg λ {args.lam:g}, {options}": options.split() for options in args.also}
    methods += list(also)
    kinds = ("SyN",) if args.no_syncc else ("SyN", "SyNCC")
    methods += [f"ANTs {kind}" for kind in kinds] if have_ants else []
    rows, summary = [], {name: [] for name in methods}
    chosen = pairs(args.data)
    for pair in chosen[: args.pairs] if args.pairs else chosen:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            moving_seg = labels(pair["moving_seg"])
            none = mean_registration_dice(moving_seg, labels(pair["fixed_seg"]), moving_seg)
            results = {}
            if not args.ants_only:
                log(f"{pair['name']}: hyperreg ...")
                results[methods[0]] = hyperreg_cli(args.model, pair, args.lam, 0, work)
                results[methods[1]] = hyperreg_cli(args.model, pair, args.lam, args.refine, work)
                for name, extra in also.items():
                    results[name] = hyperreg_cli(args.model, pair, args.lam, 0, work, extra)
            if have_ants:
                for kind in kinds:
                    if kind == "SyNCC" and args.syncc_cached_only:
                        found = cached_ants(args.ants_cache, pair, kind, args.threads, only=True)
                        if found is None:
                            rows.append([pair["name"], "ANTs SyNCC", "not measured", "", "", ""])
                            continue
                        results["ANTs SyNCC"] = found
                        continue
                    results[f"ANTs {kind}"] = cached_ants(args.ants_cache, pair, kind, args.threads)
        for name, r in results.items():
            summary[name].append((pair["name"], r))
            rows.append(
                [
                    pair["name"],
                    name + (f" (cached: {r['cached']})" if r.get("cached") else ""),
                    f"{r['dice']:.4f}",
                    f"{r['folding']:.4f}",
                    f"{r['ndv']:.4f}",
                    f"{r['seconds']:.1f}",
                ]
            )
        rows.append([pair["name"], "(no registration, voxel to voxel)", f"{none:.4f}", "", "", ""])
    found = [{n for n, _ in rs} for rs in summary.values() if rs]
    everyone = set.intersection(*found) if found else set()
    means = mean_rows(summary, None)
    common = mean_rows(summary, everyone)
    text = "\n".join(
        [
            "# 3D on people the model never saw: hyperreg register beside ANTs",
            "",
            f"Command: `python benchmarks/bench_3d_heldout.py --model {args.model} --lambda "
            f"{args.lam:g} --refine {args.refine} --threads {args.threads}"
            f"{' --no-syncc' if args.no_syncc else ''}"
            f"{''.join(' --also=' + repr(options) for options in args.also)}"
            f"{f' --ants-cache {args.ants_cache}' if args.ants_cache else ''}"
            f"{' --syncc-cached-only' if args.syncc_cached_only else ''}`; "
            f"{args.threads} threads "
            "each; nothing else running unless said below.",
            "",
            "Pairs: 5 IXI people held out of the 3D model's training (a cycle, heads, DLMUSE) and "
            "OAS1_0002 (held out) -> OAS1_0001 (a training person), FreeSurfer native 256³, aseg.",
            "Dice over the labels of both inputs (vanished = 0).",
            "",
            "## Mean over the pairs",
            "",
            table(["method", "pairs", "mean Dice", "folding %", "NDV %", "seconds"], means),
            "",
            *(
                [
                    f"Over the {len(everyone)} pairs every method has:",
                    "",
                    table(
                        ["method", "pairs", "mean Dice", "folding %", "NDV %", "seconds"], common
                    ),
                    "",
                ]
                if common != means
                else []
            ),
            "## Per pair",
            "",
            table(["pair", "method", "Dice", "folding %", "NDV %", "seconds"], rows),
            "",
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
