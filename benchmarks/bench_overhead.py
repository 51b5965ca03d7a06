"""Hypernetwork overhead: HyperMorph at one λ against the same U-Net with fixed weights.

Both run the identical pipeline (padding, U-Net, scaling and squaring, resize, warp); the only
difference is that HyperMorph generates the U-Net weights from λ in every call, while the
baseline receives weights generated once beforehand (ordinary fixed weights). Median of
``--repeats`` timed calls after one warm-up, interleaved, in one process. Prints a Markdown table.

    python benchmarks/bench_overhead.py --sizes 160x192 80x96x112 --device cpu
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Sequence


def _time(fn, device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["160x192", "80x96x112"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import torch

    from hyperreg.config import ModelConfig
    from hyperreg.model import HyperMorph

    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}")
    print("| size | fixed-weight U-Net (s) | HyperMorph, weights from λ (s) | ratio | target |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        shape = tuple(int(s) for s in size.split("x"))
        torch.manual_seed(0)
        model = HyperMorph(ModelConfig(ndim=len(shape))).to(device).eval()
        moving = torch.rand(1, 1, *shape, device=device)
        fixed = torch.rand(1, 1, *shape, device=device)
        lam = torch.tensor([[0.3]], device=device)
        with torch.no_grad():
            params = {k: v[0] for k, v in model.generate_weights(lam).items()}
            runs = {
                "fixed": functools.partial(model._register, moving, fixed, params),
                "hyper": functools.partial(model, moving, fixed, 0.3),
            }
            for fn in runs.values():
                fn()
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.repeats):
                for name, fn in runs.items():
                    times[name].append(_time(fn, device))
        fixed_s = statistics.median(times["fixed"])
        hyper_s = statistics.median(times["hyper"])
        print(f"| {size} | {fixed_s:.4f} | {hyper_s:.4f} | {hyper_s / fixed_s:.3f} | ≤ 1.05 |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
