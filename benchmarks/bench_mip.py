"""MIP against the default parametrisation: validation loss and Dice against training steps.

For each seed (``--seeds``) and each hypernetwork parametrisation (``"mip"`` and ``"default"``,
:class:`hyperreg.config.ModelConfig`), trains a 2D HyperMorph model with
:func:`hyperreg.training.train.train` on the shared OASIS data, with the same steps, batch size,
Adam lr, loss (NCC), pair stream and λ draws (both seeded by the seed); only the parametrisation
differs.
Every ``--val-every`` steps training validates (:func:`hyperreg.training.validation.evaluate`) at
the ``--val-lambdas`` values: the HyperMorph validation loss ``(1 − λ)·NCC + λ·gradient_loss`` per λ
and its mean over λ (``val_loss``), and mean Dice. With the 2 subjects of the shared data nothing
can be held out by subject, so validation runs on held-out brain slices (every 10th coronal
slice, never trained on) of the same 2 subjects. A run whose loss becomes non-finite is recorded
as diverged.

Reports, per seed and for the seed-mean curves, the first validation step at which MIP's
validation loss is at or below the default's final validation loss, as a fraction of the steps;
the target (DESIGN.md §5) is ≤ 50 %. Writes ``mip_vs_default.png`` (validation loss and mean
Dice against step, a thin line per seed, a thick seed mean per parametrisation) into
``--plot-dir``, and the run folders (``val_log.csv``, ``train_log.csv``, checkpoints) into
``--work``.

    python benchmarks/bench_mip.py --steps 1500 --val-every 50 --seeds 0 1 2 \\
        --batch-size 4 --lr 1e-3 --device cpu --work runs/bench_mip
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _common import DEFAULT_DATA, DEFAULT_PLOTS, FIXED, MOVING, log, pyplot, require_data, table
from _common import verdict

PARAMETRIZATIONS = ("default", "mip")  # baseline first
LABELS = {"default": "default", "mip": "MIP"}
COLOURS = {"default": "tab:blue", "mip": "tab:orange"}
TARGET = 0.5  # MIP must reach the default's final validation loss within this share of the steps


@dataclass
class Run:
    """One training run's validation curve (steps, val_loss, mean Dice) and its fate."""

    parametrization: str
    seed: int
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    dice: list[float] = field(default_factory=list)
    diverged_at: int | None = None  # step where the training loss became non-finite
    seconds: float = 0.0  # wall time of the training call
    step_seconds: float = math.nan  # median time of a training step
    val_seconds: float = math.nan  # mean time of one validation

    @property
    def final_loss(self) -> float:
        return self.loss[-1] if self.loss and self.diverged_at is None else math.nan

    @property
    def final_dice(self) -> float:
        return self.dice[-1] if self.dice and self.diverged_at is None else math.nan


def _read_curve(run: Run, folder: Path) -> None:
    """Fill ``run`` from ``val_log.csv`` and its timings from ``train_log.csv``."""
    path = folder / "val_log.csv"
    if path.is_file():
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                run.steps.append(int(row["step"]))
                run.loss.append(float(row["val_loss"]))
                run.dice.append(float(row["mean_dice"]))
    path = folder / "train_log.csv"
    if not path.is_file():
        return
    with path.open(newline="") as handle:
        rows = [(int(r["step"]), float(r["seconds"])) for r in csv.DictReader(handle)]
    # train_log's "seconds" is written before that step's validation, so the step after a
    # validation carries the validation's time on top of its own
    gaps = {step: now - before for (_, before), (step, now) in itertools.pairwise(rows)}
    validated = set(run.steps)
    plain = [gap for step, gap in gaps.items() if step - 1 not in validated]
    after = [gap for step, gap in gaps.items() if step - 1 in validated]
    if plain:
        run.step_seconds = statistics.median(plain)
    if after:
        run.val_seconds = statistics.mean(after) - run.step_seconds


