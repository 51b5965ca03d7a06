"""The cost of amortisation: one HyperMorph trained 1×, 2× and 4× as long as one fixed-λ model.

The question (issue 24): a HyperMorph model shares one training budget across every λ, a fixed-λ
model (VoxelMorph-style, ordinary U-Net weights) spends all of it at one λ. How many times a
fixed model's steps does HyperMorph need to be within ``TOLERANCE`` Dice of the fixed model at
every λ of ``--lambdas``, and what does that cost in total against training one fixed model per λ?

Protocol (2D, bench_accuracy's people split: slices at 1.5 mm of three shared sources, four
people held out of training, evaluated on the validation pairs whose moving scan is a held-out
person):

* Fixed arm: for each λ of ``--lambdas``, :func:`_common.train_fixed` for ``--steps`` steps at
  constant λ.
* HyperMorph arm: one :func:`hyperreg.training.train.train` run (MIP, λ per sample) of
  ``max(--multiples) × --steps`` steps at constant lr, its checkpoint at each multiple kept and
  evaluated (with a constant lr, the checkpoint at step N is a run of N steps).
* Learning rates: every run (each fixed λ; the HyperMorph run) is trained at every lr of
  ``--lrs`` with the first seed and its best lr is picked on the evaluation pairs themselves (a
  fixed model: its Dice at its λ; HyperMorph: its mean Dice over the λ and the multiples, one lr
  for the one run whose checkpoints give every multiple), the same optimistic pick for both
  arms. The other seeds rerun each run at that lr only; the first seed's Dice per lr is printed.
* Seeds change the initial weights and the stream of pairs and λ draws; both arms of one seed see
  the same pair stream.

Prints the gap per λ, multiple and seed, its mean over seeds, the smallest multiple at which
HyperMorph is within ``TOLERANCE`` at every λ on the seed mean, and the compute of each side
(steps and CPU seconds measured here: one HyperMorph run against one fixed model per λ). Writes
``amortisation_gap.png`` into ``--plot-dir`` and ``amortisation.json`` into ``--work``.

    python benchmarks/bench_amortisation.py --steps 1500 --multiples 1 2 4 --seeds 0 1 2 \\
        --lrs 3e-4 1e-3 3e-3 --jobs 2 --work runs/amortisation --reuse
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
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

TOLERANCE = 0.01  # the claim: HyperMorph Dice >= fixed-λ Dice - TOLERANCE at every λ


def _evaluate(model, config, lambdas: list[float]) -> dict:
    """Mean Dice and folding % per λ on the held-out pairs (keys ``f"{λ:g}"``)."""
    from hyperreg.training.train import prepare_data, training_objective
    from hyperreg.training.validation import evaluate

    _, pairs, _ = prepare_data(config)
    model.objective = training_objective(config)
    row = evaluate(model, pairs, lambdas)
    return {
        "dice": {f"{lam:g}": row[f"dice_{lam:g}"] for lam in lambdas},
        "folding_pct": {f"{lam:g}": row[f"folding_pct_{lam:g}"] for lam in lambdas},
        "pairs": [pair.name for pair in pairs],
    }


def _cached(out: Path, key: dict, reuse: bool) -> dict | None:
    saved = out / "result.json"
    if reuse and saved.is_file():
        result = json.loads(saved.read_text())
        if result.get("key") == key:
            log(f"{out.name}: reusing its evaluation")
            return result
    return None


def hyper_job(config, steps: int, multiples: list[int], lambdas: list[float], reuse: bool) -> dict:
    """Train one HyperMorph run and evaluate its checkpoint at every multiple of ``steps``."""
    from hyperreg.config import to_dict
    from hyperreg.method.model import load_checkpoint
    from hyperreg.training.checkpointing import checkpoint_path

    out = Path(config.out)
    key = {"config": to_dict(config), "multiples": multiples, "lambdas": lambdas}
    if (result := _cached(out, key, reuse)) is not None:
        return result
    diverged_at, seconds = train_run(config, reuse)
    result = {"key": key, "diverged_at": diverged_at, "seconds": seconds, "at": {}}
    for multiple in multiples:
        step = multiple * steps
        if diverged_at is not None and diverged_at <= step:
            continue
        model, _ = load_checkpoint(checkpoint_path(out, step))
        result["at"][str(multiple)] = _evaluate(model, config, lambdas)
    result["split"] = json.loads((out / "split.json").read_text())
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"{out.name}: {seconds:.0f} s")
    return result


def fixed_job(config, lam: float, reuse: bool) -> dict:
    """Train one fixed-λ model and evaluate it at its λ."""
    from hyperreg.config import to_dict

    out = Path(config.out)
    key = {"config": to_dict(config), "lam": lam}
    if (result := _cached(out, key, reuse)) is not None:
        return result
    if out.exists():
        shutil.rmtree(out)
    log(f"{out.name}: training {config.steps} steps at λ = {lam:g}")
    diverged_at, seconds, model = train_fixed(config, lam)
    result = {"key": key, "diverged_at": diverged_at, "seconds": seconds}
    if diverged_at is None:
        result.update(_evaluate(model, config, [lam]))
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"{out.name}: {seconds:.0f} s, Dice {result.get('dice')}")
    return result


def _mean_dice(scores: dict | None, lambdas: Sequence[float]) -> float:
    """Mean Dice over ``lambdas`` (−inf where a run diverged or lost every label)."""
    if not scores:
        return -math.inf
    values = [scores["dice"].get(f"{lam:g}", math.nan) for lam in lambdas]
    return math.fsum(values) / len(values) if all(map(math.isfinite, values)) else -math.inf


class _Runs:
    """Builds the run configs and tasks of one benchmark call (one place for folder names)."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.top = max(args.multiples)

    def _config(self, name: str, lr: float, seed: int, steps: int, **extra):
        """One run's config in ``work/name`` (validation only at its last step)."""
        return hyper_config(
            self.args.data,
            self.work,
            "mip",
            lr,
            folder=self.work / name,
            steps=steps,
            batch_size=self.args.batch_size,
            seed=seed,
            device=self.args.device,
            val_every=steps,
            **extra,
        )

    def hyper(self, lr: float, seed: int) -> tuple:
        steps = self.top * self.args.steps
        name = f"hyper_x{self.top}_lr{lr:g}_seed{seed}"
        config = self._config(name, lr, seed, steps, checkpoint_every=self.args.steps)
        lambdas = sorted(self.args.lambdas)
        return hyper_job, (config, self.args.steps, sorted(self.args.multiples), lambdas, True)

    def fixed(self, lam: float, lr: float, seed: int) -> tuple:
        name = f"fixed_lam{lam:g}_lr{lr:g}_seed{seed}"
        return fixed_job, (self._config(name, lr, seed, self.args.steps), lam, True)


