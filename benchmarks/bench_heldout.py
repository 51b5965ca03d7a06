"""People the model never saw: the bundled 2D model beside ANTs SyN and SyN-CC, pair by pair.

Pairs (all 2D, from ``--data``, the shared data folder):

* mindboggle-trt20-2d: moving OASIS-TRT-20-9 and -10 (held out of the bundled model's
  training, see its model card) to every other mindboggle person (18 pairs; axial slices,
  DKT31 + CMA labels);
* neurite-oasis: the coronal slice of OAS1_0002 (held out) to OAS1_0001 (seg24 labels);
* multicontrast-2d: S8 (held out) T1 to S8 T2 (one person, two contrasts, no labels): mutual
  information between moved and fixed before and after.

hyperreg registers each pair once at every λ of ``--lambdas`` (one batched pass,
:func:`hyperreg.apps.sweep.sweep_lambdas`, the default normalisation and the model's own
grids). ANTs (antspyx ``ants.registration``) runs ``SyNOnly`` with its default metric
(Mattes MI) and with ``syn_metric="CC"`` on the files as read by ANTs (physical space, no
affine stage: the pairs share a template space), and its label maps are warped with
``genericLabel``. Dice is the mean over the non-zero labels present in both label maps
(:func:`hyperreg.method.metrics.mean_registration_dice`: the labels of the input maps, an
erased label counting 0); folding is the share of voxels with J ≤ 0 of each
method's own field. Times are wall times per pair on this machine.

    python benchmarks/bench_heldout.py --model hyperreg/pretrained/hypermorph-2d.pt

λ* below is the grid value with the best mean Dice over these same pairs, so it is an
optimistic pick; the whole grid is printed.

Benchmark-only dependency: ``pip install -e ".[bench]"`` (antspyx).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import DATA_ROOT, log, table

HELD_OUT = ("OASIS-TRT-20-9", "OASIS-TRT-20-10")


def mindboggle_pairs(root: Path) -> list[dict]:
    folder = root / "mindboggle-trt20-2d"
    people = sorted(p.name for p in folder.iterdir() if p.is_dir())

    def files(person: str) -> tuple[Path, Path]:
        d = folder / person
        return d / f"{person}_slice118.nii.gz", d / f"{person}_DKT31_CMA_labels_slice118.nii.gz"

    pairs = []
    for moving in HELD_OUT:
        for fixed in people:
            if fixed != moving:
                (m, ms), (f, fs) = files(moving), files(fixed)
                pairs.append(
                    {
                        "set": "mindboggle",
                        "name": f"{moving}->{fixed}",
                        "moving": m,
                        "fixed": f,
                        "moving_seg": ms,
                        "fixed_seg": fs,
                    }
                )
    return pairs


def oasis_pair(root: Path) -> dict:
    folder = root / "neurite-oasis"
    m, f = folder / "OASIS_OAS1_0002_MR1", folder / "OASIS_OAS1_0001_MR1"
    return {
        "set": "oasis",
        "name": "OAS1_0002->OAS1_0001",
        "moving": m / "slice_norm.nii.gz",
        "fixed": f / "slice_norm.nii.gz",
        "moving_seg": m / "slice_seg24.nii.gz",
        "fixed_seg": f / "slice_seg24.nii.gz",
    }


def mutual_information(a: np.ndarray, b: np.ndarray, bins: int = 32) -> float:
    """Histogram mutual information (nats) of two images over the voxels where either is > 0."""
    mask = (a > 0) | (b > 0)
    joint, _, _ = np.histogram2d(a[mask].ravel(), b[mask].ravel(), bins=bins)
    p = joint / joint.sum()
    pa, pb = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
    nz = p > 0
    return float((p[nz] * np.log(p[nz] / (pa @ pb)[nz])).sum())


def _hyperreg(model, pair: dict, lambdas: Sequence[float]) -> dict:
    """The pair at every λ as `register --init none --refine 0` runs it (the model's own network
    passes), after one warm-up λ; ANTs SyNOnly has no affine stage either."""
    from hyperreg.registration.pipeline import load_pair

    segs = {}
    if pair.get("moving_seg"):
        segs = {"moving_seg": pair["moving_seg"], "fixed_seg": pair["fixed_seg"]}
    prepared = load_pair(pair["moving"], pair["fixed"], init="none", **segs)
    prepared.register(model, lambdas[:1])  # warm-up
    start = time.perf_counter()
    results = prepared.register(model, lambdas)
    seconds = time.perf_counter() - start
    return {"results": results, "seconds": seconds, "fixed": prepared.fixed.data}


def _ants_read(path: Path):
    """An ANTs image; a 2D slice stored (I, J, 1) becomes a 2D image (ANTs cannot register a
    one-slice 3D image): its array and in-plane spacing, both images of a pair alike."""
    import ants

    image = ants.image_read(str(path))
    if image.dimension == 3 and image.shape[2] == 1:
        image = ants.from_numpy(image.numpy()[:, :, 0].copy(), spacing=image.spacing[:2])
    return image


def ants_syn(pair: dict, metric: str | None) -> dict:
    """ANTs SyNOnly (default Mattes MI, or ``syn_metric``) on a pair of files: seconds, moved
    image, Dice of the label maps warped with genericLabel, folding % from ANTs' own Jacobian."""
    import ants

    from hyperreg.method.metrics import mean_registration_dice

    fixed = _ants_read(pair["fixed"])
    moving = _ants_read(pair["moving"])
    kwargs = {} if metric is None else {"syn_metric": metric}
    start = time.perf_counter()
    reg = ants.registration(fixed, moving, type_of_transform="SyNOnly", **kwargs)
    seconds = time.perf_counter() - start
    out = {"seconds": seconds, "moved": reg["warpedmovout"].numpy()}
    if pair.get("moving_seg"):
        fixed_seg = _ants_read(pair["fixed_seg"])
        moved_seg = ants.apply_transforms(
            fixed,
            _ants_read(pair["moving_seg"]),
            reg["fwdtransforms"],
            interpolator="genericLabel",
        )
        out["dice"] = mean_registration_dice(
            np.rint(moved_seg.numpy()).astype(np.int32),
            np.rint(fixed_seg.numpy()).astype(np.int32),
            np.rint(_ants_read(pair["moving_seg"]).numpy()).astype(np.int32),
        )
    jacobian = ants.create_jacobian_determinant_image(fixed, reg["fwdtransforms"][0]).numpy()
    out["folding"] = 100.0 * float((jacobian <= 0).mean())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="2D hyperreg checkpoint")
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared data folder")
    parser.add_argument(
        "--lambdas",
        type=float,
        nargs="+",
        default=[0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
    )
    parser.add_argument("--max-pairs", type=int, default=0, help="first N labelled pairs only")
    args = parser.parse_args(argv)
    import torch

    from hyperreg.geometry.io import load_volume
    from hyperreg.method.metrics import mean_registration_dice
    from hyperreg.method.model import load_checkpoint

    model, _ = load_checkpoint(args.model)
    model.eval()
    pairs = mindboggle_pairs(args.data) + [oasis_pair(args.data)]
    if args.max_pairs:
        pairs = pairs[: args.max_pairs]
    rows = []
    for index, pair in enumerate(pairs):
        log(f"pair {index + 1}/{len(pairs)}: {pair['name']}")
        ours = _hyperreg(model, pair, args.lambdas)
        syn, syncc = ants_syn(pair, None), ants_syn(pair, "CC")
        before = mean_registration_dice(
            load_volume(pair["moving_seg"], label=True).data,
            load_volume(pair["fixed_seg"], label=True).data,
        )
        rows.append({"pair": pair, "ours": ours, "syn": syn, "syncc": syncc, "before": before})

    itk_threads = os.environ.get("ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS", "default (all cores)")
    print("## People never seen in training: bundled 2D model vs ANTs SyN / SyN-CC\n")
    print(
        f"Model `{args.model}`; threads: torch {torch.get_num_threads()}, ANTs {itk_threads}. "
        "Moving people held out of the model's training: "
        f"{', '.join(HELD_OUT)} (mindboggle) and OAS1_0002 (OASIS coronal slice); the fixed "
        "people were in its training set except where the pair is 9↔10.\n"
    )
    for group in ("mindboggle", "oasis"):
        chosen = [r for r in rows if r["pair"]["set"] == group]
        if not chosen:
            continue
        grid = []
        for k, lam in enumerate(args.lambdas):
            dice = np.mean([r["ours"]["results"][k].mean_dice for r in chosen])
            fold = np.mean([100 * r["ours"]["results"][k].folding_fraction for r in chosen])
            grid.append((lam, dice, fold))
        best = max(grid, key=lambda g: g[1])
        print(f"### {group}: {len(chosen)} pair(s)\n")
        print(
            table(
                ["λ", "hyperreg mean Dice", "folding %"],
                [[f"{lam:g}", f"{d:.4f}", f"{f:.3f}"] for lam, d, f in grid],
            )
        )
        syn = np.mean([r["syn"]["dice"] for r in chosen])
        syncc = np.mean([r["syncc"]["dice"] for r in chosen])
        none = np.mean([r["before"] for r in chosen])
        t_ours = np.mean([r["ours"]["seconds"] for r in chosen]) / len(args.lambdas)
        print()
        print(
            table(
                ["method", "mean Dice", "folding %", "s / pair"],
                [
                    ["no registration", f"{none:.4f}", "0", "–"],
                    [
                        f"hyperreg at λ* = {best[0]:g} (best on these pairs)",
                        f"{best[1]:.4f}",
                        f"{best[2]:.3f}",
                        f"{t_ours:.3f} (per λ, {model.config.passes} network pass(es))",
                    ],
                    [
                        "ANTs SyNOnly (Mattes MI)",
                        f"{syn:.4f}",
                        f"{np.mean([r['syn']['folding'] for r in chosen]):.3f}",
                        f"{np.mean([r['syn']['seconds'] for r in chosen]):.2f}",
                    ],
                    [
                        "ANTs SyNOnly, syn_metric=CC",
                        f"{syncc:.4f}",
                        f"{np.mean([r['syncc']['folding'] for r in chosen]):.3f}",
                        f"{np.mean([r['syncc']['seconds'] for r in chosen]):.2f}",
                    ],
                ],
            )
        )
        above = best[1] > syn
        within = best[1] >= syncc - 0.02
        print(
            f"\nAt λ*: above SyN: {'met' if above else 'MISSED'}; within 0.02 of SyN-CC: "
            f"{'met' if within else 'MISSED'} ({best[1] - syncc:+.4f}).\n"
        )
    _multicontrast(model, args)
    return 0


def _multicontrast(model, args) -> None:
    """S8 T1 -> S8 T2: mutual information gain, hyperreg (λ grid) vs ANTs SyN (Mattes MI)."""

    folder = args.data / "multicontrast-2d" / "S8"
    pair = {
        "moving": folder / "structInSpaceOfTemplateCoronalSlice.nii.gz",
        "fixed": folder / "T2_structInSpaceOfTemplateCoronalSlice.nii.gz",
    }
    ours = _hyperreg(model, pair, args.lambdas)
    fixed = _ants_read(pair["fixed"]).numpy()
    moving = _ants_read(pair["moving"]).numpy()
    syn = ants_syn(pair, None)
    before = mutual_information(moving, fixed)
    gains = [(r.lam, mutual_information(r.moved, ours["fixed"]) - before) for r in ours["results"]]
    best = max(gains, key=lambda g: g[1])
    syn_gain = mutual_information(syn["moved"], fixed) - before
    print("### multicontrast S8 (held out): T1 → T2 of one person\n")
    print(
        table(
            ["method", "MI before (nats)", "MI gain", "s"],
            [
                [
                    "hyperreg, best λ = " + f"{best[0]:g}",
                    f"{before:.4f}",
                    f"{best[1]:+.4f}",
                    f"{ours['seconds'] / len(args.lambdas):.3f}",
                ],
                [
                    "ANTs SyNOnly (Mattes MI)",
                    f"{before:.4f}",
                    f"{syn_gain:+.4f}",
                    f"{syn['seconds']:.2f}",
                ],
            ],
        )
    )
    print(f"\nMI gain at least ANTs SyN's: {'met' if best[1] >= syn_gain else 'MISSED'}\n")


if __name__ == "__main__":
    raise SystemExit(main())
