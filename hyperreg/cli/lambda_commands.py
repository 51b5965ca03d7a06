"""Command line for choosing λ: ``hyperreg {sweep, tune}``.

:func:`add_parsers` adds the two subcommands to ``hyperreg``'s parser (:mod:`hyperreg.cli.run`);
:data:`COMMANDS` maps them to their functions. As in ``cli``, torch and the library are imported
inside the command functions, and library errors become one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.inputs import (
    check_out_folder,
    model_for,
    pair_options,
    tuned_lambda,
)
from hyperreg.cli.messages import affine_text, folding_text, refine_text

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``sweep`` and ``tune`` subparsers to ``sub`` (from ``add_subparsers``)."""
    _add_sweep(sub)
    _add_tune(sub)


def _add_sweep(sub: Any) -> None:
    sweep = sub.add_parser(
        "sweep", help="register one pair at many λ (batched on a GPU); CSV and figures"
    )
    opts.add_input_arguments(sweep)
    opts.add_lambda_grid_argument(sweep)
    sweep.add_argument(
        "--lambda",
        dest="lam",
        type=opts.lambda_request,
        help="a λ to mark among the results ('chosen' column of sweep.csv, added to --lambdas "
        f"if missing): a number, {opts.AUTO_HELP}, or a tune.json that 'hyperreg tune' wrote "
        "(its λ*)",
    )
    opts.add_out_argument(
        sweep,
        "sweep.csv, sweep_curves.png (Dice, std log J and folding vs λ), "
        "sweep_montage.png (moved images and |u| across λ; 3D: middle slice)",
    )
    sweep.add_argument(
        "--save-fields",
        action="store_true",
        help="also write moved_lam<λ>.nii.gz, warp_lam<λ>.nii.gz (displacement field, voxels, "
        "i/j/k order, fixed affine; the whole transform, the --init affine composed with the "
        "deformable field, as register --warp) and moved_seg_lam<λ>.nii.gz per λ",
    )
    sweep.add_argument(
        "--html",
        help="also write this self-contained HTML page (no server, no network): a λ slider over "
        "the swept λ with the moved images, overlays and curves (3D volumes at about 2 mm, "
        "8-bit grey levels)",
    )
    opts.add_batching_arguments(sweep)
    opts.add_refine_arguments(sweep)
    opts.add_passes_argument(sweep)
    opts.add_keep_worse_argument(sweep)
    opts.add_contrast_argument(sweep)
    opts.add_mask_arguments(sweep)
    opts.add_flip_argument(sweep)
    opts.add_init_argument(sweep)
    opts.add_preprocessing_arguments(sweep)
    opts.add_npz_geometry_argument(sweep)
    opts.add_common(sweep)


