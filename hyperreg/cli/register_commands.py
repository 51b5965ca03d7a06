"""Command line for one pair: ``hyperreg {register, affine, warp, jacobian}``.

``register`` runs the whole pipeline (affine stage, network, optional refinement) and writes
the outputs; ``affine`` runs the affine stage alone; ``warp`` applies a saved transform to more
images; ``jacobian`` inspects a saved field. :func:`add_parsers` adds the subcommands to
``hyperreg``'s parser (:mod:`hyperreg.cli.run`); :data:`COMMANDS` maps them to their functions.
The library is imported inside the command functions, so ``hyperreg --help`` is fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.inputs import (
    created_folders,
    model_for,
    new_folders,
    pair_options,
    tuned_lambda,
)
from hyperreg.cli.messages import (
    affine_text,
    folding_text,
    mi_text,
    one_map_labels_text,
    refine_text,
    verdict_last,
)

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``register``, ``affine``, ``warp`` and ``jacobian`` subparsers to ``sub``."""
    _add_register(sub)
    _add_affine(sub)
    _add_warp(sub)
    _add_jacobian(sub)


def _add_register(sub: Any) -> None:
    reg = sub.add_parser("register", help="register a moving image to a fixed image at one λ")
    opts.add_input_arguments(reg)
    reg.add_argument(
        "--lambda",
        dest="lam",
        type=opts.lambda_request,
        help=opts.LAMBDA_HELP + "; default: the model's default λ (its card's, or its best "
        "validation Dice; printed with its source)",
    )
    reg.add_argument(
        "--moved",
        help="moved image, NIfTI, on the fixed grid with the fixed-image affine, in the moving "
        "image's own intensity units (float32)",
    )
    reg.add_argument(
        "--warp",
        dest="warp_out",  # the library argument it feeds (register_files)
        help="displacement field (voxels) of the whole transform (the --init affine composed "
        "with the deformable field: one field that 'hyperreg warp', ANTs and SimpleITK apply in "
        "one step), NIfTI (I,J,K,3) channel last, i/j/k order, fixed-image affine; moved[x] = "
        "moving(x + u(x)) with the moving image resampled through the headers; see --warp-format",
    )
    opts.add_warp_format_argument(reg, "--warp")
    reg.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say each stage's details (λ's source, passes, flip averaging, refinement, grids)",
    )
    opts.add_init_argument(reg)
    opts.add_affine_out_argument(reg)
    reg.add_argument(
        "--field-out",
        metavar="FILE",
        help="the deformable displacement field alone (voxels, fixed grid, --warp-format), "
        "defined on the moving image after the affine: 'hyperreg warp --affine A --warp F' "
        "applies the same transform as --warp",
    )
    reg.add_argument(
        "--moved-seg",
        help="moved label map (needs --moving-seg), NIfTI, integer type, fixed affine",
    )
    reg.add_argument(
        "--inverse-warp",
        dest="inverse_warp_out",
        help="inverse of the whole transform (affine stage and field; exp(-v) of the model's "
        "velocity), format --warp-format, on the moving image's grid and affine: warping the "
        "fixed image with it lands on the moving image; needs a model with a velocity field",
    )
    reg.add_argument(
        "--figure",
        metavar="PNG",
        help="alignment check figure: before (the moving image on the fixed grid, after the "
        "affine stage when one ran) and after (moved) against the fixed image: fixed-image "
        "edges overlaid, checkerboard, |difference|, and label borders with both label maps; "
        "every panel titled; 3D: middle slice",
    )
    opts.add_keep_worse_argument(reg)
    opts.add_refine_arguments(reg, model_default=True)
    opts.add_contrast_argument(reg)
    opts.add_passes_argument(reg)
    opts.add_flip_argument(reg)
    opts.add_preprocessing_arguments(reg)
    opts.add_mask_arguments(reg)
    opts.add_npz_geometry_argument(reg)
    opts.add_common(reg)


