"""Register every pair of a CSV from Python: what ``hyperreg batch`` does, through the public API.

Example::

    python scripts/batch_register.py --model runs/oasis2d/model.pt --pairs pairs.csv \
        --out batch-out --lambda 0.3

    # several processes, each on a disjoint shard (rank r takes rows r::N)
    torchrun --nproc-per-node 2 scripts/batch_register.py --model ... --pairs ... --out ...

The CSV has columns ``moving``, ``fixed`` and optionally ``moving_seg``, ``fixed_seg`` and
``lambda`` (paths relative to the CSV; ``--lambda`` serves rows without one). Writes
``pairs/pairNNNNN/{moved,warp,moved_seg}.nii.gz``, ``summary.csv`` and ``failures.csv`` into
``--out``; a rerun skips finished pairs. Exit code 0 when every pair is done, 1 when some pair
failed (see failures.csv), 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint from 'hyperreg train'")
    parser.add_argument("--pairs", required=True, help="pair CSV")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--lambda", dest="lam", type=float, help="λ for rows without one")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--progress", action="store_true", help="tqdm progress bar (rank 0)")
    args = parser.parse_args(argv)

    from hyperreg.apps.batch import run_batch

    try:
        run = run_batch(
            args.model,
            args.pairs,
            args.out,
            lam=args.lam,
            device=args.device,
            progress=args.progress,
        )
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"batch_register: error: {err}", file=sys.stderr)
        return 2
    report = run.report
    print(
        f"rank {run.rank}/{run.world_size}: {report.done} registered, {report.skipped} skipped, "
        f"{report.failed} failed in {report.seconds:.1f} s"
    )
    if run.merged is not None:
        summary, failures, rows, failed = run.merged
        print(f"{summary}: {rows} of {run.total} pairs; {failures}: {failed} failure(s)")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
