"""Drawing training pairs: ``PairSampler.sample`` with the scans in C order against Fortran order.

Scans load from NIfTI in Fortran order. Until issue 11 the sampler kept them so, and each batch
paid a transposing copy per image; it now keeps C-ordered copies made at load time. Both layouts
are timed side by side in one run on the same scans (the Fortran row swaps in Fortran-ordered
copies of the sampler's volumes), median of ``--repeats`` draws after two untimed ones, on the
CPU (the sampler always runs there; on a GPU its time adds to every training step). 3D only:
2D training already cut its slices from C-ordered copies.

    python benchmarks/bench_sampling.py --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from _common import DEFAULT_DATA, log, require_data, table

CASES = (  # (label, ndim, batch size, crop)
    ("3D 160 × 192 × 224, batch 1", 3, 1, ()),
    ("3D crop 128 × 160 × 192, batch 1", 3, 1, (128, 160, 192)),
)


def _median_ms(sampler, batch: int, repeats: int) -> float:
    import torch

    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        sampler.sample(batch, generator)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler.sample(batch, generator)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="a neurite-oasis folder")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="accepted for run_all; sampling is on CPU")
    args = parser.parse_args(argv)
    from pathlib import Path

    import numpy as np

    from hyperreg.training.data import PairSampler, find_scans

    require_data(Path(args.data), "OASIS_OAS1_0001_MR1", "OASIS_OAS1_0002_MR1")
    rows = []
    for label, ndim, batch, crop in CASES:
        log(f"sampling {label} ...")
        sampler = PairSampler(find_scans(Path(args.data), ndim), ndim, crop=crop)
        c_order = _median_ms(sampler, batch, args.repeats)
        sampler.volumes = [np.asfortranarray(v) for v in sampler.volumes]
        fortran = _median_ms(sampler, batch, args.repeats)
        rows.append([label, f"{fortran:.2f}", f"{c_order:.2f}", f"{fortran / c_order:.1f} ×"])
    print(
        f"`PairSampler.sample` on the {len(sampler.volumes)} scans of {Path(args.data).name}, "
        f"CPU, median of {args.repeats} draws (ms per batch):\n"
    )
    header = ["pairs", "scans in Fortran order (before)", "scans in C order (now)", "speed-up"]
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
