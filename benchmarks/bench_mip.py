"""MIP against the default parametrisation: validation loss and Dice against training steps.

For each hypernetwork parametrisation (``"mip"`` and the MIP paper's ``"default"``,
:class:`hyperreg.config.ModelConfig`), trains 2D HyperMorph models with
:func:`hyperreg.training.train.train` on the people split of the bundled 2D model
(:data:`_common.PEOPLE_SOURCES`, validation people never trained on, at 1.5 mm): first at every
learning rate of ``--lrs`` with the first seed, then with the other ``--seeds`` at each arm's
best lr (lowest final validation loss of the first seed; a diverged run counts as worst). The
two arms share steps, batch size, loss (NCC), pair stream and λ draws (seeded by the seed); only
the parametrisation and each arm's own best lr differ.
Every ``--val-every`` steps training validates (:func:`hyperreg.training.validation.evaluate`) at
the ``--val-lambdas`` values on pairs whose moving scan belongs to a held-out person: the
HyperMorph validation loss ``(1 − λ)·NCC + λ·gradient_loss`` per λ and its mean over λ
(``val_loss``), and mean Dice. A run whose loss becomes non-finite is recorded as diverged.

Reports the lr grid, then, per seed and for the seed-mean curves at the best lrs, the first
validation step at which MIP's validation loss is at or below the default's final validation
loss, as a fraction of the steps; the target (DESIGN.md §5) is ≤ 50 %. Writes
``mip_vs_default.png`` into ``--plot-dir`` and the run folders (``val_log.csv``,
``train_log.csv``, checkpoints) into ``--work``; ``--reuse`` keeps finished runs whose
``config.json`` matches, so an interrupted benchmark continues where it stopped.

    python benchmarks/bench_mip.py --steps 1500 --val-every 50 --seeds 0 1 2 \\
        --lrs 3e-5 1e-4 3e-4 1e-3 3e-3 --jobs 2 --device cpu --work runs/bench_mip --reuse
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _common import DATA_ROOT, DEFAULT_PLOTS, hyper_config, log, people_text, pyplot, run_jobs
from _common import train_run
from _common import table, verdict

PARAMETRIZATIONS = ("default", "mip")  # baseline first
LABELS = {"default": "default", "mip": "MIP"}
COLOURS = {"default": "tab:blue", "mip": "tab:orange"}
TARGET = 0.5  # MIP must reach the default's final validation loss within this share of the steps


@dataclass
class Run:
    """One training run's validation curve (steps, val_loss, mean Dice) and its fate."""

    parametrization: str
    seed: int
    lr: float
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


def _config(args: argparse.Namespace, parametrization: str, seed: int, lr: float):
    return hyper_config(
        args.data,
        args.work,
        parametrization,
        lr,
        steps=args.steps,
        batch_size=args.batch_size,
        seed=seed,
        device=args.device,
        val_every=args.val_every,
        val_lambdas=args.val_lambdas,
        val_max_pairs=args.val_max_pairs,
    )


def _runs(args: argparse.Namespace, keys: Sequence[tuple[str, int, float]]) -> dict:
    """Train (or reuse) the runs ``(parametrization, seed, lr)``; return them by key."""
    tasks = [(_config(args, *key), args.reuse) for key in keys]
    results = run_jobs(train_run, tasks, args.jobs)
    runs = {}
    for key, (task, _), (diverged_at, seconds) in zip(keys, tasks, results):
        run = Run(*key, diverged_at=diverged_at, seconds=seconds)
        _read_curve(run, Path(task.out))
        log(
            f"{Path(task.out).name}: final val loss {run.final_loss:.4f}, "
            f"final Dice {run.final_dice:.4f}"
        )
        runs[key] = run
    return runs