def _add_tune(sub: Any) -> None:
    tune = sub.add_parser(
        "tune", help="find λ* maximising mean validation Dice (optionally under a folding limit)"
    )
    opts.add_model_argument(tune)
    opts.add_pairs_csv_argument(tune, "moving, fixed, moving_seg, fixed_seg (validation pairs)")
    opts.add_out_argument(tune, "tune.json and tune.png (Dice, std log J, folding vs λ)")
    tune.add_argument(
        "--max-folding",
        type=opts.percent,
        help="largest mean folding, in %% of voxels with J ≤ 0, for λ* (default: no limit)",
    )
    opts.add_lambda_grid_argument(tune, "coarse grid")
    tune.add_argument(
        "--bracket-rounds",
        type=opts.non_negative_int,
        default=2,
        help="λ bracketing rounds: each evaluates --bracket-points new λ inside the bracket "
        "around the best so far (default 2; 0 = coarse grid only)",
    )
    tune.add_argument(
        "--bracket-points",
        type=opts.positive_int,
        default=8,
        help="new λ values per bracketing round (default 8)",
    )
    for old, new in (
        ("--refine-rounds", "--bracket-rounds"),
        ("--refine-points", "--bracket-points"),
    ):
        tune.add_argument(  # the former names, which read as test-time refinement (--refine)
            old,
            dest=f"renamed_{new[2:].replace('-', '_')}",
            type=opts.non_negative_int,
            default=None,
            help=argparse.SUPPRESS,
        )
    opts.add_refine_arguments(tune, model_default=True)
    opts.add_contrast_argument(tune)
    opts.add_batching_arguments(tune)
    opts.add_nonfinite_argument(tune)
    opts.add_init_argument(tune, initial=False)  # per pair: the CSV's initial_affine column
    opts.add_common(tune)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from hyperreg.apps.sweep import sweep_files

    if bool(args.moving_seg) != bool(args.fixed_seg):
        raise ValueError("--moving-seg and --fixed-seg go together (Dice needs both)")
    check_out_folder(args.out)
    tuned_lambda(args)  # --lambda tune.json: its λ*, said with its source
    report = sweep_files(
        model_for(args),
        args.moving,
        args.fixed,
        args.lambdas,
        args.out,
        save_fields=args.save_fields,
        chunk=args.chunk,
        amp=args.amp,
        refine=opts.refinement_from(args),
        init=args.init,
        initial_affine=args.initial_affine,
        lam=args.lam,
        npz_geometry=args.npz_geometry,
        passes=args.passes,
        never_worse=not args.keep_worse,
        html=args.html,
        contrast=opts.contrast_from(args),
        fixed_mask=args.fixed_mask,
        moving_mask=args.moving_mask,
        **pair_options(args),
    )
    first = report.results[0]
    if first.affine is not None:  # in the order they ran: affine stage, then the λ
        print(affine_text(args.init, first.affine))
    for message in first.resampled:
        print(f"{opts.PROG} sweep: {message}")
    if report.chosen is not None:
        print(f"chosen λ = {report.chosen.lam:.4g}: {report.chosen.reason} (marked * below)")
    print(f"{'lambda':>8} {'dice':>7} {'fold%':>8} {'sdlogJ':>7} {'ncc':>6}")
    for r in report.results:
        dice = f"{r.mean_dice:7.4f}" if r.dice is not None else f"{'-':>7}"
        print(
            f"{r.lam:8.4g} {dice} {100 * r.folding_fraction:8.3f} {r.log_jacobian_std:7.4f} "
            f"{r.ncc if r.ncc is not None else float('nan'):6.3f}" + (" *" if r.lam_reason else "")
        )
        if refine_text(r.refinement):
            print(f"{'':8} {refine_text(r.refinement)}")
    if report.baseline_dice is not None:
        alone = "" if first.dice_affine is None else f", {args.init} alone {first.dice_affine:.4f}"
        print(f"no registration: mean Dice {report.baseline_dice:.4f}{alone}")
    print(f"wrote {len(report.files)} files to {args.out}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from hyperreg._errors import InputError, passed_as
    from hyperreg.apps.inputs import check_label_map, read_pairs
    from hyperreg.registration.defaults import pair_refinement
    from hyperreg.apps.tune import tune_lambda, write_tune_report

    check_out_folder(args.out)
    with passed_as(path="pairs"):  # read_pairs(path) is fed by --pairs
        pairs = read_pairs(args.pairs, require_segs=True)
    for pair in pairs:  # before any work: an intensity image in a label column is bad input
        for column in ("moving_seg", "fixed_seg"):
            try:
                check_label_map("tune", column, getattr(pair, column))
            except InputError as err:  # the column's name, not an option: the detail as is
                raise ValueError(f"row {pair.index} of --pairs: {err.detail}") from err
    _renamed_flags(args)
    model = model_for(args)
    refine = pair_refinement(model, opts.refinement_from(args, model_default=True))
    print(_measured_text(model, refine, args.refine))
    result = tune_lambda(
        model,
        pairs,
        lambdas=args.lambdas,
        max_folding=args.max_folding,
        bracket_rounds=args.bracket_rounds,
        bracket_points=args.bracket_points,
        refine=refine,
        chunk=args.chunk,
        amp=args.amp,
        init=args.init,
        replace_nonfinite=args.replace_nonfinite,
        contrast=opts.contrast_from(args),
    )
    paths = write_tune_report(result, args.out)
    limit = "" if args.max_folding is None else f" (folding limit {args.max_folding:g} %)"
    print(
        f"λ* = {result.lambda_star_text}: mean Dice {result.dice_at_star:.4f}, mean "
        f"{folding_text(result.folding_percent_at_star)} over {result.pairs} pair(s){limit}; "
        f"{_evaluated_text(result.grid, result.pairs)}"
    )
    if not result.constraint_met:
        print(f"{opts.PROG} tune: no λ met the folding limit; λ* has the least folding")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _renamed_flags(args: argparse.Namespace) -> None:
    """``--refine-rounds`` / ``--refine-points``, the former names of ``--bracket-rounds`` /
    ``--bracket-points``, still work, with a note on stderr."""
    import sys

    for new in ("bracket_rounds", "bracket_points"):
        value = getattr(args, f"renamed_{new}")
        if value is not None:
            old = "--" + new.replace("bracket", "refine").replace("_", "-")
            flag = "--" + new.replace("_", "-")
            print(
                f"{opts.PROG} tune: warning: {old} is now {flag} (λ bracketing; --refine is "
                "test-time refinement); the old name will go",
                file=sys.stderr,
            )
            setattr(args, new, value)


def _measured_text(model: Any, refine: Any, asked: int | None) -> str:
    """What each λ is registered with, said before the work: as ``register`` runs it
    (the model's passes and its default refinement) or, with ``--refine 0``, the network
    alone."""
    passes = model.config.passes
    runs = f"{passes} network pass{'es' if passes != 1 else ''}"
    if model.config.flip_average:
        runs += ", flip averaging"
    if refine is not None:
        source = " (the model's default)" if asked is None else ""
        return (
            f"{opts.PROG} tune: each λ registered as 'register' runs it: {runs}, refined "
            f"{refine.steps} steps{source}; --refine 0 measures the network alone (faster)"
        )
    from hyperreg.registration.defaults import model_default_refine

    default = model_default_refine(model).steps
    if default:
        return (
            f"{opts.PROG} tune: each λ registered by the network alone ({runs}), not as "
            f"'register' runs it by default (refined {default} steps): λ* is that of "
            "'register --refine 0'"
        )
    return f"{opts.PROG} tune: each λ registered as 'register' runs it: {runs}, no refinement"


COMMANDS = {"sweep": _cmd_sweep, "tune": _cmd_tune}


def _evaluated_text(grid: list[dict[str, Any]], pairs: int) -> str:
    """``"20 λ (5 on the grid, 15 in bracketing rounds) × 4 pairs = 80 registrations"``."""
    coarse = sum(row["stage"] == "coarse" for row in grid)
    where = f"{coarse} on the grid"
    if len(grid) > coarse:
        where += f", {len(grid) - coarse} in bracketing rounds"
    return f"{len(grid)} λ ({where}) × {pairs} pair(s) = {len(grid) * pairs} registrations"