def _train_run(args: argparse.Namespace, parametrization: str, seed: int) -> Run:
    from hyperreg.config import ModelConfig, TrainConfig, to_dict
    from hyperreg.training.train import train

    folder = args.work / f"{parametrization}_seed{seed}"
    config = TrainConfig(
        data=str(args.data),
        out=str(folder),
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        sim="ncc",
        seed=seed,
        device=args.device,
        val_every=args.val_every,
        val_lambdas=tuple(args.val_lambdas),
        val_max_pairs=args.val_max_pairs,
        checkpoint_every=args.steps,
        keep_checkpoints=1,
        model=ModelConfig(ndim=2, parametrization=parametrization),
    )
    run = Run(parametrization, seed)
    done = folder / "model.pt"
    saved = folder / "config.json"
    if (
        args.reuse
        and done.is_file()
        and saved.is_file()
        and json.loads(saved.read_text()) == to_dict(config)
    ):
        log(f"{parametrization} seed {seed}: reusing finished run in {folder}")
        _read_curve(run, folder)
        return run
    if folder.exists():
        shutil.rmtree(folder)  # no stale checkpoints or logs from an earlier run
    log(f"{parametrization} seed {seed}: training {args.steps} steps -> {folder}")
    start = time.perf_counter()
    try:
        train(config, progress=False)
    except RuntimeError as err:
        if "non-finite" not in str(err):
            raise
        digits = "".join(ch for ch in str(err).rsplit("step", 1)[-1] if ch.isdigit())
        run.diverged_at = int(digits) if digits else -1
        log(f"{parametrization} seed {seed}: diverged: {err}")
    run.seconds = time.perf_counter() - start
    _read_curve(run, folder)
    log(
        f"{parametrization} seed {seed}: {run.seconds:.1f} s, final val loss "
        f"{run.final_loss:.4f}, final Dice {run.final_dice:.4f}"
    )
    return run


def _reach(steps: Sequence[int], loss: Sequence[float], target: float) -> int | None:
    """First step whose validation loss is ≤ ``target``, or None."""
    if not math.isfinite(target):
        return None
    for step, value in zip(steps, loss):
        if math.isfinite(value) and value <= target:
            return step
    return None


def _mean_curve(runs: Sequence[Run]) -> tuple[list[int], list[float], list[float]]:
    """Seed means of val_loss and Dice at the steps every non-diverged run validated."""
    kept = [run for run in runs if run.diverged_at is None and run.steps]
    if not kept:
        return [], [], []
    steps = sorted(set.intersection(*(set(run.steps) for run in kept)))
    loss, dice = [], []
    for step in steps:
        rows = [run.steps.index(step) for run in kept]
        loss.append(statistics.fmean(run.loss[i] for run, i in zip(kept, rows)))
        dice.append(statistics.fmean(run.dice[i] for run, i in zip(kept, rows)))
    return steps, loss, dice


def _row(
    name: str,
    total: int,
    default_final: float,
    mip_final: float,
    mip_steps: Sequence[int],
    mip_loss: Sequence[float],
    dice_default: float,
    dice_mip: float,
    note_default: str = "",
    note_mip: str = "",
) -> tuple[list[str], bool | None]:
    """A table row and whether the target was met (None: undefined, the default diverged)."""
    reached = _reach(mip_steps, mip_loss, default_final)
    if note_default:
        # no final loss to reach; MIP "meets" the target only by training at all
        ok = None if note_mip else True
        steps_text, fraction_text = "n/a", "n/a"
    elif note_mip:
        ok, steps_text, fraction_text = False, "n/a", "n/a"
    elif reached is None:
        ok, steps_text, fraction_text = False, f"not reached in {total}", "> 1"
    else:
        ok = reached / total <= TARGET
        steps_text, fraction_text = str(reached), f"{reached / total:.0%}"

    def number(value: float, note: str, digits: int) -> str:
        return note or f"{value:.{digits}f}"

    cells = [
        name,
        number(default_final, note_default, 4),
        number(mip_final, note_mip, 4),
        steps_text,
        fraction_text,
        "n/a" if ok is None else verdict(ok) + (" (default diverged)" if note_default else ""),
        number(dice_default, note_default, 3),
        number(dice_mip, note_mip, 3),
    ]
    return cells, ok


