"""Accuracy against fixed-λ models: one HyperMorph model vs one VoxelMorph-style model per λ.

On 2D coronal slices (axis 2) of the shared OASIS volumes, trains one HyperMorph model (λ per
sample from :class:`hyperreg.training.data.LambdaSampler`) and, for each ``--lambdas`` value, one
model of the identical pipeline (padding, U-Net, scaling and squaring at half resolution, resize,
warp) whose U-Net weights are ordinary trainable parameters initialised from ``UNet.init_std`` (as
``FixedWeightUNet``), trained at that constant λ. Every model goes through the same loop
(:func:`_train`): the same pair stream (its own generator, seeded by ``--seed``), steps, batch,
Adam lr, loss (:func:`hyperreg.training.train.hypermorph_loss`, NCC) and default
``ModelConfig(ndim=2)``; only the λ source differs. Evaluation runs
:func:`hyperreg.training.validation.evaluate` (so :func:`hyperreg.registration.pairs.register_pair`)
on the held-out brain slices (every 10th, as ``PairSampler(holdout_every=10)`` sets aside) in
both directions: HyperMorph on the λ grid 0, 0.05, …, 1 and at each fixed λ, each fixed model
at its own λ. Reports mean Dice and folding % (J ≤ 0) per λ, the target HyperMorph Dice ≥
fixed Dice − 0.01, and λ* (best HyperMorph grid Dice). Writes ``accuracy_vs_lambda.png`` into
``--plot-dir``, and ``accuracy.json`` (with the saved HyperMorph checkpoint and λ*) into
``--work``.

    python benchmarks/bench_accuracy.py --steps 1500 --batch-size 4 --lr 1e-3 \\
        --lambdas 0.1 0.3 0.5 0.7 0.9 --device cpu --threads 1 --work runs/accuracy
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import (
    DEFAULT_DATA,
    DEFAULT_PLOTS,
    FIXED,
    MOVING,
    log,
    pyplot,
    require_data,
    table,
    verdict,
)

HOLDOUT_EVERY = 10
SLICE_AXIS = 2
TOLERANCE = 0.01  # target: HyperMorph Dice >= fixed-λ Dice - TOLERANCE
GRID = [round(0.05 * i, 2) for i in range(21)]


def _fixed_model_class():
    """The fixed-λ model class (built lazily so ``--help`` does not import torch)."""
    import torch
    from torch import Tensor, nn

    from hyperreg.method.model import HyperMorph

    class FixedLambdaMorph(HyperMorph):
        """HyperMorph's pipeline with ordinary U-Net weights in place of the hypernetwork.

        ``generate_weights`` returns the same trainable weights for every λ, so ``forward``,
        ``register_pair`` and ``evaluate`` run unchanged; λ only enters through the loss the
        model was trained with. Weights are drawn like ``FixedWeightUNet``'s (``UNet.init_std``).
        """

        def __init__(self, config) -> None:
            super().__init__(config)
            del self.hypernet
            stds = self.unet.init_std()
            self.weights = nn.ParameterDict(
                {
                    name.replace(".", "_"): nn.Parameter(torch.randn(shape) * stds[name])
                    for name, shape in self.unet.param_shapes().items()
                }
            )

        def generate_weights(self, lam: Tensor) -> dict[str, Tensor]:
            count = lam.shape[0]
            return {
                name: self.weights[name.replace(".", "_")].expand(count, *shape)
                for name, shape in self.unet.param_shapes().items()
            }

    return FixedLambdaMorph


def _train(
    model,
    sampler,
    lam_source: Callable[[int, Any], Any],
    config,
    device,
    label: str,
) -> tuple[float, float]:
    """Train ``model`` in place; return ``(median seconds per step, total seconds)``.

    ``lam_source(batch, generator)`` gives a ``(B,)`` tensor (one λ per sample) or a float (one
    λ for the batch). Pairs come from their own generator seeded by ``config.seed``, so every
    model sees the same pairs in the same order whatever its λ source draws.
    """
    import torch

    from hyperreg.training.train import hypermorph_loss

    pair_generator = torch.Generator().manual_seed(config.seed)
    lam_generator = torch.Generator().manual_seed(config.seed + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    model.train()
    every = max(1, config.steps // 10)
    times: list[float] = []
    start = time.perf_counter()
    for step in range(1, config.steps + 1):
        tick = time.perf_counter()
        moving, fixed = sampler.sample(config.batch_size, pair_generator)
        lam = lam_source(config.batch_size, lam_generator)
        moving, fixed = moving.to(device), fixed.to(device)
        lam_model = lam.to(device) if isinstance(lam, torch.Tensor) else lam
        lam_loss = torch.as_tensor(lam, dtype=torch.float32).expand(config.batch_size)
        out = model(moving, fixed, lam_model)
        loss, _, _ = hypermorph_loss(out, fixed, lam_loss.to(device), config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"{label}: loss became non-finite at step {step}")
        times.append(time.perf_counter() - tick)
        if step % every == 0 or step == config.steps:
            seconds = time.perf_counter() - start
            log(f"{label}: step {step}/{config.steps} loss {value:.4f} ({seconds:.0f} s)")
    return statistics.median(times), time.perf_counter() - start


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
    ax_dice.set_ylabel("mean Dice (held-out slices)")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="neurite-oasis folder")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per model")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument(
        "--lambdas",
        type=float,
        nargs="+",
        default=[0.1, 0.3, 0.5, 0.7, 0.9],
        help="λ of the fixed-λ models (default 0.1 0.3 0.5 0.7 0.9)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (default 0: torch's default); 1 avoids oversubscription when "
        "other work shares the CPUs",
    )
    parser.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOTS)
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the checkpoint and accuracy.json"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or not args.lr > 0:
        parser.error("--steps and --batch-size must be >= 1 and --lr > 0")
    if not all(0.0 <= lam <= 1.0 for lam in args.lambdas):
        parser.error(f"--lambdas must lie in [0, 1], got {args.lambdas}")
    fixed_lambdas = sorted({round(lam, 4) for lam in args.lambdas})
    files = ("aligned_norm.nii.gz", "aligned_seg35.nii.gz")
    names = [f"{subject}/{name}" for subject in (MOVING, FIXED) for name in files]
    require_data(args.data, *names)

    import numpy as np
    import torch

    from hyperreg.config import ModelConfig, TrainConfig, to_dict
    from hyperreg.training.data import LambdaSampler, PairSampler, find_scans, validation_pairs
    from hyperreg.method.metrics import mean_dice
    from hyperreg.method.model import HyperMorph, save_checkpoint
    from hyperreg.training.validation import evaluate

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_accuracy_"))
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    config = TrainConfig(
        data=str(args.data),
        out=str(work),
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        sim="ncc",
        seed=args.seed,
        device=args.device,
        slice_axis=SLICE_AXIS,
        holdout_every=HOLDOUT_EVERY,
        model=ModelConfig(ndim=2),
    )

    scans = find_scans(args.data, 2)
    by_name = {scan.name: scan for scan in scans}
    log(f"loading {len(scans)} subjects from {args.data}")
    sampler = PairSampler(scans, 2, slice_axis=SLICE_AXIS, holdout_every=HOLDOUT_EVERY)
    held = sampler.heldout_slices
    directions = [(by_name[MOVING], by_name[FIXED]), (by_name[FIXED], by_name[MOVING])]
    pairs = validation_pairs(
        directions, 2, slice_axis=SLICE_AXIS, slices=held, max_pairs=len(directions) * len(held)
    )
    dice_before = float(np.nanmean([mean_dice(p.moving_seg, p.fixed_seg) for p in pairs]))
    log(f"{len(sampler.slices)} training slices, {len(pairs)} validation pairs")

    # HyperMorph: one model, λ per sample.
    torch.manual_seed(args.seed)
    hyper = HyperMorph(config.model).to(device)
    lam_sampler = LambdaSampler(config.lam_endpoint_fraction)
    hyper_step, hyper_total = _train(
        hyper, sampler, lam_sampler.sample, config, device, "HyperMorph"
    )
    checkpoint = save_checkpoint(
        hyper, work / "hypermorph.pt", step=args.steps, train_config=to_dict(config)
    )
    eval_lambdas = sorted(set(GRID) | set(fixed_lambdas))
    log(f"evaluating HyperMorph at {len(eval_lambdas)} λ values")
    tick = time.perf_counter()
    hyper_eval = evaluate(hyper, pairs, eval_lambdas, config.sim, config.ncc_window)
    log(f"evaluated in {time.perf_counter() - tick:.0f} s")
    grid_rows = [
        {
            "lam": lam,
            "dice": hyper_eval[f"dice_{lam:g}"],
            "folding_pct": hyper_eval[f"folding_pct_{lam:g}"],
        }
        for lam in eval_lambdas
    ]
    on_grid = [r for r in grid_rows if r["lam"] in GRID]
    star = max(on_grid, key=lambda r: -math.inf if math.isnan(r["dice"]) else r["dice"])
    del hyper

    # Fixed-λ models: same loop, λ constant.
    fixed_cls = _fixed_model_class()
    rows: list[dict] = []
    fixed_steps: list[float] = []
    fixed_totals: list[float] = []
    for lam in fixed_lambdas:
        torch.manual_seed(args.seed)
        model = fixed_cls(config.model).to(device)
        per_step, total = _train(
            model, sampler, lambda n, g, lam=lam: lam, config, device, f"fixed λ={lam:g}"
        )
        fixed_steps.append(per_step)
        fixed_totals.append(total)
        fixed_eval = evaluate(model, pairs, [lam], config.sim, config.ncc_window)
        hyper_row = next(r for r in grid_rows if r["lam"] == lam)
        fixed_dice = fixed_eval[f"dice_{lam:g}"]
        rows.append(
            {
                "lam": lam,
                "hyper_dice": hyper_row["dice"],
                "fixed_dice": fixed_dice,
                "difference": hyper_row["dice"] - fixed_dice,
                "met": bool(hyper_row["dice"] >= fixed_dice - TOLERANCE),
                "hyper_folding_pct": hyper_row["folding_pct"],
                "fixed_folding_pct": fixed_eval[f"folding_pct_{lam:g}"],
            }
        )
        del model

    _plot(args.plot_dir / "accuracy_vs_lambda.png", on_grid, rows, dice_before, star["lam"])
    fixed_step = float(np.median(fixed_steps))
    record = {
        "model": str(checkpoint.resolve()),
        "lam_star": star["lam"],
        "lam_star_dice": star["dice"],
        "dice_before": dice_before,
        "rows": rows,
        "grid": grid_rows,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "data": str(args.data),
        "device": args.device,
        "threads": torch.get_num_threads(),
        "val_slices": held.tolist(),
        "val_pairs": [p.name for p in pairs],
        "seconds_per_step": {"hypermorph": hyper_step, "fixed": fixed_step},
        "train_seconds": {"hypermorph": hyper_total, "fixed": fixed_totals},
        "train_config": to_dict(config),
    }
    (work / "accuracy.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {work / 'accuracy.json'} and {args.plot_dir / 'accuracy_vs_lambda.png'}")

    subjects = ", ".join(sorted(by_name))
    device_text = args.device
    if device.type == "cpu":
        device_text += f", {torch.get_num_threads()} thread(s)"
    shape = "×".join(str(s) for s in sampler.spatial_shape)
    lam_list = ", ".join(f"{lam:g}" for lam in fixed_lambdas)
    print(
        f"One HyperMorph model (λ per sample: U(0, 1) with {config.lam_endpoint_fraction:.0%} "
        f"at 0 or 1) and {len(fixed_lambdas)} fixed-λ models (λ ∈ {{{lam_list}}}; the same "
        "pipeline with ordinary trainable U-Net weights, no hypernetwork) were each trained "
        f"for {args.steps} steps, batch {args.batch_size}, Adam lr {args.lr:g}, seed "
        f"{args.seed}, on the same stream of subject-to-subject pairs of 2D coronal slices "
        f"(axis {SLICE_AXIS}, {shape}) of {len(scans)} OASIS subjects ({subjects}), with loss "
        f"(1 − λ)·NCC(window {config.ncc_window}) + λ·Grad on the velocity and the default "
        f"2D U-Net (encoder {'/'.join(map(str, config.model.enc_channels))}). Only "
        f"{len(scans)} subjects exist, so nothing is held out by subject: evaluation is on the "
        f"{len(held)} brain slices held out from training (every {HOLDOUT_EVERY}th; indices "
        f"{', '.join(map(str, held.tolist()))}) of the same subjects, registered in both "
        f"directions ({len(pairs)} pairs). Dice is the mean over the aligned_seg35 labels "
        "present in both slices, averaged over pairs; folding is the percentage of pixels with "
        f"J ≤ 0. Training time on {device_text} (median per step): {hyper_step:.3f} s for "
        f"HyperMorph, {fixed_step:.3f} s for a fixed-λ model."
    )
    print()
    header = [
        "λ",
        "HyperMorph Dice",
        "fixed-λ Dice",
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
            f"{r['difference']:+.4f}",
            verdict(r["met"]),
            f"{r['hyper_folding_pct']:.3f}",
            f"{r['fixed_folding_pct']:.3f}",
        ]
        for r in rows
    ]
    print(table(header, cells))
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
        f"({len(rows) - len(missed)}/{len(rows)})."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
