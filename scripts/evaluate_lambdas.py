"""Register one pair at several λ and print a CSV of Dice and folding per λ.

Example (the shared OASIS pair)::

    python scripts/evaluate_lambdas.py --model runs/oasis2d/model.pt \
        --moving OASIS_OAS1_0002_MR1/slice_norm.nii.gz \
        --fixed OASIS_OAS1_0001_MR1/slice_norm.nii.gz \
        --moving-seg OASIS_OAS1_0002_MR1/slice_seg24.nii.gz \
        --fixed-seg OASIS_OAS1_0001_MR1/slice_seg24.nii.gz --lambdas 0,0.1,0.3,0.5,0.7,0.9,1

Dice is the mean over the labels present in both label maps; ``lambda = none`` is the row
without registration. Uses the public API only.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--moving", required=True)
    parser.add_argument("--fixed", required=True)
    parser.add_argument("--moving-seg", required=True)
    parser.add_argument("--fixed-seg", required=True)
    parser.add_argument("--lambdas", default="0,0.1,0.2,0.3,0.4,0.5,0.7,0.9,1")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)

    import numpy as np

    from hyperreg._checks import resolve_device
    from hyperreg.inference import register_pair
    from hyperreg.io import load_volume
    from hyperreg.metrics import mean_dice
    from hyperreg.model import load_checkpoint

    try:
        lambdas = [float(v) for v in args.lambdas.split(",")]
        model, _ = load_checkpoint(args.model, map_location=resolve_device("main", args.device))
        moving, fixed = load_volume(args.moving), load_volume(args.fixed)
        moving_seg = load_volume(args.moving_seg, label=True)
        fixed_seg = load_volume(args.fixed_seg, label=True)
        labels = sorted(set(np.unique(moving_seg.data)) & set(np.unique(fixed_seg.data)) - {0})
        writer = csv.writer(sys.stdout)
        writer.writerow(["lambda", "mean_dice", "folding_percent", "log_jacobian_std"])
        writer.writerow(
            ["none", f"{mean_dice(moving_seg.data, fixed_seg.data, labels):.4f}", "", ""]
        )
        for lam in lambdas:
            result = register_pair(
                model, moving, fixed, lam, moving_seg=moving_seg, fixed_seg=fixed_seg
            )
            writer.writerow(
                [
                    f"{lam:g}",
                    f"{mean_dice(result.moved_seg, fixed_seg.data, labels):.4f}",
                    f"{100 * result.folding_fraction:.4f}",
                    f"{result.log_jacobian_std:.4f}",
                ]
            )
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"evaluate_lambdas: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
