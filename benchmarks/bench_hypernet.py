"""Compact Δθ head and learning rate: accuracy, size and step time per head rank and lr.

On 2D coronal slices (axis 2) of the shared OASIS volumes, trains one HyperMorph model per
(``--ranks`` × ``--lrs``) setting with the same loop as ``bench_accuracy`` (same pair stream,
λ per sample from ``LambdaSampler``, NCC, batch ``--batch-size``) and evaluates it with
:func:`hyperreg.training.validation.evaluate` on the held-out brain slices (every 10th, both
directions) at λ ∈ ``--eval-lambdas``. Rank 0 is the legacy full-width head (hyperreg 0.1.0).
Reports mean held-out Dice, hypernetwork parameters, parameter + Adam-state memory, checkpoint
size and median step time.

    python benchmarks/bench_hypernet.py --steps 300 --ranks 0 2 4 8 16 64 --lrs 1e-3 --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import DEFAULT_DATA, FIXED, MOVING, log, require_data, table

# bench_accuracy's protocol before it moved to the people split (e439083), which this
# benchmark's results (RESULTS_hypernet.md) were measured with: coronal slices, every 10th held out
HOLDOUT_EVERY = 10
SLICE_AXIS = 2


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="neurite-oasis folder")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--ranks", type=int, nargs="+", default=[0, 4, 8, 16, 64])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3])
    parser.add_argument("--eval-lambdas", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args(argv)
    require_data(args.data, *(f"{s}/aligned_norm.nii.gz" for s in (MOVING, FIXED)))

    import numpy as np
    import torch

    from hyperreg.config import ModelConfig, TrainConfig
    from hyperreg.method.metrics import mean_dice
    from hyperreg.method.model import HyperMorph, save_checkpoint
    from hyperreg.training.data import LambdaSampler, PairSampler, find_scans, validation_pairs
    from hyperreg.training.validation import evaluate
    from hyperreg.training.train import training_objective

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    scans = find_scans(args.data, 2)
    by_name = {scan.name: scan for scan in scans}
    sampler = PairSampler(scans, 2, slice_axis=SLICE_AXIS, holdout_every=HOLDOUT_EVERY)
    held = sampler.heldout_slices
    directions = [(by_name[MOVING], by_name[FIXED]), (by_name[FIXED], by_name[MOVING])]
    pairs = validation_pairs(
        directions, 2, slice_axis=SLICE_AXIS, slices=held, max_pairs=len(directions) * len(held)
    )
    dice_before = float(np.nanmean([mean_dice(p.moving_seg, p.fixed_seg) for p in pairs]))
    log(f"{len(sampler.slices)} training slices, {len(pairs)} held-out pairs")
    work = Path(tempfile.mkdtemp(prefix="bench_hypernet_"))
    rows = []
    for lr in args.lrs:
        for rank in args.ranks:
            config = TrainConfig(
                steps=args.steps,
                batch_size=args.batch_size,
                lr=lr,
                sim="ncc",
                seed=args.seed,
                model=dataclasses.replace(ModelConfig(ndim=2), hyper_rank=rank),
            )
            torch.manual_seed(args.seed)
            model = HyperMorph(config.model)
            label = f"rank {rank} lr {lr:g}"
            step_s, _ = _train(
                model,
                sampler,
                LambdaSampler(config.lam_endpoint_fraction).sample,
                config,
                "cpu",
                label,
            )
            model.objective = training_objective(config)
            result = evaluate(model, pairs, args.eval_lambdas)
            dice = float(np.mean([result[f"dice_{lam:g}"] for lam in args.eval_lambdas]))
            params = sum(p.numel() for p in model.hypernet.parameters())
            path = save_checkpoint(model, work / f"rank{rank}.pt")
            rows.append(
                [
                    "legacy (0)" if rank == 0 else str(rank),
                    f"{lr:g}",
                    f"{dice:.4f}",
                    f"{params / 1e6:.3f}",
                    f"{params * 4 * 3 / 2**20:.1f}",  # weights + Adam's two moments, float32
                    f"{path.stat().st_size / 2**20:.2f}",
                    f"{step_s:.3f}",
                ]
            )
            log(" | ".join(rows[-1]))
    print(
        f"2D OASIS coronal slices, {args.steps} steps, batch {args.batch_size}, NCC; held-out "
        f"Dice = mean over λ ∈ {args.eval_lambdas} of {len(pairs)} held-out slice pairs "
        f"(no registration: {dice_before:.4f}).\n"
    )
    header = [
        "head rank",
        "lr",
        "held-out Dice",
        "hypernet params (M)",
        "params + Adam state (MiB)",
        "checkpoint (MiB)",
        "s / step",
    ]
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