def _add_affine(sub: Any) -> None:
    affine = sub.add_parser(
        "affine",
        help="affine (or rigid) registration alone, in world space: moved image and ITK "
        "transform file",
    )
    opts.add_pair_arguments(affine, resample_flag=False)
    opts.add_label_arguments(affine)
    affine.add_argument(
        "--init",
        choices=("affine", "rigid", "none"),
        default="affine",
        help="the stage to run: affine (default; rigid first, then 12 degrees of freedom, 6 in "
        "2D), rigid, or none (resampling through the headers only, e.g. for Dice before)",
    )
    affine.add_argument(
        "--initial-affine",
        metavar="FILE",
        help="start from this ITK .mat/.tfm (ANTs, SimpleITK or an earlier --affine-out) and "
        "refine it; with --init none it is applied as is",
    )
    affine.add_argument(
        "--moved",
        help="moved image, NIfTI, on the fixed grid with the fixed-image affine and header "
        "codes, in the moving image's own intensity units (float32; 0 outside it)",
    )
    opts.add_affine_out_argument(affine)
    affine.add_argument(
        "--moved-seg",
        help="moved label map (needs --moving-seg), nearest neighbour, NIfTI integer type",
    )
    opts.add_npz_geometry_argument(affine)
    opts.add_bias_correct_argument(affine)
    opts.add_mask_arguments(affine)
    opts.add_nonfinite_argument(affine)
    opts.add_common(affine, device=False, seed=True)


def _add_warp(sub: Any) -> None:
    warp = sub.add_parser(
        "warp",
        help="apply a saved transform (affine and/or displacement field) to images and label "
        "maps, one interpolation each",
    )
    warp.add_argument(
        "--moving",
        required=True,
        nargs="+",
        metavar="FILE",
        help="images and label maps to warp (NIfTI, MGZ or npz), each sampled once from its "
        "own grid through the whole transform",
    )
    warp.add_argument(
        "--moved",
        required=True,
        nargs="+",
        metavar="FILE",
        help="one output per --moving, in order: NIfTI on the field's (or --fixed) grid with its "
        "affine; float32, or an unscaled integer type for label maps",
    )
    warp.add_argument(
        "--warp",
        dest="warp_field",  # the library argument it feeds (warp_files)
        help="displacement field written by 'hyperreg register --warp' (the whole chain) or "
        "--field-out (with --affine); voxel or itk format, detected from the file",
    )
    warp.add_argument(
        "--affine",
        metavar="FILE",
        help="ITK affine transform file (hyperreg --affine-out, ANTs *GenericAffine.mat, "
        "SimpleITK), fixed point -> moving point; applied before --warp",
    )
    warp.add_argument(
        "--fixed",
        help="output grid when there is no --warp (required then); with --warp it must be the "
        "field's grid",
    )
    warp.add_argument(
        "--nearest",
        action="store_true",
        help="every --moving is a label map: integer ids, nearest neighbour, integer output",
    )
    warp.add_argument(
        "--labels",
        nargs="+",
        default=[],
        metavar="FILE",
        help="those of the --moving files that are label maps (nearest neighbour); the others "
        "are images (linear)",
    )
    warp.add_argument(
        "--fill",
        type=opts.fill_value,
        default="zero",
        help="value of images outside the moving file: zero (default, as ITK and ANTs), edge "
        "(the nearest edge voxel), min (the image minimum, e.g. -1024 for CT) or a number in "
        "the image's units; label maps always take 0 (the background)",
    )
    opts.add_resample_argument(warp)
    opts.add_npz_geometry_argument(warp, "field's (or --fixed) grid")
    opts.add_nonfinite_argument(warp)
    opts.add_common(warp, device=False)


def _add_jacobian(sub: Any) -> None:
    jac = sub.add_parser(
        "jacobian", help="Jacobian determinant map and folding of a saved displacement field"
    )
    jac.add_argument(
        "--warp",
        dest="warp_field",  # the library argument it feeds (jacobian_file)
        required=True,
        help="displacement field (voxel or itk format, detected)",
    )
    jac.add_argument(
        "--out",
        required=True,
        help="Jacobian determinant of x + u(x), NIfTI float32, dimensionless, on the field's "
        "(fixed) grid with its affine",
    )
    opts.add_common(jac, device=False)


def _cmd_register(args: argparse.Namespace) -> int:
    from hyperreg.apps.outputs import OutputSpec

    outputs = OutputSpec.from_args(args)  # every output option, by its dest
    folders = new_folders(*outputs.given(), args.figure)
    if not (outputs.given() or args.figure):
        raise ValueError("nothing to write: give --moved, --warp and/or --moved-seg")
    if args.moved_seg and not args.moving_seg:
        raise ValueError("--moved-seg needs --moving-seg (the label map to warp)")
    if args.moving_seg and not (args.moved_seg or args.fixed_seg):
        raise ValueError("--moving-seg is used only with --moved-seg or --fixed-seg; add one")
    if args.fixed_seg and not args.moving_seg:
        raise ValueError("--fixed-seg needs --moving-seg (Dice compares the two label maps)")
    inputs = (args.moving, args.fixed, args.moving_seg, args.fixed_seg)
    outputs.check("register", inputs)  # said before any model is read
    tuned_lambda(args)  # --lambda tune.json: its λ*, said with its source
    model = model_for(args)
    with verdict_last():  # the pair's verdict after the lines on the stages that led to it
        _register_and_report(args, model, folders, outputs)
    return 0


