"""Command line for the affine stage alone: ``hyperreg affine``.

:func:`add_parsers` adds the subcommand to ``hyperreg``'s parser (:mod:`hyperreg.cli.run`);
:data:`COMMANDS` maps it to its function. The library is imported inside the function, so
``hyperreg --help`` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.messages import affine_text, mi_text

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``affine`` subparser to ``sub``."""
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
        "--moved",
        help="moved image, NIfTI, on the fixed grid with the fixed-image affine and header "
        "codes, in the moving image's own intensity units (float32; 0 outside it)",
    )
    opts.add_affine_out_argument(affine)
    affine.add_argument(
        "--moved-seg",
        help="moved label map (needs --moving-seg), nearest neighbour, NIfTI integer type",
    )
    opts.add_common(affine, device=False, seed=True)


def _cmd_affine(args: argparse.Namespace) -> int:
    from hyperreg.apps.native import affine_files
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
        moved=args.moved,
        affine_out=args.affine_out,
        moving_seg=args.moving_seg,
        fixed_seg=args.fixed_seg,
        moved_seg=args.moved_seg,
        seed=args.seed,
    )
    from hyperreg.registration.pipeline import AffineStage

    t = result.transform
    if t.kind == "none":
        print(f"{args.init}: {t.seconds:.1f} s, {mi_text(t.metric_before, t.metric_after)}")
    else:
        print(affine_text(args.init, AffineStage.of(t)).replace(" stage", "", 1))
    written = [p for p in (args.moved, args.affine_out, args.moved_seg) if p]
    if written:
        print(f"wrote {', '.join(written)}")
    created_folders(folders)
    if result.dice is not None:
        print(
            f"mean Dice {result.mean_dice:.4f} over {len(result.dice)} labels of the input label "
            f"maps (before registration: {result.dice_before:.4f})"
        )
    return 0


COMMANDS = {"affine": _cmd_affine}
