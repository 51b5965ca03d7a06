"""Batched λ sweep: K values of λ for one pair in one batched call vs K single-λ calls.

Two levels, each measured side by side in one process (median of ``--repeats`` timed runs after
one warm-up, the two sides interleaved):

* model: ``model(moving×K, fixed×K, lam=(K,))`` (per-sample generated weights, grouped
  convolutions) against K calls ``model(moving, fixed, λ)``;
* API: :func:`hyperreg.apps.sweep.sweep_lambdas` (its default chunk unless ``--chunk``: all K
  per pass on a GPU, one per pass on a CPU) against K calls of
  :func:`hyperreg.registration.lambdas.register_pair` (both also compute Dice, folding and log-J per
  λ).

On a CPU the target (no slower than K single calls) applies to the API level, what users run;
the model level's one pass of K is reported for information there.

Untrained default-width model (encoder 16/32/32/32), random images and label maps. Prints a
Markdown table; ratio = single calls / batched (> 1: the batched sweep is faster).

    python benchmarks/bench_sweep.py --sizes 160x192 64x64x64 --count 16 --device cpu
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

from _common import log, shape, table, verdict, wall_time


def _bench_size(
    size: str, args: argparse.Namespace, lambdas: list[float], device
) -> list[list[str]]:
    import numpy as np
    import torch

    from hyperreg.config import ModelConfig
    from hyperreg.registration.lambdas import register_pair
    from hyperreg.geometry.io import Volume
    from hyperreg.method.model import HyperMorph
    from hyperreg.apps.sweep import sweep_lambdas

    count = len(lambdas)
    dims = shape(size)
    torch.manual_seed(0)
    model = HyperMorph(ModelConfig(ndim=len(dims))).to(device).eval()
    rng = np.random.default_rng(0)
    images = [rng.random(dims, dtype=np.float32) for _ in range(2)]
    segs = [rng.integers(0, 5, dims).astype(np.int32) for _ in range(2)]
    affine = np.eye(4)
    moving, fixed = (Volume(data=d, affine=affine, disk_shape=dims) for d in images)
    moving_seg, fixed_seg = (Volume(data=d, affine=affine, disk_shape=dims) for d in segs)
    moving_t = torch.from_numpy(images[0])[None, None].to(device)
    fixed_t = torch.from_numpy(images[1])[None, None].to(device)
    lam_t = torch.tensor(lambdas, dtype=torch.float32, device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp)

    need = 3.0 if device.type == "cuda" else 1.0

    def model_single() -> None:
        with torch.no_grad(), autocast:
            for lam in lambdas:
                model(moving_t, fixed_t, lam)

    def model_batched() -> None:
        with torch.no_grad(), autocast:
            for start in range(0, count, args.chunk or count):
                lam = lam_t[start : start + (args.chunk or count)]
                shape_k = (lam.numel(), *moving_t.shape[1:])
                model(moving_t.expand(shape_k), fixed_t.expand(shape_k), lam)

    def api_single() -> None:
        for lam in lambdas:
            register_pair(model, moving, fixed, lam, moving_seg=moving_seg, fixed_seg=fixed_seg)

    def api_batched() -> None:
        sweep_lambdas(
            model,
            moving,
            fixed,
            lambdas,
            moving_seg=moving_seg,
            fixed_seg=fixed_seg,
            chunk=args.chunk,
            amp=args.amp,
        )

    runs = {"model": (model_single, model_batched), "api": (api_single, api_batched)}
    rows = []
    for level in args.levels:
        log(f"sweep {size} {level} ...")
        single, batched = runs[level]
        single()
        batched()  # warm-up
        times: dict[str, list[float]] = {"single": [], "batched": []}
        for _ in range(args.repeats):
            times["single"].append(wall_time(single, device))
            times["batched"].append(wall_time(batched, device))
        t_single = statistics.median(times["single"])
        t_batched = statistics.median(times["batched"])
        ratio = t_single / t_batched
        informational = device.type == "cpu" and level == "model"
        rows.append(
            [
                size,
                level,
                f"{t_single:.3f}",
                f"{t_batched:.3f}",
                f"{ratio:.2f}×",
                "(not a target on CPU)" if informational else verdict(ratio >= need),
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["160x192", "64x64x64"])
    parser.add_argument("--count", type=int, default=16, help="K, the number of λ values")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=None, help="chunk for sweep_lambdas")
    parser.add_argument("--levels", nargs="+", default=["model", "api"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA only)")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    device = torch.device(args.device)
    count = args.count
    lambdas = np.linspace(0.0, 1.0, count).round(6).tolist()
    rows = [row for size in args.sizes for row in _bench_size(size, args, lambdas, device)]
    need = "≥ 3×" if device.type == "cuda" else "≥ 1× (no slower)"
    default_chunk = "one λ per pass on a CPU" if device.type == "cpu" else "all λ in one pass"
    chunk_text = args.chunk or f"default: {default_chunk}"
    print(
        f"K = {count} values of λ (0 … 1) for one pair: one batched call (the pair repeated K "
        "times, per-sample generated weights as grouped convolutions) against K single-λ calls, "
        f"side by side in one process, median of {args.repeats} interleaved runs after a "
        "warm-up; untrained default-width model, random images, device "
        f"{device}{', bf16 autocast' if args.amp else ''}. *model*: `HyperMorph.forward` only; "
        f"*api*: `sweep_lambdas` (chunk {chunk_text}) against K × `register_pair` (both with "
        "Dice, folding and log-J per λ). Ratio = single / batched.\n"
    )
    header = ["size", "level", f"{count} single calls (s)", "one batched sweep (s)", "ratio"]
    print(table([*header, f"target {need}"], rows))
    print(
        "\nTarget (DESIGN.md §5): on a GPU ≥ 3 × faster than 16 single calls; on CPU no slower "
        "(API level)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
