"""Command line for many pairs: ``hyperreg {batch, evaluate}``.

``batch`` registers the pairs of a CSV (resumable, failures recorded, shardable under
torchrun); ``evaluate`` scores finished registrations (Dice and HD95 per structure, folding,
NDV). :func:`add_parsers` adds the subcommands; :data:`COMMANDS` maps them to their functions.
The library is imported inside the functions (``hyperreg --help`` stays fast).

Exit codes: 0 when every pair (row) was done; 1 when at least one failed (its error is in
``failures.csv`` and on stderr; the others are done and written) or the output folder ran out of
room; 2 for a bad CSV or option, or a rerun with other settings without ``--overwrite`` (nothing
written); 130 when interrupted (Ctrl-C: the finished pairs are in ``summary.csv``).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.inputs import (
    check_out_folder,
    model_path_for,
    preprocessing_options,
    tuned_lambda,
)
from hyperreg.cli.messages import folding_text

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``batch`` and ``evaluate`` subparsers to ``sub``."""
    _add_batch(sub)
    _add_evaluate(sub)


def _add_batch(sub: Any) -> None:
    batch = sub.add_parser(
        "batch", help="register many pairs from a CSV: resumable, failures recorded, shardable"
    )
    opts.add_model_argument(batch)
    opts.add_pairs_csv_argument(
        batch,
        "moving, fixed, optional moving_seg, fixed_seg, lambda, initial_affine (an ITK "
        ".mat/.tfm per pair), fixed_mask and moving_mask (cost masks of 0 and 1 per pair, as "
        "register's --fixed-mask/--moving-mask), contrast (auto, same or different per pair, as "
        "--contrast) and name (the pair's output folder; default: "
        "from the file names, <moving>__to__<fixed>)",
    )
    opts.add_out_argument(
        batch,
        "pairs/<name>/{moved,warp,moved_seg}.nii.gz (and affine.mat with --init affine or "
        "rigid; warp.nii.gz is then the composed transform), summary.csv and failures.csv "
        "(updated as pairs finish). A rerun skips finished pairs (an interrupted run resumes); "
        "one with other settings is refused without --overwrite. Under torchrun each process "
        "takes rows RANK::WORLD_SIZE",
    )
    batch.add_argument(
        "--lambda",
        dest="lam",
        type=opts.lambda_request,
        help="λ for rows without a 'lambda' value: " + opts.LAMBDA_HELP + "; default: the "
        "model's default λ (its card's, or its best validation Dice). summary.csv records the "
        "λ used (lambda_chosen) and why (lambda_reason)",
    )
    opts.add_warp_format_argument(batch, "warp.nii.gz")
    opts.add_refine_arguments(batch, model_default=True)
    opts.add_passes_argument(batch)
    opts.add_keep_worse_argument(batch)
    opts.add_flip_argument(batch)
    opts.add_init_argument(batch, initial=False)  # per pair: the CSV's initial_affine column
    opts.add_preprocessing_arguments(batch, then="then a failed pair")
    opts.add_npz_geometry_argument(batch)
    opts.add_contrast_argument(batch)  # for rows without a 'contrast' cell
    batch.add_argument(
        "--overwrite",
        action="store_true",
        help="register again the pairs that --out holds with other settings (λ, --refine, "
        "--init, --passes, flip averaging, files), replacing their results; without it such a "
        "rerun is refused before any work",
    )
    batch.add_argument(
        "--report",
        action="store_true",
        help="also write OUT/report.html (one row per pair, pairs to check first, sortable; "
        "opens from file://) and a page per pair with a fixed/moved flicker (three planes in 3D), "
        "updated as pairs finish",
    )
    batch.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm bar")
    opts.add_common(batch)


def _add_evaluate(sub: Any) -> None:
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
        "evaluation.csv (per pair), structures.csv (per structure), failures.csv (only when "
        "a row failed), "
        "evaluation_boxplot.png (Dice and HD95 per structure)",
    )
    evaluate.add_argument(
        "--label-names",
        default="auto",
        metavar="{auto,freesurfer,none,FILE}",
        help="structure names in structures.csv and the box plot: auto (FreeSurfer LUT names "
        "when every id is a FreeSurfer aseg/DKT id, else numbers; default), freesurfer, none, "
        "or a FILE of names: a FreeSurfer colour table ('id name r g b a' lines, e.g. "
        "FreeSurferColorLUT.txt) or a CSV of id,name; ids it lacks keep their numbers",
    )
    opts.add_common(evaluate, device=False)


