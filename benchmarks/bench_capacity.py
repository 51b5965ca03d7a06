"""Capacity of the 3D U-Net: the recipe from scratch at several widths, Dice per training second.

Issue 20 asks whether the 2 mm U-Net is too small for ~70 people, chosen "by validation Dice per
CPU-second". Each width ``W`` runs ``scripts/train_hypermorph_3d.py --init none --width W`` (the
bundled model's recipe and data, from random weights, U-Net features times ``W``) for
``--minutes`` of wall time into ``OUT/width_W`` (SIGTERM, so it checkpoints; re-running the same
command continues every run for another ``--minutes``), one width after the other on the same
device. It then reads each run's ``train_log.csv`` (cumulative training seconds per step) and
``val_log.csv`` (the recipe's validation: mean Dice over the labels of both maps on pairs of the
held-out people, λ 0.1 / 0.3 / 0.6) and prints a Markdown section: per width its parameters,
float16 size (the bundled model must stay ≤ 10 MB), seconds per step, and every validation with
the training seconds it took; then each width's best validation Dice reached within the time the
shortest run trained. Seconds are the run's own clock (``train_log.csv``: time into the run,
resumes included), so validation and checkpoints count alike for every width.

    python benchmarks/bench_capacity.py --widths 1,1.5 --minutes 60 --device cuda --out runs/cap

Not measured here yet: no GPU was lent and a from-scratch run needs thousands of steps (about
6 s a step on one CPU thread), so the CPU machine cannot compare widths in a session.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from _common import DATA_ROOT, REPO, log, table

sys.path.insert(0, str(REPO / "scripts"))  # the recipe: train_hypermorph_3d.channels


def run_width(width: float, out: Path, args: argparse.Namespace) -> None:
    """Train one width for ``args.minutes`` (the recipe resumes its run folder when one exists)."""
    minutes = args.minutes
    command = [
        sys.executable,
        str(REPO / "scripts" / "train_hypermorph_3d.py"),
        "--init",
        "none",
        "--width",
        f"{width:g}",
        "--out",
        str(out),
        "--device",
        args.device,
        "--steps",
        str(args.steps),
        "--val-every",
        str(args.val_every),
        "--checkpoint-every",
        str(args.val_every),
    ]
    log(f"bench_capacity: width {width:g} for {minutes:g} min: {' '.join(command)}")
    env = dict(os.environ, HYPERREG_DATA=str(args.data), PYTHONUNBUFFERED="1")
    process = subprocess.Popen(command, cwd=REPO, env=env)
    try:
        process.wait(timeout=minutes * 60)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the recipe checkpoints and exits
        process.wait()
    if process.returncode not in (0, 130, -signal.SIGTERM):
        raise RuntimeError(f"width {width:g}: the recipe exited with {process.returncode}")


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV log, or none when it is absent."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def seconds_at(train_rows: list[dict[str, str]], step: int) -> float:
    """Cumulative training seconds at ``step`` (0 before the first logged step)."""
    done = [float(r["seconds"]) for r in train_rows if int(r["step"]) <= step]
    return done[-1] if done else 0.0


def model_size(width: float) -> tuple[int, float]:
    """(parameters, float16 megabytes) of the 3D HyperMorph at ``width``."""
    from train_hypermorph_3d import channels

    from hyperreg.config import ModelConfig
    from hyperreg.method.model import HyperMorph

    enc, dec = channels(width)
    model = HyperMorph(ModelConfig(ndim=3, enc_channels=enc, dec_channels=dec))
    count = sum(p.numel() for p in model.parameters())
    return count, 2 * count / 1e6


def report(widths: Sequence[float], out: Path) -> str:
    """The Markdown section from the run folders under ``out``."""
    runs = {}
    for width in widths:
        folder = out / f"width_{width:g}"
        runs[width] = (read_rows(folder / "train_log.csv"), read_rows(folder / "val_log.csv"))
    rows = []
    for width, (train_rows, _) in runs.items():
        count, megabytes = model_size(width)
        steps = int(train_rows[-1]["step"]) if train_rows else 0
        seconds = float(train_rows[-1]["seconds"]) if train_rows else 0.0
        per_step = f"{seconds / steps:.2f}" if steps else "not measured"
        rows.append((f"{width:g}", count, f"{megabytes:.2f}", steps, f"{seconds:.0f}", per_step))
    val_rows = []
    for width, (train_rows, val) in runs.items():
        for row in val:
            step = int(row["step"])
            dices = " / ".join(f"{float(row[f'dice_{lam}']):.4f}" for lam in ("0.1", "0.3", "0.6"))
            val_rows.append(
                (
                    f"{width:g}",
                    step,
                    f"{seconds_at(train_rows, step):.0f}",
                    f"{float(row['mean_dice']):.4f}",
                    dices,
                )
            )
    budget = min((float(t[-1]["seconds"]) for t, _ in runs.values() if t), default=0.0)
    best = []
    for width, (train_rows, val) in runs.items():
        reached = [
            float(r["mean_dice"]) for r in val if seconds_at(train_rows, int(r["step"])) <= budget
        ]
        best.append((f"{width:g}", f"{max(reached):.4f}" if reached else "not measured"))
    return "\n\n".join(
        [
            table(("width", "parameters", "float16 MB", "steps", "training s", "s / step"), rows),
            table(("width", "step", "training s", "mean Dice", "λ 0.1 / 0.3 / 0.6"), val_rows),
            f"Best validation Dice within {budget:.0f} training seconds (the shortest run):",
            table(("width", "mean Dice"), best),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="1,1.5", help="comma-separated U-Net widths")
    parser.add_argument("--minutes", type=float, default=60.0, help="wall minutes per width")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="the shared data folder")
    parser.add_argument("--steps", type=int, default=20000, help="at most this many steps a run")
    parser.add_argument("--val-every", type=int, default=500)
    parser.add_argument("--out", default="runs/capacity")
    parser.add_argument("--report-only", action="store_true", help="only print the table")
    args = parser.parse_args(argv)
    widths = [float(w) for w in args.widths.split(",")]
    out = Path(args.out).resolve()
    if not args.report_only:
        for width in widths:
            run_width(width, out / f"width_{width:g}", args)
    print(f"Command: `python benchmarks/bench_capacity.py {' '.join(argv or sys.argv[1:])}`\n")
    print(report(widths, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
