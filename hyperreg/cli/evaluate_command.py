"""Command line for ``hyperreg evaluate``: Dice, HD95, folding and NDV of finished registrations.

:func:`add_parsers` adds the subcommand; :data:`COMMANDS` maps it to its function. The library
is imported inside the function (``hyperreg --help`` stays fast).

Exit codes: 0 when every row was evaluated; 1 when at least one row failed (its error is in
``failures.csv`` and on stderr, one line per row; the other rows are evaluated and written, as
``hyperreg batch`` does); 2 for a bad CSV or option (nothing written).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.inputs import check_out_folder

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``evaluate`` subparser to ``sub``."""
    evaluate = sub.add_parser(
        "evaluate",
        help="Dice and HD95 per structure, folding, std log J and NDV (Learn2Reg LUMIR) of "
        "moved label maps and fields listed in a CSV",
    )
    opts.add_pairs_csv_argument(
        evaluate,
        "moved_seg, fixed_seg, optional warp (displacement field), moving_seg (the label map "
        "before registration: Dice is over the labels of moving_seg and fixed_seg, a label the "
        "warp erased scores 0) and name",
    )
    opts.add_out_argument(
        evaluate,
        "evaluation.csv (per pair), structures.csv (per structure), failures.csv, "
        "evaluation_boxplot.png (Dice and HD95 per structure)",
    )
    evaluate.add_argument(
        "--label-names",
        choices=("auto", "freesurfer", "none"),
        default="auto",
        help="structure names: auto (FreeSurfer LUT names when every id is a FreeSurfer "
        "aseg/DKT id, else numbers; default), freesurfer, or none",
    )
    opts.add_common(evaluate, device=False)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from hyperreg.apps.evaluate import evaluate_csv, read_evaluation_csv

    check_out_folder(args.out)
    read_evaluation_csv(args.pairs)  # a malformed CSV is exit 2 before anything is written
    report = evaluate_csv(args.pairs, args.out, naming=args.label_names)
    for index, name, error in report.failures:
        print(f"{opts.PROG} evaluate: row {index} ({name}) failed: {error}", file=sys.stderr)
    pairs = report.pairs
    if pairs:

        def mean(values: list[float | None]) -> float:
            kept = [v for v in values if v is not None and not math.isnan(v)]
            return sum(kept) / len(kept) if kept else float("nan")

        text = (
            f"{len(pairs)} pair(s): mean Dice {mean([p.mean_dice for p in pairs]):.4f}, "
            f"mean HD95 {mean([p.mean_hd95 for p in pairs]):.3f} mm over "
            f"{len(report.names)} structures"
        )
        if any(p.ndv_percent is not None for p in pairs):
            text += (
                f"; folding {mean([p.folding_percent for p in pairs]):.3f} % of voxels "
                f"(J ≤ 0), std log J {mean([p.log_jacobian_std for p in pairs]):.4f}, "
                f"NDV {mean([p.ndv_percent for p in pairs]):.4f} %"
            )
        print(text)
    print(f"wrote {', '.join(str(f) for f in report.files)}")
    if report.failures:
        print(
            f"{opts.PROG} evaluate: error: {len(report.failures)} row(s) failed, see failures.csv",
            file=sys.stderr,
        )
        return 1
    return 0


COMMANDS = {"evaluate": _cmd_evaluate}
