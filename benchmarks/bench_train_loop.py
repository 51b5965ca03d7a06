"""The whole training loop: statistics read every step against once per block of steps.

``hyperreg.training.train.train`` reads each step's loss on the host only every
``steplog.CUDA_READ_EVERY`` steps on a GPU (and copies its inputs from pinned memory without
blocking), so the CPU queues the next step while the GPU runs this one; on a CPU it reads every
step, where a read costs nothing. This times ``train()`` end to end (sampling, copy, step,
statistics, log) with a read after every step and with a read every ``CUDA_READ_EVERY`` steps
(the shipped setting on a GPU; on a CPU the shipped setting is the first), side by side in one
process, interleaved, on random in-memory pairs, untrained default 2D / 3D models.
Steps per second are the median over ``--repeats`` runs of ``--steps`` steps after one untimed
run (no validation, one checkpoint at the end, not timed apart).

    python benchmarks/bench_train_loop.py --sizes 160x192:4 80x96x112:1 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import log, shape, synchronize, table


class _RandomPairs:
    def __init__(self, dims: tuple[int, ...]) -> None:
        self.dims = dims

    def sample(self, batch_size, generator):
        import torch

        return (
            torch.rand(batch_size, 1, *self.dims, generator=generator),
            torch.rand(batch_size, 1, *self.dims, generator=generator),
        )


def _steps_per_second(dims, batch, steps, every, device, folder: Path) -> float:
    import hyperreg.training.train as training
    from hyperreg.config import ModelConfig, TrainConfig

    shipped = training.read_every
    training.read_every = lambda _device: every  # benchmark-only override
    try:
        config = TrainConfig(
            out=str(folder), steps=steps, batch_size=batch, device=device,
            model=ModelConfig(ndim=len(dims)), checkpoint_every=steps,
        )  # fmt: skip
        synchronize(device)
        start = time.perf_counter()
        training.train(config, pairs=_RandomPairs(dims), progress=False)
        synchronize(device)
        return steps / (time.perf_counter() - start)
    finally:
        training.read_every = shipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["160x192:4", "80x96x112:1"],
        help="SIZE:BATCH per case (default 160x192:4 80x96x112:1)",
    )
    args = parser.parse_args(argv)
    import torch

    from hyperreg.training.steplog import CUDA_READ_EVERY, read_every

    device = torch.device(args.device)
    arms = {"read every step": 1, f"read every {CUDA_READ_EVERY} steps": CUDA_READ_EVERY}
    rows = []
    with tempfile.TemporaryDirectory(prefix="hyperreg-loop-") as scratch:
        for case in args.sizes:
            size, batch = case.split(":")[0], int(case.split(":")[1])
            dims = shape(size)
            log(f"train loop {size} batch {batch} ...")
            rates: dict[str, list[float]] = {arm: [] for arm in arms}
            for repeat in range(args.repeats + 1):
                for arm, every in arms.items():
                    folder = Path(scratch) / f"{size}_{every}_{repeat}"
                    rate = _steps_per_second(dims, batch, args.steps, every, args.device, folder)
                    if repeat:  # the first round warms up
                        rates[arm].append(rate)
            medians = [statistics.median(rates[arm]) for arm in arms]
            rows.append(
                [f"{len(dims)}D {size}, batch {batch}", *(f"{m:.2f}" for m in medians),
                 f"{medians[1] / medians[0]:.2f} ×"]
            )  # fmt: skip
    print(
        f"`train()` end to end, {args.steps} steps per run, median of {args.repeats} runs, "
        f"device {device} (shipped here: a read every {read_every(device)} step(s)), steps per "
        "second:\n"
    )
    print(table(["training", *arms, "speed-up of the block reads"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
