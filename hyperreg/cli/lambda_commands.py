"""Command line for choosing λ and registering many pairs: ``hyperreg {sweep, tune, batch}``.

:func:`add_parsers` adds the three subcommands to ``hyperreg``'s parser (:mod:`hyperreg.cli.run`);
:data:`COMMANDS` maps them to their functions. As in ``cli``, torch and the library are imported
inside the command functions, and library errors become one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.inputs import (
    check_out_folder,
    model_for,
    pair_options,
    preprocessing_options,
)
from hyperreg.cli.messages import affine_text, folding_text

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``sweep``, ``tune`` and ``batch`` subparsers to ``sub`` (from ``add_subparsers``)."""
    _add_sweep(sub)
    _add_tune(sub)
    _add_batch(sub)


def _add_sweep(sub: Any) -> None:
    sweep = sub.add_parser(
        "sweep", help="register one pair at many λ (batched on a GPU); CSV and figures"
    )
    opts.add_input_arguments(sweep)
    opts.add_lambda_grid_argument(sweep)
    opts.add_out_argument(
        sweep,
        "sweep.csv, sweep_curves.png (Dice and folding vs λ), "
        "sweep_montage.png (moved images and |u| across λ; 3D: middle slice)",
    )
    sweep.add_argument(
        "--save-fields",
        action="store_true",
        help="also write moved_lam<λ>.nii.gz, warp_lam<λ>.nii.gz (displacement field, voxels, "
        "i/j/k order, fixed affine; the whole transform, the --init affine composed with the "
        "deformable field, as register --warp) and moved_seg_lam<λ>.nii.gz per λ",
    )
    opts.add_batching_arguments(sweep)
    opts.add_refine_arguments(sweep)
    opts.add_init_argument(sweep)
    opts.add_preprocessing_arguments(sweep)
    opts.add_common(sweep)


def _add_tune(sub: Any) -> None:
    tune = sub.add_parser(
        "tune", help="find λ* maximising mean validation Dice (optionally under a folding limit)"
    )
    opts.add_model_argument(tune)
    opts.add_pairs_csv_argument(tune, "moving, fixed, moving_seg, fixed_seg (validation pairs)")
    opts.add_out_argument(tune, "tune.json and tune.png (Dice, folding vs λ)")
    tune.add_argument(
        "--max-folding",
        type=opts.percent,
        help="largest mean folding, in %% of voxels with J ≤ 0, for λ* (default: no limit)",
    )
    opts.add_lambda_grid_argument(tune, "coarse grid")
    tune.add_argument(
        "--refine-rounds",
        type=int,
        default=2,
        help="refinement rounds inside the best bracket (default 2; 0 = coarse grid only)",
    )
    tune.add_argument(
        "--refine-points",
        type=opts.positive_int,
        default=8,
        help="new λ values per refinement round (default 8)",
    )
    opts.add_batching_arguments(tune)
    opts.add_init_argument(tune)
    opts.add_common(tune)


