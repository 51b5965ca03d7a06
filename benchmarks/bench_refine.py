"""Test-time refinement: Dice gain against Adam steps, beside ANTs SyN-CC on the same pairs.

Pairs (2D, from ``--data``, the shared data folder; the same as ``bench_heldout.py``):

* mindboggle-trt20-2d: moving OASIS-TRT-20-9 and -10 (held out of the bundled model's
  training) to the other mindboggle people (axial slices, DKT31 + CMA labels);
* neurite-oasis: the coronal slice of OAS1_0002 (held out) to OAS1_0001 (seg24 labels);
* multicontrast-2d: S8 T1 to S8 T2 (no labels): refinement with mutual information
  (``--refine-sim mi``) against ANTs SyN (Mattes MI), compared by the MI gain of the moved
  image (histogram MI, 32 bins, nats; ``bench_heldout.mutual_information``).

hyperreg registers each pair at ``--lambda`` with
:func:`hyperreg.registration.refine.refine_pair` for every step count of ``--steps`` (0 = the
network's field; each count is its own run from the network's prediction). Dice is the mean over
the non-zero labels present in both label maps; folding is the share of voxels with
central-difference J ≤ 0; NDV the non-diffeomorphic area (Learn2Reg LUMIR,
:func:`hyperreg.method.diffeomorphism.non_diffeomorphic_volume`). ANTs (antspyx) runs
``SyNOnly`` with ``syn_metric="CC"`` on the files as read by ANTs. Times are wall times per
pair: hyperreg = network pass + refinement, ANTs = ``ants.registration``.

    python benchmarks/bench_refine.py --model runs/bundled2d/model.pt

Benchmark-only dependency: antspyx.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import DATA_ROOT, DEFAULT_PLOTS, log, pyplot, table, verdict
from bench_heldout import ants_syn, mindboggle_pairs, mutual_information, oasis_pair


def _ours(model, pair: dict, lam: float, steps: int, lr: float, sim: str = "ncc") -> dict:
    import torch

    from hyperreg.geometry.io import load_volume
    from hyperreg.method.diffeomorphism import non_diffeomorphic_volume
    from hyperreg.registration.refine import Refinement, refine_pair

    moving, fixed = load_volume(pair["moving"]), load_volume(pair["fixed"])
    segs = {}
    if pair.get("moving_seg"):
        segs = {
            "moving_seg": load_volume(pair["moving_seg"], label=True),
            "fixed_seg": load_volume(pair["fixed_seg"], label=True),
        }
    start = time.perf_counter()
    result = refine_pair(
        model, moving, fixed, lam, Refinement(steps=steps, sim=sim, lr=lr), resample=True, **segs
    )
    seconds = time.perf_counter() - start
    return {
        "dice": result.mean_dice,
        "folding": 100.0 * result.folding_fraction,
        "ndv": 100.0 * non_diffeomorphic_volume(torch.from_numpy(result.disp)[None]),
        "seconds": seconds,
        "moved": result.moved,
        "fixed": fixed.data,
        "refinement": result.refinement,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="2D hyperreg checkpoint")
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared data folder")
    parser.add_argument("--lambda", dest="lam", type=float, default=0.1, help="λ (default 0.1)")
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 10, 25, 50, 100])
    parser.add_argument("--lr", type=float, default=0.05, help="Adam lr, voxels per step")
    parser.add_argument("--max-pairs", type=int, default=0, help="first N mindboggle pairs only")
    parser.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOTS)
    args = parser.parse_args(argv)
    import torch

    from hyperreg.method.model import load_checkpoint

    model, _ = load_checkpoint(args.model)
    pairs = mindboggle_pairs(args.data)
    if args.max_pairs:
        pairs = pairs[: args.max_pairs]
    pairs.append(oasis_pair(args.data))
    _ours(model, pairs[0], args.lam, 2, args.lr)  # warm-up
    rows = []
    for index, pair in enumerate(pairs):
        log(f"pair {index + 1}/{len(pairs)}: {pair['name']}")
        ours = {n: _ours(model, pair, args.lam, n, args.lr) for n in args.steps}
        rows.append({"pair": pair, "ours": ours, "syncc": ants_syn(pair, "CC")})

    threads = os.environ.get("ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS", "ITK default (all cores)")
    print("## Test-time refinement vs ANTs SyN-CC\n")
    print(
        f"Model `{args.model}`, λ = {args.lam:g}, Adam lr {args.lr:g} voxels/step; torch "
        f"threads {torch.get_num_threads()}, ANTs threads {threads}; CPU, {os.cpu_count()} "
        f"cores. {len(rows)} pairs ({len(rows) - 1} mindboggle, 1 OASIS).\n"
    )
    grid = []
    for n in args.steps:
        grid.append(
            [
                n,
                np.mean([r["ours"][n]["dice"] for r in rows]),
                np.mean([r["ours"][n]["folding"] for r in rows]),
                np.mean([r["ours"][n]["ndv"] for r in rows]),
                np.mean([r["ours"][n]["seconds"] for r in rows]),
            ]
        )
    syncc = [
        np.mean([r["syncc"]["dice"] for r in rows]),
        np.mean([r["syncc"]["folding"] for r in rows]),
        np.mean([r["syncc"]["seconds"] for r in rows]),
    ]
    body = [
        [
            f"hyperreg, {n} steps",
            f"{d:.4f}",
            f"{d - grid[0][1]:+.4f}",
            f"{f:.3f}",
            f"{v:.4f}",
            f"{s:.2f}",
        ]
        for n, d, f, v, s in grid
    ]
    body.append(
        [
            "ANTs SyNOnly, syn_metric=CC",
            f"{syncc[0]:.4f}",
            "",
            f"{syncc[1]:.3f}",
            "",
            f"{syncc[2]:.2f}",
        ]
    )
    print(table(["method", "mean Dice", "gain", "folding %", "NDV %", "s / pair"], body))
    fits = [g for g in grid if g[4] <= 2.0 and g[2] < 0.5]
    best = max(fits, key=lambda g: g[1]) if fits else None
    if best is not None:
        print(
            f"\nBest within 2 s per pair and folding < 0.5 %: {best[0]} steps, Dice "
            f"{best[1]:.4f} vs SyN-CC {syncc[0]:.4f}: above SyN-CC "
            f"{verdict(best[1] > syncc[0])} ({best[1] - syncc[0]:+.4f}).\n"
        )
    else:
        print("\nNo step count ran within 2 s per pair with folding < 0.5 %: MISSED.\n")
    _plot(args.plot_dir / "refine_gain.png", grid, syncc[0])
    _multicontrast(model, args)
    return 0


def _plot(path: Path, grid: list, syncc: float) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    ax.plot([g[0] for g in grid], [g[1] for g in grid], "o-", label="hyperreg + refinement")
    ax.axhline(syncc, color="k", ls="--", label="ANTs SyN-CC")
    ax.set_xlabel("refinement steps (Adam)")
    ax.set_ylabel("mean Dice")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"wrote {path}")


def _multicontrast(model, args) -> None:
    import ants

    folder = args.data / "multicontrast-2d" / "S8"
    pair = {
        "moving": folder / "structInSpaceOfTemplateCoronalSlice.nii.gz",
        "fixed": folder / "T2_structInSpaceOfTemplateCoronalSlice.nii.gz",
    }
    fixed = ants.image_read(str(pair["fixed"])).numpy()
    moving = ants.image_read(str(pair["moving"])).numpy()
    before = mutual_information(moving, fixed)
    rows = []
    for n in args.steps:
        ours = _ours(model, pair, args.lam, n, args.lr, sim="mi")
        gain = mutual_information(ours["moved"], ours["fixed"]) - before
        rows.append(
            [
                f"hyperreg, {n} steps MI",
                f"{gain:+.4f}",
                f"{ours['folding']:.3f}",
                f"{ours['seconds']:.2f}",
            ]
        )
    syn = ants_syn(pair, None)
    syn_gain = mutual_information(syn["moved"], fixed) - before
    rows.append(
        [
            "ANTs SyNOnly (Mattes MI)",
            f"{syn_gain:+.4f}",
            f"{syn['folding']:.3f}",
            f"{syn['seconds']:.2f}",
        ]
    )
    print(f"### multicontrast S8: T1 → T2, MI before {before:.4f} nats\n")
    print(table(["method", "MI gain (nats)", "folding %", "s"], rows))
    best = max(float(r[1]) for r in rows[:-1])
    print(
        f"\nRefinement raises MI at least as much as ANTs SyN: {verdict(best >= syn_gain)} "
        f"({best:+.4f} vs {syn_gain:+.4f}).\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
