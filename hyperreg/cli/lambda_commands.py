"""Command line for choosing λ and registering many pairs: ``hyperreg {sweep, tune, batch}``.

:func:`add_parsers` adds the three subcommands to ``hyperreg``'s parser (:mod:`hyperreg.cli.run`);
:data:`COMMANDS` maps them to their functions. As in ``cli``, torch and the library are imported
inside the command functions, and library errors become one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hyperreg.cli.args import PROG, add_common, lambda_list, lambda_value, percent, positive_int

__all__ = ["COMMANDS", "add_parsers"]



def add_parsers(sub: Any) -> None:
    """Add the ``sweep``, ``tune`` and ``batch`` subparsers to ``sub`` (from ``add_subparsers``)."""
    chunk_help = (
        "largest number of λ per batched forward pass (bounds memory; default: all at once). "
        "Use a small value for 3D on a CPU"
    )
    amp_help = "bfloat16 autocast for the forward pass (CUDA only; metrics stay float32)"

    sweep = sub.add_parser(
        "sweep", help="register one pair at many λ in one batched pass; CSV and figures"
    )
    sweep.add_argument("--model", required=True, help="checkpoint (.pt) from 'hyperreg train'")
    sweep.add_argument("--moving", required=True, help="moving image (NIfTI, MGZ or npz)")
    sweep.add_argument(
        "--fixed",
        required=True,
        help="fixed image; outputs are on its grid (a moving image on another grid is "
        "resampled onto it first, see --no-resample)",
    )
    sweep.add_argument("--moving-seg", help="moving label map (with --fixed-seg: Dice per λ)")
    sweep.add_argument("--fixed-seg", help="fixed label map")
    sweep.add_argument(
        "--lambdas",
        type=lambda_list,
        default="0:1:11",
        help="λ values: start:stop:count (inclusive, evenly spaced) or a comma list "
        "(default 0:1:11)",
    )
    sweep.add_argument(
        "--out",
        required=True,
        help="output folder: sweep.csv, sweep_curves.png (Dice and folding vs λ), "
        "sweep_montage.png (moved images and |u| across λ; 3D: middle slice)",
    )
    sweep.add_argument(
        "--save-fields",
        action="store_true",
        help="also write moved_lam<λ>.nii.gz, warp_lam<λ>.nii.gz (displacement field, voxels, "
        "i/j/k order, fixed affine) and moved_seg_lam<λ>.nii.gz per λ",
    )
    sweep.add_argument("--chunk", type=positive_int, help=chunk_help)
    sweep.add_argument("--amp", action="store_true", help=amp_help)
    sweep.add_argument(
        "--no-resample",
        dest="resample",
        action="store_false",
        help="do not resample inputs on another grid; differing grids are then an error",
    )
    sweep.add_argument(
        "--normalization",
        choices=("minmax", "none"),
        default="minmax",
        help="intensity normalisation of both images (default minmax to [0, 1])",
    )
    add_common(sweep)

    tune = sub.add_parser(
        "tune", help="find λ* maximising mean validation Dice (optionally under a folding limit)"
    )
    tune.add_argument("--model", required=True, help="checkpoint (.pt) from 'hyperreg train'")
    tune.add_argument(
        "--pairs",
        required=True,
        help="validation CSV with columns moving, fixed, moving_seg, fixed_seg (paths relative "
        "to the CSV)",
    )
    tune.add_argument(
        "--out", required=True, help="output folder: tune.json and tune.png (Dice, folding vs λ)"
    )
    tune.add_argument(
        "--max-folding",
        type=percent,
        help="largest mean folding, in %% of voxels with J <= 0, for λ* (default: no limit)",
    )
    tune.add_argument(
        "--lambdas",
        type=lambda_list,
        default="0:1:11",
        help="coarse grid, start:stop:count or a comma list (default 0:1:11)",
    )
    tune.add_argument(
        "--refine-rounds",
        type=int,
        default=2,
        help="refinement rounds inside the best bracket (default 2; 0 = coarse grid only)",
    )
    tune.add_argument(
        "--refine-points",
        type=positive_int,
        default=8,
        help="new λ values per refinement round (default 8)",
    )
    tune.add_argument("--chunk", type=positive_int, help=chunk_help)
    tune.add_argument("--amp", action="store_true", help=amp_help)
    add_common(tune)

    batch = sub.add_parser(
        "batch", help="register many pairs from a CSV: resumable, failures recorded, shardable"
    )
    batch.add_argument("--model", required=True, help="checkpoint (.pt) from 'hyperreg train'")
    batch.add_argument(
        "--pairs",
        required=True,
        help="CSV with columns moving, fixed, optional moving_seg, fixed_seg, lambda (paths "
        "relative to the CSV)",
    )
    batch.add_argument(
        "--out",
        required=True,
        help="output folder: pairs/pairNNNNN/{moved,warp,moved_seg}.nii.gz, summary.csv, "
        "failures.csv. A rerun skips finished pairs. Under torchrun each process takes rows "
        "RANK::WORLD_SIZE",
    )
    batch.add_argument(
        "--lambda",
        dest="lam",
        type=lambda_value,
        help="λ in [0, 1] for rows without a 'lambda' value",
    )
    batch.add_argument(
        "--warp-format",
        choices=("voxel", "itk"),
        default="voxel",
        help="format of warp.nii.gz: voxel (default; voxels, i/j/k order, fixed affine) or itk",
    )
    batch.add_argument(
        "--no-resample",
        dest="resample",
        action="store_false",
        help="do not resample inputs on another grid; such pairs then fail",
    )
    batch.add_argument(
        "--normalization",
        choices=("minmax", "none"),
        default="minmax",
        help="intensity normalisation (default minmax to [0, 1])",
    )
    batch.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm bar")
    add_common(batch)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from hyperreg._checks import resolve_device
    from hyperreg.apps.sweep import sweep_files
    from hyperreg.method.model import load_checkpoint

    if bool(args.moving_seg) != bool(args.fixed_seg):
        raise ValueError("--moving-seg and --fixed-seg go together (Dice needs both)")
    device = resolve_device("sweep", args.device)
    model, _ = load_checkpoint(args.model, map_location=device)
    report = sweep_files(
        model,
        args.moving,
        args.fixed,
        args.lambdas,
        args.out,
        moving_seg=args.moving_seg,
        fixed_seg=args.fixed_seg,
        save_fields=args.save_fields,
        chunk=args.chunk,
        amp=args.amp,
        normalization=args.normalization,
        resample=args.resample,
    )
    for message in report.results[0].resampled:
        print(f"{PROG} sweep: {message}")
    print(f"{'lambda':>8} {'dice':>7} {'fold%':>8} {'sdlogJ':>7} {'ncc':>6}")
    for r in report.results:
        dice = f"{r.mean_dice:7.4f}" if r.dice is not None else f"{'-':>7}"
        print(
            f"{r.lam:8.4g} {dice} {100 * r.folding_fraction:8.3f} {r.log_jacobian_std:7.4f} "
            f"{r.extra['ncc']:6.3f}"
        )
    if report.baseline_dice is not None:
        print(f"no registration: mean Dice {report.baseline_dice:.4f}")
    print(f"wrote {len(report.files)} files to {args.out}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from hyperreg._checks import resolve_device
    from hyperreg.apps.batch import read_pairs
    from hyperreg.apps.tune import tune_lambda, write_tune_report
    from hyperreg.method.model import load_checkpoint

    pairs = read_pairs(args.pairs, require_segs=True)
    device = resolve_device("tune", args.device)
    model, _ = load_checkpoint(args.model, map_location=device)
    result = tune_lambda(
        model,
        pairs,
        lambdas=args.lambdas,
        max_folding=args.max_folding,
        refine_rounds=args.refine_rounds,
        refine_points=args.refine_points,
        chunk=args.chunk,
        amp=args.amp,
    )
    paths = write_tune_report(result, args.out)
    limit = "" if args.max_folding is None else f" (folding limit {args.max_folding:g} %)"
    print(
        f"λ* = {result.lambda_star:.4g}: mean Dice {result.dice_at_star:.4f}, folding "
        f"{result.folding_percent_at_star:.3f} % over {result.pairs} pair(s){limit}; "
        f"{len(result.grid)} λ evaluated"
    )
    if not result.constraint_met:
        print(f"{PROG} tune: no λ met the folding limit; λ* has the least folding")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _cmd_batch(args: argparse.Namespace) -> int:
    from hyperreg.apps.batch import run_batch

    run = run_batch(
        args.model,
        args.pairs,
        args.out,
        lam=args.lam,
        device=args.device,
        normalization=args.normalization,
        resample=args.resample,
        warp_format=args.warp_format,
        progress=args.progress,
    )
    report = run.report
    who = f"rank {run.rank}/{run.world_size}: " if run.world_size > 1 else ""
    print(
        f"{who}{report.done} registered, {report.skipped} already done, {report.failed} failed "
        f"({report.seconds:.1f} s)"
    )
    if run.merged is not None:
        summary, failures, rows, failed = run.merged
        print(f"{summary}: {rows} of {run.total} pairs done; {failures}: {failed} failure(s)")
    if report.failed:
        print(
            f"{PROG} batch: error: {report.failed} pair(s) failed, see failures.csv",
            file=sys.stderr,
        )
        return 1
    return 0


COMMANDS = {"sweep": _cmd_sweep, "tune": _cmd_tune, "batch": _cmd_batch}