def _add_batch(sub: Any) -> None:
    batch = sub.add_parser(
        "batch", help="register many pairs from a CSV: resumable, failures recorded, shardable"
    )
    opts.add_model_argument(batch)
    opts.add_pairs_csv_argument(batch, "moving, fixed, optional moving_seg, fixed_seg, lambda")
    opts.add_out_argument(
        batch,
        "pairs/pairNNNNN/{moved,warp,moved_seg}.nii.gz (and affine.mat with --init affine or "
        "rigid; warp.nii.gz is then the composed transform), summary.csv, "
        "failures.csv. A rerun skips finished pairs. Under torchrun each process takes rows "
        "RANK::WORLD_SIZE",
    )
    batch.add_argument(
        "--lambda",
        dest="lam",
        type=opts.lambda_value,
        help="λ in [0, 1] for rows without a 'lambda' value",
    )
    opts.add_warp_format_argument(batch, "warp.nii.gz")
    opts.add_refine_arguments(batch)
    opts.add_init_argument(batch)
    opts.add_preprocessing_arguments(batch, then="then a failed pair")
    batch.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm bar")
    opts.add_common(batch)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from hyperreg.apps.sweep import sweep_files
    from hyperreg.cli.refining import refine_text, refinement_from

    if bool(args.moving_seg) != bool(args.fixed_seg):
        raise ValueError("--moving-seg and --fixed-seg go together (Dice needs both)")
    check_out_folder(args.out)
    report = sweep_files(
        model_for(args),
        args.moving,
        args.fixed,
        args.lambdas,
        args.out,
        save_fields=args.save_fields,
        chunk=args.chunk,
        amp=args.amp,
        refine=refinement_from(args),
        init=args.init,
        **pair_options(args),
    )
    for message in report.results[0].resampled:
        print(f"{opts.PROG} sweep: {message}")
    print(f"{'lambda':>8} {'dice':>7} {'fold%':>8} {'sdlogJ':>7} {'ncc':>6}")
    for r in report.results:
        dice = f"{r.mean_dice:7.4f}" if r.dice is not None else f"{'-':>7}"
        print(
            f"{r.lam:8.4g} {dice} {100 * r.folding_fraction:8.3f} {r.log_jacobian_std:7.4f} "
            f"{r.ncc if r.ncc is not None else float('nan'):6.3f}"
        )
        if refine_text(r.refinement):
            print(f"{'':8} {refine_text(r.refinement)}")
    first = report.results[0]
    if first.affine is not None:
        print(affine_text(args.init, first.affine))
    if report.baseline_dice is not None:
        alone = "" if first.dice_affine is None else f", {args.init} alone {first.dice_affine:.4f}"
        print(f"no registration: mean Dice {report.baseline_dice:.4f}{alone}")
    print(f"wrote {len(report.files)} files to {args.out}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from hyperreg.apps.batch import read_pairs
    from hyperreg.apps.inference import check_label_map
    from hyperreg.apps.tune import tune_lambda, write_tune_report

    check_out_folder(args.out)
    pairs = read_pairs(args.pairs, require_segs=True)
    for pair in pairs:  # before any work: an intensity image in a label column is bad input
        for column in ("moving_seg", "fixed_seg"):
            try:
                check_label_map("tune", column, getattr(pair, column))
            except ValueError as err:
                raise ValueError(f"row {pair.index} of --pairs: {err}") from err
    result = tune_lambda(
        model_for(args),
        pairs,
        lambdas=args.lambdas,
        max_folding=args.max_folding,
        refine_rounds=args.refine_rounds,
        refine_points=args.refine_points,
        chunk=args.chunk,
        amp=args.amp,
        init=args.init,
    )
    paths = write_tune_report(result, args.out)
    limit = "" if args.max_folding is None else f" (folding limit {args.max_folding:g} %)"
    print(
        f"λ* = {result.lambda_star_text}: mean Dice {result.dice_at_star:.4f}, mean "
        f"{folding_text(result.folding_percent_at_star)} over {result.pairs} pair(s){limit}; "
        f"{len(result.grid)} λ evaluated"
    )
    if not result.constraint_met:
        print(f"{opts.PROG} tune: no λ met the folding limit; λ* has the least folding")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _cmd_batch(args: argparse.Namespace) -> int:
    from hyperreg.apps.batch import run_batch
    from hyperreg.cli.refining import refinement_from

    check_out_folder(args.out)
    run = run_batch(
        args.model,
        args.pairs,
        args.out,
        lam=args.lam,
        device=args.device,
        warp_format=args.warp_format,
        progress=args.progress,
        refine=refinement_from(args),
        init=args.init,
        **preprocessing_options(args),
    )
    if run.bundled is not None:
        print(f"{opts.PROG} batch: used the bundled model {run.bundled} ({run.model})")
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
            f"{opts.PROG} batch: error: {report.failed} pair(s) failed, see failures.csv",
            file=sys.stderr,
        )
        return 1
    return 0


COMMANDS = {"sweep": _cmd_sweep, "tune": _cmd_tune, "batch": _cmd_batch}