def _cmd_batch(args: argparse.Namespace) -> int:
    from hyperreg._errors import passed_as
    from hyperreg.apps.batch import BatchInterrupted, run_batch
    from hyperreg.apps.inputs import check_pair_masks, read_pairs

    check_out_folder(args.out)
    with passed_as(path="pairs"):  # a malformed CSV is exit 2 before any work
        check_pair_masks("batch", args.pairs, read_pairs(args.pairs))
    model_path_for(args)  # a bad --model is exit 2 before any work; the bundled one is named
    tuned_lambda(args)  # --lambda tune.json: its λ* for rows without one, said with its source
    if args.refine is None:  # said before the pairs run, as register says it
        from hyperreg.apps.models import checkpoint_default_refine

        default = checkpoint_default_refine(args.model)
        if default.steps:
            print(f"{opts.PROG} batch: {default.source}; --refine 0: the network alone")
    try:
        run = run_batch(
            args.model,
            args.pairs,
            args.out,
            lam=args.lam,
            device=args.device,
            warp_format=args.warp_format,
            progress=args.progress,
            refine=opts.refinement_from(args, model_default=True),
            init=args.init,
            npz_geometry=args.npz_geometry,
            passes=args.passes,
            never_worse=not args.keep_worse,
            flip_average=args.flip_average,
            overwrite=args.overwrite,
            html_report=args.report,
            contrast=opts.contrast_from(args),
            **preprocessing_options(args),
        )
    except BatchInterrupted as stop:  # Ctrl-C: what finished is in summary.csv
        if args.debug:
            raise
        print(f"{opts.PROG} batch: {stop}", file=sys.stderr)
        return 130
    report = run.report
    who = f"rank {run.rank}/{run.world_size}: " if run.world_size > 1 else ""
    print(
        f"{who}{report.done} registered, {report.skipped} already done, {report.failed} failed "
        f"({report.seconds:.1f} s)"
    )
    if run.merged is not None:
        summary, failures, rows, failed = run.merged
        _print_means(summary)
        print(f"{summary}: {rows} of {run.total} pairs done; {failures}: {failed} failure(s)")
        _print_checks(summary)
        if args.report:
            print(f"report: {summary.parent / 'report.html'}")
    if report.failed:
        print(
            f"{opts.PROG} batch: error: {report.failed} pair(s) failed, see failures.csv",
            file=sys.stderr,
        )
        return 1
    return 0


def _print_means(summary: Any) -> None:
    """The λ the pairs of ``summary.csv`` got and why (the first three values), mean Dice
    (registered, affine alone, unregistered) over those with label maps, and mean folding."""
    import csv

    with open(summary, newline="") as handle:
        rows = list(csv.DictReader(handle))

    def mean(column: str) -> float | None:
        kept = [float(r[column]) for r in rows if r.get(column) not in (None, "")]
        return sum(kept) / len(kept) if kept else None

    chosen: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row.get("lambda_chosen", ""), row.get("lambda_reason", ""))
        chosen[key] = chosen.get(key, 0) + 1
    for (lam, reason), count in list(chosen.items())[:3]:
        print(f"λ = {float(lam):.4g} for {count} pair(s): {reason}")
    if len(chosen) > 3:
        print(f"λ: {len(chosen) - 3} more values (summary.csv: lambda_chosen, lambda_reason)")
    dice = mean("mean_dice")
    if dice is not None:
        labelled = sum(1 for r in rows if r.get("mean_dice"))
        text = f"mean Dice {dice:.4f} over {labelled} pair(s) with label maps"
        before = (
            ("affine alone", mean("dice_affine")),
            ("before registration", mean("dice_before")),
        )
        others = ", ".join(f"{name} {value:.4f}" for name, value in before if value is not None)
        print(text + (f" ({others})" if others else ""))
    if rows:
        folding = mean("folding_percent") or 0.0
        print(f"{folding_text(folding)}, mean over {len(rows)} pair(s)")


_CHECKS_SHOWN = 20


def _print_checks(summary: Any) -> None:
    """The pairs of ``summary.csv`` whose verdict is ``check: <reason>``, one line each (the
    first :data:`_CHECKS_SHOWN`), or nothing when every pair is ``ok``."""
    import csv

    with open(summary, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("verdict", "").startswith("check")]
    if not rows:
        return
    print(f"{len(rows)} pair(s) to check (summary.csv: verdict):")
    for row in rows[:_CHECKS_SHOWN]:
        print(f"  {row['name']} ({row['moving']} -> {row['fixed']}): {row['verdict']}")
    if len(rows) > _CHECKS_SHOWN:
        print(f"  ... and {len(rows) - _CHECKS_SHOWN} more")


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from hyperreg._errors import passed_as
    from hyperreg.apps.evaluate import evaluate_csv, read_evaluation_csv

    check_out_folder(args.out)
    with passed_as(path="pairs"):  # a malformed CSV is exit 2 before anything is written
        read_evaluation_csv(args.pairs)
    from hyperreg.geometry.structures import LABEL_NAMING

    word = args.label_names in LABEL_NAMING  # else a file of names (./auto for a file so named)
    report = evaluate_csv(
        args.pairs,
        args.out,
        naming=args.label_names if word else "auto",
        label_names=None if word else args.label_names,
    )
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


COMMANDS = {"batch": _cmd_batch, "evaluate": _cmd_evaluate}