def _register_and_report(
    args: argparse.Namespace, model: Any, folders: list[Path], outputs: Any
) -> None:
    from hyperreg.apps.register import register_files

    result = register_files(
        model,
        args.moving,
        args.fixed,
        args.lam,
        outputs=outputs,
        refine=opts.refinement_from(args, model_default=True),
        init=args.init,
        initial_affine=args.initial_affine,
        npz_geometry=args.npz_geometry,
        figure=args.figure,
        passes=args.passes,
        never_worse=not args.keep_worse,
        contrast=opts.contrast_from(args),
        fixed_mask=args.fixed_mask,
        moving_mask=args.moving_mask,
        **pair_options(args, check_labels=False),  # register_files checks them as it reads
    )
    _report(args, model, result, folders, outputs.given())


def _report(
    args: argparse.Namespace, model: Any, result: Any, folders: list[Path], written: list[Any]
) -> None:
    """What ``register`` says once the pair is written, in the order the stages ran: a few lines
    (what ran, λ and its source, where the outputs went, Dice, folding); ``-v`` says each
    stage's details."""
    if result.affine is not None:  # in the order they ran: affine stage, λ (auto: after it)
        print(affine_text(args.init, result.affine))
    for message in result.resampled:  # the routine notes (the model's grid, one sampling): -v
        if args.verbose or message.startswith("resampled"):
            print(f"{opts.PROG} register: {message}")
    passes = result.settings.passes  # as resolved once for the run (resolve_settings)
    if args.inverse_warp_out and not args.passes and model.config.passes > 1:
        print(
            f"{opts.PROG} register: note: with --inverse-warp the network runs one pass (the "
            f"model's default is {model.config.passes}): the field and its inverse are those of "
            "one pass; --passes 1 says so and silences this note"
        )
    if args.verbose:
        _report_stages(args, model, result, passes)
    else:
        print(_stages_line(args, model, result, passes))
    written = [*written, *([args.figure] if args.figure else [])]
    created_folders(folders)
    print(f"λ = {result.lam:g}: wrote {', '.join(written)}")
    if result.dice is not None:
        alone = result.dice_affine
        alone = "" if alone is None else f", {args.init} alone: {alone:.4f}"
        print(
            f"mean Dice {result.mean_dice:.4f} over {len(result.dice)} labels of the input label "
            f"maps (before registration: {result.dice_before:.4f}{alone})"
        )
        if (line := one_map_labels_text(result.dice, result.shared_labels)) is not None:
            print(line)
    _print_field_summary(result.folding_fraction, result.log_jacobian_std)


def _stages_line(args: argparse.Namespace, model: Any, result: Any, passes: int) -> str:
    """One line: λ and where it came from, the network's passes and flips, the refinement."""
    reason = result.lam_reason.split(" (", 1)[0].split(": ", 1)[0]
    if reason == "auto":  # --lambda auto says why it chose this λ, as the README promises
        reason = result.lam_reason
    elif reason == "given" and getattr(args, "lam_source", None):  # --lambda tune.json
        reason = args.lam_source.split(": ", 1)[0]
    raised, _, to = result.lam_reason.rpartition(", raised to ")
    if raised and not reason.endswith(to):  # a model's default λ raised for other contrasts
        reason = f"{reason}, raised to {to}"
    parts = [f"λ = {result.lam:.4g} ({reason})"]
    network = f"{passes} network pass{'es' if passes > 1 else ''}"
    if result.settings.flips:
        network += " with left-right flip averaging"
    parts.append(network)
    stats = result.refinement
    if stats is not None and stats.steps:
        source = "" if args.refine is not None else " (the model's default; --refine 0: off)"
        parts.append(f"{stats.steps} refinement steps in {stats.seconds:.1f} s{source}")
    return "; ".join(parts) + " (-v: details)"


def _report_stages(args: argparse.Namespace, model: Any, result: Any, passes: int) -> None:
    """``-v``: λ and its source, the passes, flip averaging and the refinement, a line each."""
    if result.lam_reason != "given":
        print(f"λ = {result.lam:.4g}: {result.lam_reason}")
    if passes > 1:
        source = "" if args.passes else " (the model's default; --passes 1: one)"
        print(f"{passes} network passes, each registering the last one's moved image{source}")
    if result.settings.flips:
        source = "" if args.flip_average else " (the model's default; --no-flip-average: off)"
        print(f"the network's velocity averaged with the pair mirrored left-right{source}")
    if refine_text(result.refinement):
        print(_default_refine_note(args, model) + refine_text(result.refinement))
    print(result.settings.text())


