"""λ chosen per pair without labels (:func:`hyperreg.registration.autolambda.choose_lambda`)
against the best single λ chosen with labels (global λ*) and the per-pair oracle.

2D, the bundled 2D model (its card lists who it trained on):

* **tune** (people the model trained on): mindboggle-trt20-2d people other than
  OASIS-TRT-20-3, -9 and -10, each to the next two; the rule's ``gain`` is picked here, by the
  mean Dice of the λ it chooses;
* **evaluate** (people it never saw as moving): OASIS-TRT-20-9 and -10 to every other
  mindboggle person (18 pairs) and OAS1_0002 -> OAS1_0001 (neurite-oasis slice, seg24).

With ``--model3d MODEL --pairs3d CSV`` (columns moving, fixed, moving_seg, fixed_seg) the same is
done in 3D on the pairs listed (the 3D model's validation people, in their native spaces: the
default affine stage runs first), with the gain chosen in 2D.

Dice: mean over the labels of the moving and fixed inputs (background excluded), a label that
vanishes after warping counts 0. Folding: share of voxels with J ≤ 0. Similarity: local NCC
(window 9) of the moved and fixed images, as the rule sees it.

    python benchmarks/bench_auto_lambda.py --out benchmarks/RESULTS_auto_lambda.md
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
from _common import DATA_ROOT, log, table

GAINS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
HELD_OUT = ("OASIS-TRT-20-3", "OASIS-TRT-20-9", "OASIS-TRT-20-10")


def mindboggle(root: Path) -> tuple[list[dict], list[dict]]:
    folder = root / "mindboggle-trt20-2d"
    people = sorted(p.name for p in folder.iterdir() if p.is_dir())

    def files(person: str) -> dict:
        d = folder / person
        return {
            "image": d / f"{person}_slice118.nii.gz",
            "seg": d / f"{person}_DKT31_CMA_labels_slice118.nii.gz",
        }

    def pair(m: str, f: str) -> dict:
        a, b = files(m), files(f)
        return {
            "name": f"{m}->{f}",
            "moving": a["image"],
            "fixed": b["image"],
            "moving_seg": a["seg"],
            "fixed_seg": b["seg"],
        }

    trained = [p for p in people if p not in HELD_OUT]
    tune = [
        pair(trained[i], trained[(i + k) % len(trained)])
        for i in range(len(trained))
        for k in (1, 2)
    ]
    evaluate = [pair(m, f) for m in HELD_OUT[1:] for f in people if f != m]
    oasis = root / "neurite-oasis"
    m, f = oasis / "OASIS_OAS1_0002_MR1", oasis / "OASIS_OAS1_0001_MR1"
    evaluate.append(
        {
            "name": "OAS1_0002->OAS1_0001",
            "moving": m / "slice_norm.nii.gz",
            "fixed": f / "slice_norm.nii.gz",
            "moving_seg": m / "slice_seg24.nii.gz",
            "fixed_seg": f / "slice_seg24.nii.gz",
        }
    )
    return tune, evaluate


def sweep(model, pair: dict, lambdas, init: str = "none") -> dict:
    """Dice, similarity and folding of one pair at every λ (one batched sweep, after the
    affine stage ``init``, as ``hyperreg register`` runs it)."""
    from hyperreg.registration.pipeline import load_pair

    prepared = load_pair(
        pair["moving"],
        pair["fixed"],
        model=model,
        moving_seg=pair["moving_seg"],
        fixed_seg=pair["fixed_seg"],
        init=init,
    )
    start = time.perf_counter()
    results = prepared.register(model, list(lambdas), ncc=True)
    seconds = time.perf_counter() - start
    return {
        "dice": [float(np.mean(list(r.dice.values()))) for r in results],
        "similarity": [r.ncc for r in results],
        "folding": [r.folding_fraction for r in results],
        "seconds": seconds,
    }


def evaluate_rule(curves: list[dict], lambdas, gain: float) -> dict:
    from hyperreg.registration.autolambda import choose_lambda

    picks = [choose_lambda(lambdas, c["similarity"], c["folding"], gain=gain) for c in curves]
    index = [list(lambdas).index(p.lam) for p in picks]
    dice = np.array([c["dice"] for c in curves])  # pairs x lambdas
    fold = np.array([c["folding"] for c in curves])
    best = int(np.argmax(dice.mean(0)))
    rows = np.arange(len(curves))
    return {
        "auto": float(dice[rows, index].mean()),
        "auto_fold": float(fold[rows, index].mean()),
        "global": float(dice[:, best].mean()),
        "global_lam": float(lambdas[best]),
        "global_fold": float(fold[:, best].mean()),
        "oracle": float(dice.max(1).mean()),
        "picks": [p.lam for p in picks],
        "per_pair": dice,
        "best": best,
        "index": index,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--model", default="hyperreg/pretrained/hypermorph-2d.pt")
    parser.add_argument("--model3d", default="")
    parser.add_argument("--pairs3d", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--max-pairs", type=int, default=0, help="first N tuning and N evaluation pairs (smoke)"
    )
    args = parser.parse_args(argv)
    import torch

    from hyperreg.method.model import load_checkpoint
    from hyperreg.registration.autolambda import AUTO_GRID

    torch.set_grad_enabled(False)
    lambdas = AUTO_GRID
    model, _ = load_checkpoint(args.model)
    tune, held = mindboggle(args.data)
    if args.max_pairs:
        tune, held = tune[: args.max_pairs], held[: args.max_pairs]
    log(f"2D: {len(tune)} tuning pairs (trained people), {len(held)} evaluation pairs")
    tune_curves = [sweep(model, p, lambdas) for p in tune]
    held_curves = [sweep(model, p, lambdas) for p in held]
    lines = [
        "# λ chosen per pair without labels",
        "",
        "Command: `python benchmarks/bench_auto_lambda.py"
        + (f" --model3d {args.model3d} --pairs3d {args.pairs3d}" if args.model3d else "")
        + (f" --max-pairs {args.max_pairs}" if args.max_pairs else "")
        + "` (2 CPU cores; say here what ran beside it).",
        "",
        f"Grid: λ ∈ {list(lambdas)}. Rule: the largest λ whose local NCC keeps `gain` of "
        "the similarity gain over the grid, folding ≤ 0.1 % "
        "(`hyperreg.registration.autolambda`). Dice: labels of both inputs, vanished = 0.",
        "",
        "## 2D: gain chosen on people the model trained on",
        "",
    ]
    rows = []
    for gain in GAINS:
        r = evaluate_rule(tune_curves, lambdas, gain)
        rows.append(
            [
                f"{gain:g}",
                f"{r['auto']:.4f}",
                f"{r['global']:.4f} (λ {r['global_lam']:g})",
                f"{r['oracle']:.4f}",
            ]
        )
    chosen = max(GAINS, key=lambda g: evaluate_rule(tune_curves, lambdas, g)["auto"])
    lines += [
        f"Tuning pairs: {len(tune)} (mindboggle people the 2D model trained on, each to the "
        "next two).",
        "",
        table(["gain", "auto-λ Dice", "global λ* Dice", "oracle"], rows),
        "",
        f"Chosen gain: **{chosen:g}**.",
        "",
        "## 2D: people the model never saw (moving OASIS-TRT-20-9/-10, OAS1_0002)",
        "",
    ]
    r = evaluate_rule(held_curves, lambdas, chosen)
    per = [
        [
            p["name"],
            f"{r['picks'][i]:g}",
            f"{r['per_pair'][i, r['index'][i]]:.4f}",
            f"{r['per_pair'][i, r['best']]:.4f}",
            f"{r['per_pair'][i].max():.4f}",
        ]
        for i, p in enumerate(held)
    ]
    lines += [
        table(["pair", "auto λ", "auto Dice", f"global λ* {r['global_lam']:g}", "oracle"], per),
        "",
        table(
            ["", "mean Dice", "mean folding %"],
            [
                ["auto-λ", f"{r['auto']:.4f}", f"{100 * r['auto_fold']:.4f}"],
                [
                    f"global λ* = {r['global_lam']:g} (chosen with labels on these pairs)",
                    f"{r['global']:.4f}",
                    f"{100 * r['global_fold']:.4f}",
                ],
                ["per-pair oracle", f"{r['oracle']:.4f}", "–"],
            ],
        ),
        "",
        f"Target auto ≥ global λ*: **{'met' if r['auto'] >= r['global'] else 'MISSED'}** "
        f"({r['auto'] - r['global']:+.4f}).",
        "",
    ]
    if args.model3d and args.pairs3d:
        model3d, _ = load_checkpoint(args.model3d)
        with open(args.pairs3d) as handle:
            pairs3d = [
                dict(row, name=f"{Path(row['moving']).name}->{Path(row['fixed']).name}")
                for row in csv.DictReader(handle)
            ]
        curves = [sweep(model3d, p, lambdas, init="affine") for p in pairs3d]
        r = evaluate_rule(curves, lambdas, chosen)
        lines += [
            "## 3D: the 3D model's validation people",
            "",
            table(
                ["pair", "auto λ", "auto Dice", f"global λ* {r['global_lam']:g}", "oracle"],
                [
                    [
                        p["name"],
                        f"{r['picks'][i]:g}",
                        f"{r['per_pair'][i, r['index'][i]]:.4f}",
                        f"{r['per_pair'][i, r['best']]:.4f}",
                        f"{r['per_pair'][i].max():.4f}",
                    ]
                    for i, p in enumerate(pairs3d)
                ],
            ),
            "",
            f"Mean: auto {r['auto']:.4f}, global λ* {r['global']:.4f}, oracle "
            f"{r['oracle']:.4f}; target "
            f"**{'met' if r['auto'] >= r['global'] else 'MISSED'}**.",
            "",
        ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
