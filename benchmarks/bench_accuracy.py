"""Accuracy against fixed-λ models: one HyperMorph model vs one VoxelMorph-style model per λ.

On the people split of the bundled 2D model (:data:`_common.PEOPLE_SOURCES`, 2D slices at
1.5 mm, validation people never trained on), trains one HyperMorph model with
:func:`hyperreg.training.train.train` (λ per sample) and, for each ``--lambdas`` value, one model
of the identical pipeline (padding, U-Net, scaling and squaring at half resolution, resize, warp)
whose U-Net weights are ordinary trainable parameters initialised from ``UNet.init_std`` (as
``FixedWeightUNet``), trained at that constant λ by :func:`_common.train_fixed`, a copy of
``train``'s step: the same pairs in the same order (the trainer's sampler from
:func:`hyperreg.training.train.prepare_data` and generator; the λ draws are made and
discarded), loss (:func:`hyperreg.training.train.hypermorph_loss`, NCC), fused Adam and default
``ModelConfig(ndim=2)``. Every model trains at every lr of ``--lrs``; each is reported at its
best lr (HyperMorph: highest mean Dice over ``--lambdas``; a fixed model: highest Dice at its
λ), picked on the evaluation pairs themselves (the same optimistic pick for both arms).
Evaluation (:func:`hyperreg.training.validation.evaluate`, so
:func:`hyperreg.registration.lambdas.register_pair`) is on the validation pairs, whose moving scan
is a held-out person: HyperMorph on the λ grid 0, 0.05, …, 1 and at each fixed λ, each fixed
model at its own λ. Reports mean Dice and folding % (J ≤ 0) per λ, the target HyperMorph Dice ≥
fixed Dice − 0.01, and λ* (best HyperMorph grid Dice). Writes ``accuracy_vs_lambda.png`` into
``--plot-dir`` and ``accuracy.json`` (the chosen HyperMorph checkpoint and λ*) into ``--work``.
The HyperMorph runs are bench_mip's MIP runs of the first seed (same configuration), so one
``--work`` with ``--reuse`` trains them once for both benchmarks.

    python benchmarks/bench_accuracy.py --steps 1500 --lrs 1e-4 3e-4 1e-3 3e-3 1e-2 \\
        --lambdas 0.1 0.3 0.5 0.7 0.9 --jobs 2 --device cpu --work runs/bench11 --reuse
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _common import (
    DATA_ROOT,
    DEFAULT_PLOTS,
    hyper_config,
    log,
    people_text,
    pyplot,
    run_jobs,
    table,
    train_fixed,
    train_run,
    verdict,
)

TOLERANCE = 0.01  # target: HyperMorph Dice >= fixed-λ Dice - TOLERANCE
GRID = [round(0.05 * i, 2) for i in range(21)]


def _arm_job(config, arm: str, lam: float | None, lambdas: list[float], reuse: bool) -> dict:
    """Train (or reuse) one run and evaluate it on the held-out people; the result dict."""
    from hyperreg.config import to_dict
    from hyperreg.method.model import load_checkpoint
    from hyperreg.training.train import prepare_data, training_objective
    from hyperreg.training.validation import evaluate

    out = Path(config.out)
    saved = out / "result.json"
    key = {"config": to_dict(config), "arm": arm, "lam": lam, "lambdas": lambdas}
    if reuse and saved.is_file():
        result = json.loads(saved.read_text())
        if result.get("key") == key:
            log(f"{out.name}: reusing its evaluation")
            return result
    if arm == "hyper":
        diverged_at, seconds = train_run(config, reuse)
    else:
        if out.exists():
            shutil.rmtree(out)
        log(f"{out.name}: training {config.steps} steps at λ = {lam:g}")
        diverged_at, seconds, model = train_fixed(config, lam)
    result = {
        "key": key,
        "diverged_at": diverged_at,
        "seconds": seconds,
        "dice": {},
        "folding_pct": {},
    }
    if diverged_at is None:
        if arm == "hyper":
            model, _ = load_checkpoint(out / "model.pt")
        at = lambdas
        _, pairs, _ = prepare_data(config)
        model.objective = training_objective(config)
        row = evaluate(model, pairs, at)
        for value in at:
            result["dice"][f"{value:g}"] = row[f"dice_{value:g}"]
            result["folding_pct"][f"{value:g}"] = row[f"folding_pct_{value:g}"]
        result["pairs"] = [pair.name for pair in pairs]
    result["split"] = json.loads((out / "split.json").read_text())
    saved.write_text(json.dumps(result, indent=1) + "\n")
    log(f"{out.name}: {seconds:.0f} s, Dice {result['dice']}")
    return result


def _plot(path: Path, grid_rows: list[dict], rows: list[dict], dice_before: float, lam_star):
    plt = pyplot()
    fig, (ax_dice, ax_fold) = plt.subplots(1, 2, figsize=(11, 4.2))
    lams = [r["lam"] for r in grid_rows]
    ax_dice.plot(lams, [r["dice"] for r in grid_rows], "-o", ms=3, label="HyperMorph (one model)")
    ax_dice.plot(
        [r["lam"] for r in rows],
        [r["fixed_dice"] for r in rows],
        "s",
        ms=7,
        color="C3",
        label="fixed-λ models (one per λ)",
    )
    ax_dice.axhline(dice_before, ls=":", color="grey", label="before registration")
    ax_dice.axvline(lam_star, ls="--", color="C2", lw=1, label=f"λ* = {lam_star:g}")
    ax_dice.set_xlabel("λ (regularisation weight)")
    ax_dice.set_ylabel("mean Dice (held-out people)")
    ax_dice.set_title("Dice vs λ")
    ax_dice.legend(fontsize=8)
    ax_fold.plot(lams, [r["folding_pct"] for r in grid_rows], "-o", ms=3, label="HyperMorph")
    ax_fold.plot(
        [r["lam"] for r in rows],
        [r["fixed_folding_pct"] for r in rows],
        "s",
        ms=7,
        color="C3",
        label="fixed-λ models",
    )
    ax_fold.set_xlabel("λ (regularisation weight)")
    ax_fold.set_ylabel("folding (% of pixels with J ≤ 0)")
    ax_fold.set_title("Folding vs λ")
    ax_fold.legend(fontsize=8)
    for ax in (ax_dice, ax_fold):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _score(result: dict, lams: Sequence[float]) -> float:
    values = [result["dice"].get(f"{lam:g}", math.nan) for lam in lams]
    return math.fsum(values) / len(values) if all(math.isfinite(v) for v in values) else -math.inf


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared data folder")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per model")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2],
        help="Adam learning rates every model trains at (default 1e-4 … 1e-2)",
    )
    parser.add_argument(
        "--lambdas",
        type=float,
        nargs="+",
        default=[0.1, 0.3, 0.5, 0.7, 0.9],
        help="λ of the fixed-λ models (default 0.1 0.3 0.5 0.7 0.9)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--val-every",
        type=int,
        default=50,
        help="HyperMorph's validation during training (bench_mip's setting)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--jobs", type=int, default=1, help="models trained at once, one torch thread each"
    )
    parser.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOTS)
    parser.add_argument("--work", type=Path, default=None, help="folder for the run folders")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse finished runs in --work with the same configuration",
    )
    args = parser.parse_args(argv)
    if min(args.steps, args.batch_size, args.jobs, args.val_every) < 1 or not all(
        lr > 0 for lr in args.lrs
    ):
        parser.error("--steps, --batch-size, --jobs and --val-every must be >= 1 and --lrs > 0")
    if not all(0.0 <= lam <= 1.0 for lam in args.lambdas):
        parser.error(f"--lambdas must lie in [0, 1], got {args.lambdas}")
    fixed_lambdas = sorted({round(lam, 4) for lam in args.lambdas})
    lrs = sorted(set(args.lrs))
    # absolute: run configs (and so --reuse) must not depend on the working directory
    work = (args.work or Path(tempfile.mkdtemp(prefix="bench_accuracy_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    settings = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "device": args.device,
    }
    eval_lambdas = sorted(set(GRID) | set(fixed_lambdas))
    tasks, keys = [], []
    for lr in lrs:
        config = hyper_config(args.data, work, "mip", lr, val_every=args.val_every, **settings)
        tasks.append((config, "hyper", None, eval_lambdas, args.reuse))
        keys.append(("hyper", None, lr))
    for lam in fixed_lambdas:
        for lr in lrs:
            folder = work / f"fixed_lam{lam:g}_lr{lr:g}_seed{args.seed}"
            config = hyper_config(args.data, work, "mip", lr, folder=folder, **settings)
            tasks.append((config, "fixed", lam, [lam], args.reuse))
            keys.append(("fixed", lam, lr))
    results = dict(zip(keys, run_jobs(_arm_job, tasks, args.jobs)))

    best_hyper = max(lrs, key=lambda lr: _score(results[("hyper", None, lr)], fixed_lambdas))
    best_fixed = {
        lam: max(lrs, key=lambda lr, lam=lam: _score(results[("fixed", lam, lr)], [lam]))
        for lam in fixed_lambdas
    }
    hyper = results[("hyper", None, best_hyper)]
    if not hyper["dice"]:
        raise SystemExit("bench_accuracy: every HyperMorph run diverged")
    dice_at = {float(k): v for k, v in hyper["dice"].items()}
    fold_at = {float(k): v for k, v in hyper["folding_pct"].items()}
    grid_rows = [{"lam": lam, "dice": dice_at[lam], "folding_pct": fold_at[lam]} for lam in GRID]
    star = max(grid_rows, key=lambda r: -math.inf if math.isnan(r["dice"]) else r["dice"])
    rows = []
    for lam in fixed_lambdas:
        fixed = results[("fixed", lam, best_fixed[lam])]
        fixed_dice = fixed["dice"].get(f"{lam:g}", math.nan)
        rows.append(
            {
                "lam": lam,
                "lr": best_fixed[lam],
                "hyper_dice": dice_at[lam],
                "fixed_dice": fixed_dice,
                "difference": dice_at[lam] - fixed_dice,
                "met": bool(dice_at[lam] >= fixed_dice - TOLERANCE),
                "hyper_folding_pct": fold_at[lam],
                "fixed_folding_pct": fixed["folding_pct"].get(f"{lam:g}", math.nan),
            }
        )
    import numpy as np

    from hyperreg.method.metrics import mean_dice
    from hyperreg.training.train import prepare_data

    _, pairs, _ = prepare_data(tasks[0][0])
    labelled = [p for p in pairs if p.moving_seg is not None and p.fixed_seg is not None]
    dice_before = float(np.nanmean([mean_dice(p.moving_seg, p.fixed_seg) for p in labelled]))
    _plot(args.plot_dir / "accuracy_vs_lambda.png", grid_rows, rows, dice_before, star["lam"])
    checkpoint = Path(hyper["key"]["config"]["out"]) / "model.pt"
    record = {
        "model": str(checkpoint.resolve()),
        "lam_star": star["lam"],
        "lam_star_dice": star["dice"],
        "dice_before": dice_before,
        "rows": rows,
        "grid": grid_rows,
        "hypermorph_lr": best_hyper,
        "lr_grid": {
            f"{arm} {lam if lam is not None else ''} lr {lr:g}": r["dice"]
            for (arm, lam, lr), r in results.items()
        },
        "steps": args.steps,
        "seed": args.seed,
        "val_pairs": hyper.get("pairs", []),
        "split": hyper["split"],
    }
    (work / "accuracy.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {work / 'accuracy.json'} and {args.plot_dir / 'accuracy_vs_lambda.png'}")

    lam_list = ", ".join(f"{lam:g}" for lam in fixed_lambdas)
    lr_list = ", ".join(f"{lr:g}" for lr in lrs)
    print(
        f"One HyperMorph model (MIP, λ per sample: U(0, 1) with 20 % at 0 or 1) and "
        f"{len(fixed_lambdas)} fixed-λ models (λ ∈ {{{lam_list}}}; the same pipeline with "
        f"ordinary trainable U-Net weights, no hypernetwork), each trained for {args.steps} "
        f"steps, batch {args.batch_size}, seed {args.seed}, on the same stream of pairs of 2D "
        f"slices at 1.5 mm, with loss (1 − λ)·NCC(9) + λ·2·Grad-l2 of the velocity and the "
        f"default 2D U-Net: {people_text(hyper['split'])}. Every model trained at each Adam lr "
        f"of {{{lr_list}}} and is shown at its best (HyperMorph: {best_hyper:g}, by mean Dice "
        f"over the {len(fixed_lambdas)} λ; each fixed model by Dice at its λ, column lr), "
        f"picked on these same pairs. Dice is the mean over the labels present in both maps, "
        f"averaged over pairs; folding is the percentage of pixels with J ≤ 0. Device "
        f"{args.device}, {args.jobs} model(s) at once, one thread each."
    )
    print()
    header = [
        "λ",
        "HyperMorph Dice",
        "fixed-λ Dice",
        "fixed lr",
        "HyperMorph − fixed",
        f"target (≥ fixed − {TOLERANCE:g})",
        "folding % HyperMorph",
        "folding % fixed",
    ]
    cells = [
        [
            f"{r['lam']:g}",
            f"{r['hyper_dice']:.4f}",
            f"{r['fixed_dice']:.4f}",
            f"{r['lr']:g}",
            f"{r['difference']:+.4f}",
            verdict(r["met"]),
            f"{r['hyper_folding_pct']:.3f}",
            f"{r['fixed_folding_pct']:.3f}",
        ]
        for r in rows
    ]
    print(table(header, cells))
    print()
    header = ["model", *(f"lr {lr:g}" for lr in lrs)]

    def cell(result: dict, lams: Sequence[float]) -> str:
        if result["diverged_at"] is not None:
            return f"diverged at step {result['diverged_at']}"
        score = _score(result, lams)
        return f"{score:.4f}" if math.isfinite(score) else "collapsed (Dice NaN: no label left)"

    grid_cells = [
        [
            "HyperMorph (mean over the λ)",
            *(cell(results[("hyper", None, lr)], fixed_lambdas) for lr in lrs),
        ]
    ]
    grid_cells += [
        [f"fixed λ = {lam:g}", *(cell(results[("fixed", lam, lr)], [lam]) for lr in lrs)]
        for lam in fixed_lambdas
    ]
    print("Dice per lr (the grid the best lr was picked from):")
    print()
    print(table(header, grid_cells))
    print()
    print(f"Dice before registration: {dice_before:.4f}.")
    print()
    print(
        f"λ* (best HyperMorph Dice on the grid 0, 0.05, …, 1) = {star['lam']:g}, Dice "
        f"{star['dice']:.4f}, folding {star['folding_pct']:.3f} %."
    )
    print()
    missed = [f"{r['lam']:g}" for r in rows if not r["met"]]
    overall = verdict(not missed)
    detail = f"MISSED at λ = {', '.join(missed)}" if missed else "met at every λ"
    print(
        f"Verdict: {overall} — HyperMorph Dice ≥ fixed-λ Dice − {TOLERANCE:g} {detail} "
        f"({len(rows) - len(missed)}/{len(rows)}), each at its best lr, on people never "
        "trained on."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