def _plot(runs: dict[tuple[str, int], Run], seeds: Sequence[int], path: Path, total: int) -> None:
    plt = pyplot()
    fig, (ax_loss, ax_dice) = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in PARAMETRIZATIONS:
        group = [runs[(p, seed)] for seed in seeds]
        for index, run in enumerate(group):
            label = f"{LABELS[p]}, one line per seed" if index == 0 else None
            if run.diverged_at is not None:
                label = (label or f"{LABELS[p]}") + " (× = diverged)"
            for ax, values in ((ax_loss, run.loss), (ax_dice, run.dice)):
                ax.plot(run.steps, values, color=COLOURS[p], lw=0.8, alpha=0.45, label=label)
                if run.diverged_at is not None and run.steps:
                    ax.plot(run.steps[-1], values[-1], "x", color=COLOURS[p])
        steps, loss, dice = _mean_curve(group)
        if steps:
            ax_loss.plot(steps, loss, color=COLOURS[p], lw=2.5, label=f"{LABELS[p]}, seed mean")
            ax_dice.plot(steps, dice, color=COLOURS[p], lw=2.5, label=f"{LABELS[p]}, seed mean")
    _, default_mean, _ = _mean_curve([runs[("default", seed)] for seed in seeds])
    if default_mean:
        ax_loss.axhline(
            default_mean[-1], color="grey", ls=":", lw=1, label="default's final (seed mean)"
        )
    for ax in (ax_loss, ax_dice):
        ax.axvline(TARGET * total, color="grey", ls="--", lw=1, label="target: 50 % of steps")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    ax_loss.set_ylabel("validation loss (mean over λ)")
    ax_dice.set_ylabel("validation mean Dice (mean over λ)")
    ax_loss.set_title("validation loss")
    ax_dice.set_title("validation Dice")
    ax_loss.legend(fontsize=8)
    ax_dice.legend(fontsize=8)
    fig.suptitle(f"MIP vs default parametrisation (seeds {', '.join(map(str, seeds))})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_seconds(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    return f"{statistics.median(finite):.2f}" if finite else "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="neurite-oasis folder")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per run")
    parser.add_argument("--val-every", type=int, default=50, help="steps between validations")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (both runs)")
    parser.add_argument(
        "--val-lambdas",
        type=float,
        nargs="+",
        default=[0.1, 0.5, 0.9],
        help="λ values of validation (default 0.1 0.5 0.9)",
    )
    parser.add_argument(
        "--val-max-pairs",
        type=int,
        default=16,
        help="cap on held-out slice pairs per validation (TrainConfig.val_max_pairs; default 16)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOTS)
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the run folders (default: a temp dir)"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse finished runs in --work whose config.json matches (else retrain)",
    )
    args = parser.parse_args(argv)
    counts = (args.steps, args.batch_size, args.val_every, args.val_max_pairs)
    if min(counts) < 1 or not args.lr > 0:
        parser.error(
            "--steps, --val-every, --batch-size and --val-max-pairs must be >= 1 and --lr > 0"
        )
    if not all(0.0 <= lam <= 1.0 for lam in args.val_lambdas):
        parser.error(f"--val-lambdas must lie in [0, 1], got {args.val_lambdas}")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct, got {args.seeds}")
    names = [
        f"{s}/{f}" for s in (MOVING, FIXED) for f in ("aligned_norm.nii.gz", "aligned_seg35.nii.gz")
    ]
    require_data(args.data, *names)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench_mip_"))
    args.work.mkdir(parents=True, exist_ok=True)
    log(f"run folders in {args.work}")

    runs: dict[tuple[str, int], Run] = {}
    for seed in args.seeds:
        for p in PARAMETRIZATIONS:
            runs[(p, seed)] = _train_run(args, p, seed)

    split_path = args.work / f"mip_seed{args.seeds[0]}" / "split.json"
    split = json.loads(split_path.read_text()) if split_path.is_file() else {}
    every = len(split.get("val_pairs", []))
    lambdas = ", ".join(f"{lam:g}" for lam in args.val_lambdas)
    all_runs = list(runs.values())
    print(
        f"2D HyperMorph (default `ModelConfig(ndim=2)`: U-Net 16/32/32/32, hypernetwork 4 × 64, "
        f"velocity integrated in 7 steps at half resolution), trained with "
        f"`hyperreg.training.train.train` "
        f"for {args.steps} steps per run, batch {args.batch_size}, Adam lr {args.lr:g}, NCC "
        f"similarity, λ per sample (uniform plus 20 % endpoints), on coronal slices of the shared "
        f"OASIS volumes (`{args.data.name}`, 2 subjects), once with the MIP and "
        f"once with the default hypernetwork parametrisation per seed (seeds "
        f"{', '.join(map(str, args.seeds))}; the same pair stream and λ draws for both). "
        f"Validation every {args.val_every} steps at λ = {lambdas}: validation loss = mean over "
        f"λ of (1 − λ)·NCC + λ·gradient loss of the velocity (the training objective), and mean "
        f"Dice. With only 2 subjects nothing is held out by subject: validation runs on "
        f"{every or 'the'} held-out slice pairs (every 10th brain slice, never trained on) of "
        f'the same 2 subjects. "Steps MIP needs" is the first validation step at which MIP\'s '
        f"validation loss is ≤ the default's final one (same seed; resolution {args.val_every} "
        f"steps). Device {args.device}: {_fmt_seconds([r.step_seconds for r in all_runs])} s "
        f"per training step, {_fmt_seconds([r.val_seconds for r in all_runs])} s per validation "
        f"(medians over runs)."
    )
    print()

    header = [
        "seed",
        "default final val loss",
        "MIP final val loss",
        "steps MIP needs to reach default's final",
        "fraction of steps",
        "target ≤ 50 %",
        "final Dice default",
        "final Dice MIP",
    ]
    rows, results = [], []
    for seed in args.seeds:
        default, mip = runs[("default", seed)], runs[("mip", seed)]
        cells, ok = _row(
            str(seed),
            args.steps,
            default.final_loss,
            mip.final_loss,
            mip.steps,
            mip.loss,
            default.final_dice,
            mip.final_dice,
            f"diverged at step {default.diverged_at}" if default.diverged_at is not None else "",
            f"diverged at step {mip.diverged_at}" if mip.diverged_at is not None else "",
        )
        rows.append(cells)
        results.append(ok)
    mean = {p: _mean_curve([runs[(p, seed)] for seed in args.seeds]) for p in PARAMETRIZATIONS}
    (_, d_loss, d_dice), (m_steps, m_loss, m_dice) = mean["default"], mean["mip"]
    complete = {p: mean[p][0] and mean[p][0][-1] == args.steps for p in PARAMETRIZATIONS}
    cells, mean_ok = _row(
        "mean",
        args.steps,
        d_loss[-1] if complete["default"] else math.nan,
        m_loss[-1] if complete["mip"] else math.nan,
        m_steps,
        m_loss,
        d_dice[-1] if complete["default"] else math.nan,
        m_dice[-1] if complete["mip"] else math.nan,
        "" if complete["default"] else "all diverged",
        "" if complete["mip"] else "all diverged",
    )
    rows.append(cells)
    print(table(header, rows))
    print()
    diverged = [
        f"{LABELS[r.parametrization]} seed {r.seed}" for r in all_runs if r.diverged_at is not None
    ]
    if diverged:
        print(
            f"Diverged (non-finite training loss; mean curves leave them out): "
            f"{', '.join(diverged)}."
        )
        print()
    met = sum(ok is True for ok in results)
    defined = sum(ok is not None for ok in results)
    overall = mean_ok is True and met == defined and defined > 0
    print(
        f"Target (DESIGN.md §5): MIP reaches the default's final validation loss in ≤ 50 % of "
        f"the steps — {verdict(overall)} (on the seed-mean curves: "
        f"{'n/a' if mean_ok is None else verdict(mean_ok)}; per seed: met for {met} of "
        f"{defined})."
    )
    plot = args.plot_dir / "mip_vs_default.png"
    _plot(runs, args.seeds, plot, args.steps)
    log(f"plot: {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