def _default_refine_note(args: argparse.Namespace, model: Any) -> str:
    """Why a pair was refined without --refine (a line of its own, or ''): the model's default,
    and how to turn it off."""
    if args.refine is not None:
        return ""
    from hyperreg.apps.models import model_default_refine

    return f"{model_default_refine(model).source}; --refine 0: the network alone\n"


def _print_field_summary(folding_fraction: float, log_jacobian_std: float) -> None:
    print(f"{folding_text(100 * folding_fraction)}, std log J {log_jacobian_std:.4f}")


def _cmd_warp(args: argparse.Namespace) -> int:
    folders = new_folders(*args.moved)
    from hyperreg.apps.transforms import warp_files

    if not (args.warp_field or args.affine):
        raise ValueError("nothing to apply: give --warp and/or --affine")
    unknown = [p for p in args.labels if p not in args.moving]
    if unknown:
        raise ValueError(f"--labels names files that are not among --moving: {', '.join(unknown)}")
    labels = [args.nearest or path in args.labels for path in args.moving]
    written = warp_files(
        args.moving,
        args.moved,
        warp_field=args.warp_field,
        affine=args.affine,
        fixed=args.fixed,
        nearest=labels,
        resample=args.resample,
        npz_geometry=args.npz_geometry,
        fill=args.fill,
        replace_nonfinite=args.replace_nonfinite,
    )
    created_folders(folders)
    for out in written:
        kind = "label map (nearest neighbour)" if out.label else "image (linear)"
        print(f"wrote {out.moved}: {kind}, shape {out.shape}")
    return 0


def _cmd_jacobian(args: argparse.Namespace) -> int:
    folders = new_folders(args.out)
    from hyperreg.apps.fields import jacobian_file

    result = jacobian_file(args.warp_field, args.out)
    created_folders(folders)
    print(f"wrote {args.out}: Jacobian determinant, shape {result.jacobian.shape}")
    _print_field_summary(result.folding_fraction, result.log_jacobian_std)
    return 0


def _cmd_affine(args: argparse.Namespace) -> int:
    from hyperreg.apps.transforms import affine_files
    from hyperreg.cli.inputs import check_label_maps, created_folders, new_folders

    if not (args.moved or args.affine_out or args.moved_seg or args.fixed_seg):
        raise ValueError("nothing to write: give --moved, --affine-out and/or --moved-seg")
    if args.moved_seg and not args.moving_seg:
        raise ValueError("--moved-seg needs --moving-seg (the label map to warp)")
    if args.fixed_seg and not args.moving_seg:
        raise ValueError("--fixed-seg needs --moving-seg (Dice compares the two label maps)")
    check_label_maps(moving_seg=args.moving_seg, fixed_seg=args.fixed_seg)
    folders = new_folders(args.moved, args.affine_out, args.moved_seg)
    result = affine_files(
        args.moving,
        args.fixed,
        init=args.init,
        initial_affine=args.initial_affine,
        moved=args.moved,
        affine_out=args.affine_out,
        moving_seg=args.moving_seg,
        fixed_seg=args.fixed_seg,
        moved_seg=args.moved_seg,
        seed=args.seed,
        npz_geometry=args.npz_geometry,
        bias_correct=args.bias_correct,
        replace_nonfinite=args.replace_nonfinite,
        fixed_mask=args.fixed_mask,
        moving_mask=args.moving_mask,
    )
    from hyperreg.registration.pipeline import AffineStage

    t = result.transform
    if t.kind == "none":
        print(f"{args.init}: {t.seconds:.1f} s, {mi_text(t.metric_before, t.metric_after)}")
    else:
        print(affine_text(args.init, AffineStage.of(t)).replace(" stage", "", 1))
    written = [p for p in (args.moved, args.affine_out, args.moved_seg) if p]
    created_folders(folders)
    if written:
        print(f"wrote {', '.join(written)}")
    if result.dice is not None:
        print(
            f"mean Dice {result.mean_dice:.4f} over {len(result.dice)} labels of the input label "
            f"maps (before registration: {result.dice_before:.4f})"
        )
        if (line := one_map_labels_text(result.dice, result.shared_labels)) is not None:
            print(line)
    return 0


COMMANDS = {
    "register": _cmd_register,
    "affine": _cmd_affine,
    "warp": _cmd_warp,
    "jacobian": _cmd_jacobian,
}