def _run(specs: list[tuple], jobs: int) -> dict:
    """Run ``specs`` (``(key, (fn, task))``) ``jobs`` at a time; ``{key: result}``."""
    tasks = [(fn, task) for _, (fn, task) in specs]
    results = run_jobs(_dispatch, tasks, jobs)
    return {key: result for (key, _), result in zip(specs, results, strict=True)}


def _dispatch(fn, task: tuple) -> dict:
    return fn(*task)


def _plot(path: Path, lambdas, multiples, gaps: dict, seeds) -> None:
    """Gap (HyperMorph − fixed Dice) against training length, one line per λ, seed spread."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for index, lam in enumerate(lambdas):
        means = [statistics.fmean(gaps[(lam, m)]) for m in multiples]
        lows = [min(gaps[(lam, m)]) for m in multiples]
        highs = [max(gaps[(lam, m)]) for m in multiples]
        ax.plot(multiples, means, "-o", color=f"C{index}", label=f"λ = {lam:g}")
        ax.fill_between(multiples, lows, highs, color=f"C{index}", alpha=0.12)
    ax.axhline(-TOLERANCE, ls="--", color="grey", lw=1, label=f"−{TOLERANCE:g} (the claim)")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xticks(multiples, [f"{m}×" for m in multiples])
    ax.set_xlabel("HyperMorph steps / one fixed-λ model's steps")
    ax.set_ylabel("Dice: HyperMorph − fixed-λ model")
    ax.set_title(f"Cost of amortisation ({len(seeds)} seeds, held-out people)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared data folder")
    parser.add_argument("--steps", type=int, default=1500, help="one fixed-λ model's steps")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3])
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    parser.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOTS)
    parser.add_argument("--work", type=Path, default=None, help="folder for the run folders")
    parser.add_argument("--reuse", action="store_true", help="reuse finished runs in --work")
    args = parser.parse_args(argv)
    if min(args.steps, args.batch_size, args.jobs, *args.multiples) < 1:
        parser.error("--steps, --batch-size, --jobs and --multiples must be >= 1")
    if not all(lr > 0 for lr in args.lrs) or not all(0 <= lam <= 1 for lam in args.lambdas):
        parser.error("--lrs must be > 0 and --lambdas lie in [0, 1]")
    args.multiples = sorted(set(args.multiples))
    args.lambdas = sorted({round(lam, 4) for lam in args.lambdas})
    args.lrs = sorted(set(args.lrs))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    work = (args.work or Path(tempfile.mkdtemp(prefix="bench_amortisation_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    runs = _Runs(args, work)
    first, rest = args.seeds[0], args.seeds[1:]
    lambdas, multiples = args.lambdas, args.multiples

    # 1. every arm at every lr with the first seed
    specs = [(("hyper", lr, first), runs.hyper(lr, first)) for lr in args.lrs]
    specs += [
        (("fixed", lam, lr, first), runs.fixed(lam, lr, first))
        for lam in lambdas
        for lr in args.lrs
    ]
    results = _run(specs, args.jobs)
    best_fixed = {
        lam: max(
            args.lrs, key=lambda lr, lam=lam: _mean_dice(results[("fixed", lam, lr, first)], [lam])
        )
        for lam in lambdas
    }
    # one HyperMorph run per seed gives every multiple (its checkpoints): one lr for the run,
    # the best on the mean Dice over the λ and the multiples
    hyper_lr = max(
        args.lrs,
        key=lambda lr: statistics.fmean(
            _mean_dice(results[("hyper", lr, first)]["at"].get(str(m)), lambdas) for m in multiples
        ),
    )
    best_hyper = {m: hyper_lr for m in multiples}
    # 2. the other seeds at each arm's best lr
    specs = [
        (("hyper", lr, seed), runs.hyper(lr, seed))
        for lr in sorted(set(best_hyper.values()))
        for seed in rest
    ]
    specs += [
        (("fixed", lam, best_fixed[lam], seed), runs.fixed(lam, best_fixed[lam], seed))
        for lam in lambdas
        for seed in rest
    ]
    results.update(_run(specs, args.jobs))
    _report(args, work, results, best_fixed, best_hyper)
    _report_lr_grid(args, results)
    return 0


def _report_lr_grid(args, results: dict) -> None:
    """The first seed's Dice per lr: what each arm's lr was picked from."""
    first = args.seeds[0]
    header = [f"run (seed {first})", *(f"lr {lr:g}" for lr in args.lrs)]

    def cell(scores: dict | None, lams) -> str:
        value = _mean_dice(scores, lams)
        return f"{value:.4f}" if math.isfinite(value) else "diverged or no label left"

    rows = [
        [
            f"HyperMorph at {m}× (mean over the λ)",
            *(
                cell(results[("hyper", lr, first)]["at"].get(str(m)), args.lambdas)
                for lr in args.lrs
            ),
        ]
        for m in args.multiples
    ]
    rows += [
        [
            f"fixed λ = {lam:g}",
            *(cell(results[("fixed", lam, lr, first)], [lam]) for lr in args.lrs),
        ]
        for lam in args.lambdas
    ]
    print()
    print("Dice per lr with the first seed (the grid each arm's lr was picked from):")
    print()
    print(table(header, rows))


def _report(args, work: Path, results: dict, best_fixed: dict, best_hyper: dict) -> None:
    lambdas, multiples, seeds = args.lambdas, args.multiples, args.seeds
    fixed_dice = {
        (lam, seed): results[("fixed", lam, best_fixed[lam], seed)]
        .get("dice", {})
        .get(f"{lam:g}", math.nan)
        for lam in lambdas
        for seed in seeds
    }
    hyper_dice = {}
    for m in multiples:
        for seed in seeds:
            at = results[("hyper", best_hyper[m], seed)]["at"].get(str(m))
            for lam in lambdas:
                hyper_dice[(lam, m, seed)] = at["dice"][f"{lam:g}"] if at else math.nan
    gaps = {
        (lam, m): [hyper_dice[(lam, m, s)] - fixed_dice[(lam, s)] for s in seeds]
        for lam in lambdas
        for m in multiples
    }
    enough = [
        m
        for m in multiples
        if all(statistics.fmean(gaps[(lam, m)]) >= -TOLERANCE for lam in lambdas)
    ]
    _plot(args.plot_dir / "amortisation_gap.png", lambdas, multiples, gaps, seeds)

    fixed_seconds = [
        results[("fixed", lam, best_fixed[lam], seed)]["seconds"]
        for lam in lambdas
        for seed in seeds
    ]
    hyper_runs = {(best_hyper[m], seed) for m in multiples for seed in seeds}
    hyper_per_step = statistics.median(
        results[("hyper", lr, seed)]["seconds"] / (max(multiples) * args.steps)
        for lr, seed in hyper_runs
    )
    fixed_per_step = statistics.median(fixed_seconds) / args.steps
    split = results[("hyper", best_hyper[multiples[0]], seeds[0])]["split"]
    record = {
        "steps": args.steps,
        "multiples": multiples,
        "seeds": seeds,
        "lrs": args.lrs,
        "best_fixed_lr": {f"{k:g}": v for k, v in best_fixed.items()},
        "best_hyper_lr": {str(k): v for k, v in best_hyper.items()},
        "fixed_dice": {f"{lam:g} seed {s}": v for (lam, s), v in fixed_dice.items()},
        "hyper_dice": {f"{lam:g} x{m} seed {s}": v for (lam, m, s), v in hyper_dice.items()},
        "seconds_per_step": {"hyper": hyper_per_step, "fixed": fixed_per_step},
        "enough": enough,
        "split": split,
    }
    (work / "amortisation.json").write_text(json.dumps(record, indent=1) + "\n")
    lr_list = ", ".join(f"{lr:g}" for lr in args.lrs)
    later = ", ".join(map(str, seeds[1:]))

    print(
        f"2D, batch {args.batch_size}, default `ModelConfig(ndim=2)`, loss (1 − λ)·NCC(9) + "
        f"λ·2·Grad-l2 of the velocity, constant Adam lr; {people_text(split)}. Fixed-λ models: "
        f"{args.steps} steps each; HyperMorph (MIP, λ per sample U(0, 1) with 20 % at 0 or 1): "
        f"one run of {max(multiples) * args.steps} steps per seed, evaluated at its checkpoints "
        f"{', '.join(f'{m * args.steps}' for m in multiples)}. lr grid {{{lr_list}}} "
        f"with seed {seeds[0]}; seeds {later or '–'} at each arm's best lr "
        f"(picked on the evaluation pairs, the same pick for both arms). Device {args.device}, "
        f"{args.jobs} run(s) at once, one thread each."
    )
    print()
    header = ["λ", "fixed lr", "fixed Dice (seed mean)"]
    header += [f"HyperMorph {m}× − fixed (lr {best_hyper[m]:g})" for m in multiples]
    cells = []
    for lam in lambdas:
        row = [f"{lam:g}", f"{best_fixed[lam]:g}"]
        row.append(f"{statistics.fmean(fixed_dice[(lam, s)] for s in seeds):.4f}")
        for m in multiples:
            values = gaps[(lam, m)]
            spread = f" ({min(values):+.4f} … {max(values):+.4f})" if len(values) > 1 else ""
            row.append(f"{statistics.fmean(values):+.4f}{spread}")
        cells.append(row)
    print(table(header, cells))
    print()
    print(
        "Mean over seeds; in brackets the lowest and highest seed. Dice per seed: "
        f"`{work / 'amortisation.json'}`."
    )
    print()
    total_hyper = {m: m * args.steps for m in multiples}
    total_fixed = len(lambdas) * args.steps
    print(
        f"Compute: one fixed-λ model {args.steps} steps ({fixed_per_step:.3f} s a step here); "
        f"{len(lambdas)} of them {total_fixed} steps, "
        f"{total_fixed * fixed_per_step / 60:.0f} CPU-minutes. "
        "HyperMorph: "
        + "; ".join(
            f"{m}× = {total_hyper[m]} steps, "
            f"{total_hyper[m] * hyper_per_step / 60:.0f} CPU-minutes "
            f"({total_hyper[m] * hyper_per_step / (total_fixed * fixed_per_step):.2f} × the "
            f"{len(lambdas)} fixed models)"
            for m in multiples
        )
        + f" ({hyper_per_step:.3f} s a step here; median step times over the runs, "
        f"{args.jobs} run(s) sharing the machine)."
    )
    print()
    if enough:
        claim = (
            f"met from {enough[0]}×: HyperMorph is within {TOLERANCE:g} Dice of a fixed-λ model at "
            f"every λ on the seed mean when trained {enough[0]}× one fixed model's steps"
        )
    else:
        claim = (
            f"MISSED up to {max(multiples)}×: at no measured length is HyperMorph within "
            f"{TOLERANCE:g} at every λ on the seed mean"
        )
    print(f"Verdict: {verdict(bool(enough))} — {claim}. Plot: `plots/amortisation_gap.png`.")


if __name__ == "__main__":
    raise SystemExit(main())