def _best_lr(runs: dict, parametrization: str, seed: int, lrs: Sequence[float]) -> float:
    """The lr of ``lrs`` with the lowest final validation loss (diverged: worst)."""

    def loss(lr: float) -> float:
        value = runs[(parametrization, seed, lr)].final_loss
        return value if math.isfinite(value) else math.inf

    return min(lrs, key=loss)


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
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared data folder")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per run")
    parser.add_argument("--val-every", type=int, default=50, help="steps between validations")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=[3e-5, 1e-4, 3e-4, 1e-3, 3e-3],
        help="Adam learning rates tried with the first seed, per arm (default 3e-5 … 3e-3)",
    )
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
        help="cap on held-out pairs per validation (TrainConfig.val_max_pairs; default 16)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs trained at once, one torch thread each"
    )
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
    counts = (args.steps, args.batch_size, args.val_every, args.val_max_pairs, args.jobs)
    if min(counts) < 1 or not all(lr > 0 for lr in args.lrs):
        parser.error(
            "--steps, --val-every, --batch-size, --val-max-pairs and --jobs must be >= 1 and "
            "--lrs > 0"
        )
    if not all(0.0 <= lam <= 1.0 for lam in args.val_lambdas):
        parser.error(f"--val-lambdas must lie in [0, 1], got {args.val_lambdas}")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct, got {args.seeds}")
    args.lrs = sorted(set(args.lrs))
    # absolute: run configs (and so --reuse) must not depend on the working directory
    args.work = (args.work or Path(tempfile.mkdtemp(prefix="bench_mip_"))).resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    log(f"run folders in {args.work}")

    first = args.seeds[0]
    grid = _runs(args, [(p, first, lr) for p in PARAMETRIZATIONS for lr in args.lrs])
    best = {p: _best_lr(grid, p, first, args.lrs) for p in PARAMETRIZATIONS}
    log("best lr: " + ", ".join(f"{LABELS[p]} {best[p]:g}" for p in PARAMETRIZATIONS))
    more = _runs(args, [(p, seed, best[p]) for seed in args.seeds[1:] for p in PARAMETRIZATIONS])
    everything = {**grid, **more}
    runs = {
        (p, seed): everything[(p, seed, best[p])] for p in PARAMETRIZATIONS for seed in args.seeds
    }

    split_path = Path(_config(args, "mip", first, best["mip"]).out) / "split.json"
    split = json.loads(split_path.read_text()) if split_path.is_file() else {}
    lambdas = ", ".join(f"{lam:g}" for lam in args.val_lambdas)
    all_runs = list(everything.values())
    print(
        f"2D HyperMorph (default `ModelConfig(ndim=2)`: U-Net 16/32/32/32, MIP hypernetwork "
        f"4 × 64 with the rank-4 head, or the MIP paper's default parametrisation: raw λ in, "
        f"zero-bias Kaiming trunk, θ = h(λ)), trained with `hyperreg.training.train.train` for "
        f"{args.steps} steps per run, batch {args.batch_size}, Adam, NCC similarity, λ per "
        f"sample (uniform plus 20 % endpoints), on 2D slices at 1.5 mm of three shared sources "
        f"({', '.join(s.get('data', '?').rsplit('/', 1)[-1] for s in split.get('sources', []))}): "
        f"{people_text(split)}. Each arm ran first at every lr of {{"
        f"{', '.join(f'{lr:g}' for lr in args.lrs)}}} with seed {first}; its best lr (lowest "
        f"final validation loss) then ran with seeds {', '.join(map(str, args.seeds[1:])) or '–'}"
        f". Same pair stream and λ draws for both arms per seed. Validation every "
        f"{args.val_every} steps at λ = {lambdas}: validation loss = mean over λ of "
        f"(1 − λ)·NCC + λ·2·Grad-l2 of the velocity (the training objective), and mean Dice. "
        f'"Steps MIP needs" is the first validation step at which MIP\'s validation loss is ≤ '
        f"the default's final one (same seed; resolution {args.val_every} steps). Device "
        f"{args.device}, {args.jobs} run(s) at once, one thread each: "
        f"{_fmt_seconds([r.step_seconds for r in all_runs])} s per training step, "
        f"{_fmt_seconds([r.val_seconds for r in all_runs])} s per validation (medians)."
    )
    print()
    header = ["arm", *(f"lr {lr:g}: final val loss / Dice" for lr in args.lrs), "best lr"]
    rows = []
    for p in PARAMETRIZATIONS:
        cells = []
        for lr in args.lrs:
            run = grid[(p, first, lr)]
            cells.append(
                f"diverged at step {run.diverged_at}"
                if run.diverged_at is not None
                else f"{run.final_loss:.4f} / {run.final_dice:.3f}"
            )
        rows.append([LABELS[p], *cells, f"{best[p]:g}"])
    print(f"Learning-rate grid (seed {first}):")
    print()
    print(table(header, rows))
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
    print(f"Each arm at its best lr (default {best['default']:g}, MIP {best['mip']:g}):")
    print()
    print(table(header, rows))
    print()
    diverged = [
        f"{LABELS[r.parametrization]} lr {r.lr:g} seed {r.seed}"
        for r in all_runs
        if r.diverged_at is not None
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
        f"the steps, each arm at its best lr — {verdict(overall)} (on the seed-mean curves: "
        f"{'n/a' if mean_ok is None else verdict(mean_ok)}; per seed: met for {met} of "
        f"{defined})."
    )
    plot = args.plot_dir / "mip_vs_default.png"
    _plot(runs, args.seeds, plot, args.steps)
    log(f"plot: {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
