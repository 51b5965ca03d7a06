"""Command line: ``hyperreg {train, register, warp, jacobian, demo, sweep, tune, batch}``.

Each subcommand parses its flags, builds a config and calls one library function. torch and
nibabel are imported inside the subcommands, so ``hyperreg --help`` is fast. Library errors
become one line on stderr (``hyperreg <cmd>: error: …``) and exit code 2 (bad input) or 1
(runtime failure); ``--debug`` re-raises them with the traceback.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import warnings
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

PROG = "hyperreg"
DEVICE_HELP = "auto (CUDA if available), cpu, cuda or cuda:N (default: auto)"


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line: ``hyperreg <cmd>: error: …``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _lambda(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"λ must be a number in [0, 1], got {text!r}") from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"λ must lie in [0, 1], got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def build_parser() -> argparse.ArgumentParser:
    """The ``hyperreg`` argument parser with its subcommands."""
    parser = _Parser(
        prog=PROG,
        description="HyperMorph deformable registration of brain MRI at any λ (regularisation "
        "weight) chosen at test time.",
    )
    from hyperreg import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train a HyperMorph model")
    train.add_argument(
        "--data",
        required=True,
        help="neurite-oasis folder, folder of NIfTI/MGZ/npz scans, or CSV list "
        "(column 'image', optional 'seg')",
    )
    train.add_argument(
        "--ndim",
        type=int,
        choices=(2, 3),
        default=2,
        help="2: train on slices (coronal slices cut from 3D volumes); 3: volumes",
    )
    train.add_argument(
        "--steps", type=_positive_int, default=1500, help="optimiser steps (default 1500)"
    )
    train.add_argument(
        "--out",
        help="output folder: model.pt, checkpoint_*.pt, train_log.csv, config.json (and "
        "val_log.csv, best.pt, split.json with validation); default: the --resume folder",
    )
    train.add_argument(
        "--resume",
        metavar="DIR",
        help="continue exactly from the newest checkpoint_*.pt in DIR (model, optimiser, step, "
        "random states); --steps is the total, not the number of further steps",
    )
    train.add_argument(
        "--sim",
        choices=("ncc", "mse"),
        default="ncc",
        help="similarity: local NCC (window 9) or MSE scaled by 1/σ² (default ncc)",
    )
    train.add_argument(
        "--parametrization",
        choices=("mip", "default"),
        default="mip",
        help="hypernetwork parametrisation (default mip)",
    )
    train.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    train.add_argument(
        "--batch-size",
        type=_positive_int,
        default=4,
        help="pairs per step per process (default 4); under torchrun the global batch is "
        "nproc × batch size",
    )
    train.add_argument("--atlas", default="", help="atlas image: fixed image of every pair")
    train.add_argument("--atlas-seg", default="", help="atlas label map, for validation Dice")
    train.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=500,
        help="steps between checkpoints (default 500)",
    )
    train.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        help="newest checkpoint_*.pt files kept (default 3; 0 keeps all)",
    )
    train.add_argument(
        "--val-every",
        type=int,
        default=0,
        help="steps between validations (Dice, folding at --val-lambdas; val_log.csv, best.pt); "
        "default 0: at each checkpoint when subjects are held out (3 or more subjects), else "
        "off; with 2 subjects a positive value holds out every 10th brain slice instead",
    )
    train.add_argument(
        "--val-lambdas",
        type=_lambda,
        nargs="+",
        default=[0.1, 0.5, 0.9],
        help="λ values evaluated in validation (default 0.1 0.5 0.9)",
    )
    train.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="share of subjects held out for validation, split from --seed (default 0.1)",
    )
    train.add_argument(
        "--test-fraction",
        type=float,
        default=0.1,
        help="share of subjects held out for testing, never trained on (default 0.1)",
    )
    train.add_argument(
        "--amp", action="store_true", help="bf16 autocast on CUDA (losses stay in float32)"
    )
    train.add_argument("--compile", action="store_true", help="torch.compile the model")
    train.add_argument(
        "--crop",
        type=_positive_int,
        nargs="+",
        default=[],
        metavar="N",
        help="random crop of each training pair, one size per axis (e.g. 128 160 192)",
    )
    train.add_argument(
        "--int-steps",
        type=int,
        default=7,
        help="scaling-and-squaring steps; 0 predicts displacements (default 7)",
    )
    train.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    _add_common(train)

    reg = sub.add_parser("register", help="register a moving image to a fixed image at one λ")
    reg.add_argument("--model", required=True, help="checkpoint (.pt) written by 'hyperreg train'")
    reg.add_argument("--moving", required=True, help="moving image (NIfTI, MGZ or npz)")
    reg.add_argument(
        "--fixed",
        required=True,
        help="fixed image; every output is on its grid with its affine (a moving image on "
        "another grid is resampled onto it first, see --no-resample)",
    )
    reg.add_argument(
        "--lambda",
        dest="lam",
        type=_lambda,
        required=True,
        help="regularisation weight λ in [0, 1]: 0 = similarity only (sharpest match, least "
        "smooth field), 1 = smoothness only (identity)",
    )
    reg.add_argument(
        "--moved",
        help="moved image, NIfTI, on the fixed grid with the fixed-image affine, in the moving "
        "image's own intensity units (float32)",
    )
    reg.add_argument(
        "--warp",
        help="displacement field (voxels), NIfTI (I,J,K,3) channel last, i/j/k "
        "order, fixed-image affine; moved[x] = moving(x + u(x)); see --warp-format",
    )
    reg.add_argument(
        "--warp-format",
        choices=("voxel", "itk"),
        default="voxel",
        help="format of --warp: voxel (default, as above) or itk: world mm in LPS, vector "
        "intent, shape (I,J,K,1,3) (2D: (I,J,1,1,2)), fixed-image affine, applied directly by "
        "ANTs antsApplyTransforms and SimpleITK DisplacementFieldTransform",
    )
    reg.add_argument(
        "--no-resample",
        dest="resample",
        action="store_false",
        help="do not resample a moving image (or label map) on another grid onto the fixed "
        "grid; differing grids are then an error",
    )
    reg.add_argument(
        "--moving-seg",
        help="moving label map, warped with nearest neighbour (for --moved-seg and Dice)",
    )
    reg.add_argument("--moved-seg", help="moved label map, NIfTI, integer type, fixed affine")
    reg.add_argument(
        "--fixed-seg",
        help="fixed label map: with --moving-seg, mean Dice (before and after) is printed over "
        "the labels present in both maps",
    )
    reg.add_argument(
        "--normalization",
        choices=("minmax", "none"),
        default="minmax",
        help="intensity normalisation of both images (default minmax to [0, 1])",
    )
    _add_common(reg)

    warp = sub.add_parser(
        "warp", help="apply a saved displacement field to another image or label map"
    )
    warp.add_argument(
        "--moving",
        required=True,
        help="image or label map to warp (NIfTI, MGZ or npz); on another grid than the field "
        "it is resampled onto the field's grid first",
    )
    warp.add_argument(
        "--warp",
        required=True,
        help="displacement field written by 'hyperreg register --warp' (voxel or itk format, "
        "detected from the file)",
    )
    warp.add_argument(
        "--moved",
        required=True,
        help="warped output, NIfTI, on the field's (fixed) grid with its affine; float32, or "
        "an unscaled integer type with --nearest",
    )
    warp.add_argument(
        "--nearest",
        action="store_true",
        help="label map: round to integer ids, nearest-neighbour interpolation, integer output",
    )
    warp.add_argument(
        "--no-resample",
        dest="resample",
        action="store_false",
        help="do not resample a moving file on another grid; differing grids are an error",
    )
    warp.add_argument("--debug", action="store_true", help="show tracebacks on errors")

    jac = sub.add_parser(
        "jacobian", help="Jacobian determinant map and folding of a saved displacement field"
    )
    jac.add_argument(
        "--warp", required=True, help="displacement field (voxel or itk format, detected)"
    )
    jac.add_argument(
        "--out",
        required=True,
        help="Jacobian determinant of x + u(x), NIfTI float32, dimensionless, on the field's "
        "(fixed) grid with its affine",
    )
    jac.add_argument("--debug", action="store_true", help="show tracebacks on errors")

    demo = sub.add_parser("demo", help="train and register on built-in data, write a report")
    demo.add_argument(
        "--out", default="hyperreg-demo", help="output folder (default hyperreg-demo)"
    )
    demo.add_argument("--data", help="neurite-oasis folder: use real subject pairs instead")
    demo.add_argument(
        "--steps",
        type=_positive_int,
        default=600,
        help="training steps (default 600, a few minutes on a CPU)",
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    _add_common(demo)

    from hyperreg.cli.lambda_commands import add_parsers

    add_parsers(sub)  # sweep, tune, batch
    return parser


def _cmd_train(args: argparse.Namespace) -> int:
    from hyperreg.config import ModelConfig, TrainConfig
    from hyperreg.training.train import train

    if not args.out and not args.resume:
        raise ValueError("--out is required (or --resume DIR, which then is the output folder)")
    config = TrainConfig(
        data=args.data,
        out=args.out or args.resume,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        sim=args.sim,
        atlas=args.atlas,
        atlas_seg=args.atlas_seg,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        val_every=args.val_every,
        val_lambdas=tuple(args.val_lambdas),
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        amp=args.amp,
        compile=args.compile,
        crop=tuple(args.crop),
        seed=args.seed,
        device=args.device,
        model=ModelConfig(
            ndim=args.ndim, parametrization=args.parametrization, int_steps=args.int_steps
        ),
    )
    path = train(config, resume=args.resume)
    print(f"model written to {path}")
    return 0


def _cmd_register(args: argparse.Namespace) -> int:
    from hyperreg._checks import resolve_device
    from hyperreg.apps.inference import register_files
    from hyperreg.method.model import load_checkpoint

    if not (args.moved or args.warp or args.moved_seg):
        raise ValueError("nothing to write: give --moved, --warp and/or --moved-seg")
    if args.moved_seg and not args.moving_seg:
        raise ValueError("--moved-seg needs --moving-seg (the label map to warp)")
    if args.moving_seg and not (args.moved_seg or args.fixed_seg):
        raise ValueError("--moving-seg is used only with --moved-seg or --fixed-seg; add one")
    if args.fixed_seg and not args.moving_seg:
        raise ValueError("--fixed-seg needs --moving-seg (Dice compares the two label maps)")
    device = resolve_device("register", args.device)
    model, _ = load_checkpoint(args.model, map_location=device)
    result = register_files(
        model,
        args.moving,
        args.fixed,
        args.lam,
        moved=args.moved,
        warp_out=args.warp,
        moving_seg=args.moving_seg,
        fixed_seg=args.fixed_seg,
        moved_seg=args.moved_seg,
        normalization=args.normalization,
        resample=args.resample,
        warp_format=args.warp_format,
    )
    for message in result.resampled:
        print(f"{PROG} register: {message}")
    written = [p for p in (args.moved, args.warp, args.moved_seg) if p]
    print(f"λ = {result.lam:g}: wrote {', '.join(written)}")
    if result.dice is not None:
        print(
            f"mean Dice {result.mean_dice:.4f} over {len(result.dice)} labels present in both "
            f"label maps (before registration: {result.extra['dice_before']:.4f})"
        )
    _print_field_summary(result.folding_fraction, result.log_jacobian_std)
    return 0


def _print_field_summary(folding_fraction: float, log_jacobian_std: float) -> None:
    print(
        f"folding fraction {100 * folding_fraction:.3f} % of voxels (J <= 0), "
        f"std log J {log_jacobian_std:.4f}"
    )


def _cmd_warp(args: argparse.Namespace) -> int:
    from hyperreg.apps.inference import warp_file

    result = warp_file(
        args.moving, args.warp, args.moved, nearest=args.nearest, resample=args.resample
    )
    if result.resampled:
        print(f"{PROG} warp: {result.resampled}")
    kind = "label map (nearest neighbour)" if args.nearest else "image (linear)"
    print(f"wrote {args.moved}: {kind}, shape {result.grid.spatial_shape}")
    return 0


def _cmd_jacobian(args: argparse.Namespace) -> int:
    from hyperreg.apps.inference import jacobian_file

    result = jacobian_file(args.warp, args.out)
    print(f"wrote {args.out}: Jacobian determinant, shape {result.jacobian.shape}")
    _print_field_summary(result.folding_fraction, result.log_jacobian_std)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from hyperreg.apps.demo import run_demo

    report = run_demo(
        args.out, data=args.data, steps=args.steps, seed=args.seed, device=args.device
    )
    print(report)
    return 0


def _cmd_lambda(args: argparse.Namespace) -> int:
    from hyperreg.cli.lambda_commands import COMMANDS as LAMBDA_COMMANDS

    return LAMBDA_COMMANDS[args.command](args)


COMMANDS = {
    "train": _cmd_train,
    "register": _cmd_register,
    "warp": _cmd_warp,
    "jacobian": _cmd_jacobian,
    "demo": _cmd_demo,
    "sweep": _cmd_lambda,
    "tune": _cmd_lambda,
    "batch": _cmd_lambda,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hyperreg`` command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    prog = f"{PROG} {args.command}"
    logging.basicConfig(level=logging.INFO, format=f"{prog}: %(message)s")

    def show_warning(message, category, filename, lineno, file=None, line=None):
        print(f"{prog}: warning: {message}", file=sys.stderr)

    warnings.showwarning = show_warning
    try:
        return COMMANDS[args.command](args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        if args.debug:
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as err:
        if args.debug:
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
