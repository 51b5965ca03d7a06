"""Argument helpers shared by every ``hyperreg`` subcommand: the parser class, the help texts
and the argument groups several subcommands take (defined once, so their help texts are
identical).

The value types (``type=`` callables such as :func:`positive_int` and :func:`lambda_value`) live
in :mod:`hyperreg.cli.arg_types` and are re-exported here. Must not import the library at module
level (``hyperreg --help`` stays fast).
"""

from __future__ import annotations

import argparse
from typing import Any

from hyperreg.cli.arg_types import (
    fill_value,
    finite_number,
    fraction,
    lambda_list,
    lambda_request,
    lambda_value,
    non_negative_int,
    pass_count,
    percent,
    positive_int,
    refine_steps,
)
from hyperreg.method.similarities import REFINE_SIMILARITIES  # the registry, no torch
from hyperreg.registration.autolambda import AUTO_GAIN, AUTO_MAX_FOLDING  # constants only: fast
from hyperreg.registration.verdict import MIN_GAINS  # numpy only

__all__ = [
    "AUTO_HELP",
    "DEVICE_HELP",
    "INIT_HELP",
    "LAMBDA_HELP",
    "PROG",
    "Parser",
    "add_affine_out_argument",
    "add_batching_arguments",
    "add_bias_correct_argument",
    "add_common",
    "add_contrast_argument",
    "add_flip_argument",
    "add_init_argument",
    "add_input_arguments",
    "add_label_arguments",
    "add_lambda_grid_argument",
    "add_mask_arguments",
    "add_model_argument",
    "add_nonfinite_argument",
    "add_normalization_argument",
    "add_npz_geometry_argument",
    "add_out_argument",
    "add_pair_arguments",
    "add_pairs_csv_argument",
    "add_passes_argument",
    "add_preprocessing_arguments",
    "add_refine_arguments",
    "add_resample_argument",
    "add_warp_format_argument",
    "contrast_from",
    "fill_value",
    "fraction",
    "lambda_list",
    "lambda_request",
    "lambda_value",
    "non_negative_int",
    "pass_count",
    "percent",
    "positive_int",
    "refine_steps",
    "refinement_from",
    "subparser",
]

PROG = "hyperreg"
DEVICE_HELP = "auto (CUDA if available), cpu, cuda or cuda:N (default: auto)"


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line: ``hyperreg <cmd>: error: …``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``command`` of ``parser`` (argparse has no public accessor)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise ValueError(f"subparser(): no subcommands in {parser.prog!r}")


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` (``--moving``, ``-h``, …)."""
    return [option for action in parser._actions for option in action.option_strings]


AUTO_HELP = (
    "'auto': chosen per pair without labels (one batched sweep over a grid, then the smoothest "
    f"λ keeping {100 * AUTO_GAIN:g} %% of the similarity gain with folding at most "
    f"{100 * AUTO_MAX_FOLDING:g} %%; the reason is printed)"
)
LAMBDA_HELP = (
    "regularisation weight λ in [0, 1] (0 = similarity only, sharpest match, least smooth "
    "field; 1 = smoothness only: the smoothest field, which a uniform shift does not "
    f"violate, so not necessarily the identity), {AUTO_HELP}, or a tune.json that 'hyperreg "
    "tune' wrote (its λ*; the source is printed)"
)


def add_common(parser: argparse.ArgumentParser, *, device: bool = True, seed: bool = False) -> None:
    """``--debug``, which every subcommand takes; ``--device`` and ``--seed`` where asked."""
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    if device:
        parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


# --- argument groups shared by register, sweep, tune and batch --------------------------------


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model``: a checkpoint, a run folder or a bundled name; default a bundled model."""
    parser.add_argument(
        "--model",
        help="checkpoint (.pt) written by 'hyperreg train', its output folder (model.pt in it), "
        "or a bundled model's name (hypermorph-2d, hypermorph-3d; 'hyperreg models' lists "
        "them); default: the bundled model for the images' dimensionality",
    )


def add_pair_arguments(parser: argparse.ArgumentParser, *, resample_flag: bool = True) -> None:
    """``--moving`` and ``--fixed`` (``resample_flag``: the command has ``--no-resample``)."""
    parser.add_argument("--moving", required=True, help="moving image (NIfTI, MGZ or npz)")
    parser.add_argument(
        "--fixed",
        required=True,
        help="fixed image; every output is on its grid with its affine (a moving image on "
        "another grid is resampled onto it first"
        + (", see --no-resample)" if resample_flag else ")"),
    )


def add_label_arguments(parser: argparse.ArgumentParser) -> None:
    """``--moving-seg`` and ``--fixed-seg`` (label maps of integer ids, for Dice)."""
    parser.add_argument(
        "--moving-seg",
        help="moving label map (integer ids, not intensities), warped with nearest neighbour",
    )
    parser.add_argument(
        "--fixed-seg",
        help="fixed label map (integer ids): with --moving-seg, mean Dice over the labels of "
        "either input map, background excluded (a label missing after warping counts 0)",
    )


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--moving``, ``--fixed``, ``--moving-seg`` and ``--fixed-seg``."""
    add_model_argument(parser)
    add_pair_arguments(parser)
    add_label_arguments(parser)


def add_out_argument(parser: argparse.ArgumentParser, contents: str) -> None:
    """``--out``: the output folder (created if missing) and what it receives."""
    parser.add_argument(
        "--out", required=True, help=f"output folder (created if missing): {contents}"
    )


def add_pairs_csv_argument(parser: argparse.ArgumentParser, columns: str) -> None:
    """``--pairs``: a pair CSV with ``columns``, paths relative to the CSV."""
    parser.add_argument(
        "--pairs",
        required=True,
        help=f"CSV with columns {columns} (paths relative to the CSV; label maps of integer ids)",
    )


def add_preprocessing_arguments(
    parser: argparse.ArgumentParser, then: str = "then an error"
) -> None:
    """``--no-resample`` (see :func:`add_resample_argument`), ``--normalization`` and
    ``--bias-correct`` and ``--replace-nonfinite`` (:func:`add_nonfinite_argument`)."""
    add_resample_argument(parser, then)
    add_normalization_argument(parser)
    add_bias_correct_argument(parser)
    add_nonfinite_argument(parser)


def add_bias_correct_argument(parser: argparse.ArgumentParser) -> None:
    """``--bias-correct``: N4 bias-field correction of the images the registration sees."""
    parser.add_argument(
        "--bias-correct",
        action="store_true",
        help="remove each image's smooth intensity bias (N4, SimpleITK, fitted on a 4x "
        "shrunk copy inside an Otsu head mask) before the affine stage and the network; the "
        "outputs are still sampled from the files as read. Costs seconds per image",
    )


def add_mask_arguments(parser: argparse.ArgumentParser) -> None:
    """``--fixed-mask`` and ``--moving-mask`` (``dest`` ``fixed_mask``/``moving_mask``): cost
    masks, :func:`hyperreg.registration.masks.load_mask`."""
    for role in ("fixed", "moving"):
        parser.add_argument(
            f"--{role}-mask",
            metavar="FILE",
            help=f"cost mask of the {role} image (NIfTI/MGZ of 0 and 1, as ANTs' -x): the "
            "affine stage's and refinement's similarity count only voxels at 1, e.g. a lesion "
            "or resection cavity at 0; the network sees a hole enclosed by the mask filled "
            "from the tissue around it, and the rest at 0 as background. Another grid than "
            "the image's is resampled through the headers (nearest)",
        )


def add_nonfinite_argument(parser: argparse.ArgumentParser) -> None:
    """``--replace-nonfinite VALUE`` (``dest="replace_nonfinite"``, the library argument of
    :func:`hyperreg.geometry.io.load_volume`): NaN/inf voxels of the images take VALUE."""
    parser.add_argument(
        "--replace-nonfinite",
        type=finite_number,
        metavar="VALUE",
        help="replace NaN and inf voxels of the images (not label maps) by VALUE, e.g. 0 or the "
        "background's intensity; their count is said on stderr. Default: such an image is an "
        "error naming the file",
    )


def add_resample_argument(parser: argparse.ArgumentParser, then: str = "then an error") -> None:
    """``--no-resample`` (``dest="resample"``); ``then`` says what differing grids become."""
    parser.add_argument(
        "--no-resample",
        dest="resample",
        action="store_false",
        help=f"do not resample inputs on another grid onto the fixed (or field's) grid; "
        f"differing grids are {then}",
    )


def add_normalization_argument(parser: argparse.ArgumentParser) -> None:
    """``--normalization {robust,minmax,none}``: the choices and default of
    :data:`hyperreg.geometry.intensity.NORMALIZATIONS` (spelt out here: the parser module
    stays free of numpy; a test checks they agree)."""
    parser.add_argument(
        "--normalization",
        choices=("robust", "minmax", "none"),
        default="robust",
        help="intensity normalisation of both images, for the affine stage and the network: "
        "robust (default: voxels beyond 2.5 spreads of the 0.1-99.9th percentile range, e.g. "
        "metal, take the 99.9th percentile's value, then min-max to [0, 1]; an image without "
        "such voxels is scaled exactly as by minmax), minmax (the image minimum to 0, maximum "
        "to 1) or none (intensities already in [0, 1]). Outputs keep the moving image's own "
        "units",
    )


def add_npz_geometry_argument(parser: argparse.ArgumentParser, grid: str = "fixed image") -> None:
    """``--npz-geometry {fixed,identity}``: the geometry of header-less (npz) inputs."""
    parser.add_argument(
        "--npz-geometry",
        choices=("fixed", "identity"),
        help="geometry of npz inputs, which have no header (no voxel size, orientation or "
        f"position): fixed (the {grid}'s affine; shapes must agree) or identity (1 mm voxels, "
        "world = voxel index). Required when an input is npz; ignored for NIfTI/MGZ",
    )


def add_warp_format_argument(parser: argparse.ArgumentParser, output: str) -> None:
    """``--warp-format {voxel,itk}`` for the displacement field written as ``output``."""
    parser.add_argument(
        "--warp-format",
        choices=("voxel", "itk"),
        default="voxel",
        help=f"format of {output}: voxel (default: voxels, channel last, i/j/k order) or itk: "
        "world mm in LPS, vector intent, shape (I,J,K,1,3) (2D: (I,J,1,1,2)), applied directly "
        "by ANTs antsApplyTransforms and SimpleITK DisplacementFieldTransform (a 2D slice "
        "outside the world x-y plane, e.g. coronal: a one-slice 3D field their readers cannot "
        "read, with a warning); both with the fixed-image affine",
    )


def add_lambda_grid_argument(parser: argparse.ArgumentParser, what: str = "λ values") -> None:
    """``--lambdas``: a λ grid (:func:`lambda_list`), default ``0:1:11``."""
    parser.add_argument(
        "--lambdas",
        type=lambda_list,
        default="0:1:11",
        help=f"{what}: start:stop:count (inclusive, evenly spaced) or a comma list "
        "(default 0:1:11)",
    )


def add_batching_arguments(parser: argparse.ArgumentParser) -> None:
    """``--chunk`` and ``--amp``: how many λ one forward pass takes, and bfloat16 autocast."""
    parser.add_argument(
        "--chunk",
        type=positive_int,
        help="largest number of λ per batched forward pass (bounds memory; default: all at "
        "once on a GPU, one per pass on a CPU, where that is faster, the λ side by side on "
        "the threads); the network alone: with refinement (--refine N, or a model's default) "
        "each λ runs alone and --chunk is refused",
    )
    parser.add_argument(
        "--amp",
        action="store_true",
        help="bfloat16 autocast for the forward pass (CUDA only; metrics stay float32)",
    )


def add_refine_arguments(parser: argparse.ArgumentParser, model_default: bool = False) -> None:
    """``--refine N``, ``--refine-sim {ncc,mi}`` and ``--refine-lr``: test-time refinement.
    With ``model_default``, no ``--refine`` (None) means the model's default steps
    (:func:`hyperreg.apps.models.pair_refinement`), else none."""
    default = "default 0"
    if model_default:
        from hyperreg.pretrained import bundled_models  # index.json only: --help stays fast

        cards = ", ".join(f"{m.name} {m.default_refine}" for m in bundled_models())
        default = f"default: the model's own, from its card ({cards}; a trained model 0)"
    parser.add_argument(
        "--refine",
        type=refine_steps,
        default=None,
        metavar="N",
        help="refine the network's field for each pair with at most N Adam steps on the "
        f"model's own objective at the same λ (instance optimisation; 0 = off, the network "
        f"alone; {default}; about 10 ms a step for a 2D slice, 0.4-0.8 s for a 3D pair at 2 mm on "
        "2 CPU cores); prints time and similarity before/after",
    )
    parser.add_argument(
        "--refine-sim",
        choices=REFINE_SIMILARITIES,
        default=None,
        help="similarity for --refine: ncc (local NCC, window 9), mse, mi (mutual "
        "information) or mind (MIND-SSC self-similarity descriptors), the last two for pairs of "
        "different contrast, e.g. T1 to T2; default: the model's "
        "own (for other contrasts on the moving image drawn in the fixed image's intensities); "
        "given, it wins over --contrast auto",
    )
    parser.add_argument(
        "--refine-lr",
        type=float,
        default=None,
        metavar="LR",
        help="Adam learning rate for --refine, voxels per step (default: the library's, 0.15)",
    )


def add_passes_argument(parser: argparse.ArgumentParser) -> None:
    """``--passes N``: the network applied N times, each pass to the last one's moved image."""
    parser.add_argument(
        "--passes",
        type=pass_count,
        default=None,
        metavar="N",
        help="apply the network N times (1-4), each pass registering the previous pass's moved "
        "image to the fixed image, the fields composed (a recursive cascade with shared "
        "weights); --refine refines the last pass. Default: the model's own (its config's "
        "'passes', 1 unless it records more; see its card). Each pass costs one more forward "
        "pass (seconds for a 3D pair on a CPU)",
    )


def add_contrast_argument(parser: argparse.ArgumentParser) -> None:
    """``--contrast {auto,same,different}``: which similarity refines and judges a pair."""
    parser.add_argument(
        "--contrast",
        choices=("auto", "same", "different"),
        default="auto",
        help="do the images show the same contrast? auto (default): told from the pair after "
        "the affine stage (a T2 or FLAIR to a T1 is not); same: refine and judge with the "
        "model's own similarity (local NCC for the bundled models); different: the network "
        "and refinement see the moving image drawn in the fixed image's intensities, the "
        "verdict uses normalised gradient fields (a field that raises them less "
        f"than {100 * MIN_GAINS['ngf']:g} %% is not kept) and a default λ below 0.2 becomes "
        "0.2. An explicit "
        "--refine-sim wins over auto",
    )


def contrast_from(args: Any) -> str:
    """The ``contrast`` of ``args``: ``--contrast``, except that with ``auto`` an explicit
    ``--refine-sim`` decides (``mi`` or ``mind``: different; ``ncc`` or ``mse``: same)."""
    contrast = getattr(args, "contrast", "auto")
    sim = getattr(args, "refine_sim", None)
    if contrast == "auto" and sim is not None:
        return "different" if sim in ("mi", "mind") else "same"
    return contrast


def add_keep_worse_argument(parser: argparse.ArgumentParser) -> None:
    """``--keep-worse``: keep a registration that lowered the model's similarity."""
    parser.add_argument(
        "--keep-worse",
        action="store_true",
        help="keep a registration even when it lowered the model's own similarity (its "
        "objective's, e.g. local NCC, on the network grid) by more than 1 %% against the pair "
        "as it came or the affine alone; default: keep the better of those two instead, with "
        "a warning (the verdict says which)",
    )


def add_flip_argument(parser: argparse.ArgumentParser) -> None:
    """``--flip-average`` / ``--no-flip-average``: the model's test-time left-right flip
    averaging turned on or off (default: what the model records)."""
    parser.add_argument(
        "--flip-average",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="average the network's velocity with that of the pair mirrored left-right "
        "(test-time augmentation; twice the network's cost; needs a model that records its "
        "orientation, as the bundled 3D one). Default: the model's own (see its card); "
        "--no-flip-average: the network as given",
    )


INIT_HELP = (
    "affine stage before the deformable one, in world space (SimpleITK, Mattes mutual "
    "information, moments start, multi-resolution; works across contrasts): affine (default; "
    "rigid first, then 12 degrees of freedom, 6 in 2D), rigid, or none (the moving image is "
    "only resampled through the headers). A pair that is already aligned keeps the identity "
    "when the stage does not improve mutual information"
)


def add_init_argument(parser: argparse.ArgumentParser, initial: bool = True) -> None:
    """``--init {affine,rigid,none}``: the affine stage run once per pair (default affine);
    with ``initial``, ``--initial-affine FILE`` too."""
    parser.add_argument(
        "--init", choices=("affine", "rigid", "none"), default="affine", help=INIT_HELP
    )
    if initial:
        parser.add_argument(
            "--initial-affine",
            metavar="FILE",
            help="initial transform: an ITK .mat/.tfm (ANTs, SimpleITK, or an earlier "
            "--affine-out), fixed point -> moving point; the affine stage starts from it and "
            "refines it, or with --init none it is used as is (ANTs' "
            "--initial-moving-transform)",
        )


def add_affine_out_argument(parser: argparse.ArgumentParser) -> None:
    """``--affine-out``: the ITK transform file of the affine stage."""
    parser.add_argument(
        "--affine-out",
        metavar="FILE",
        help="affine of the --init stage as an ITK transform file (.mat binary, .tfm/.txt "
        "text): AffineTransform_double_3_3, LPS mm, fixed point -> moving point, as "
        "antsApplyTransforms -t and SimpleITK ReadTransform take it; a 2D registration of x-y "
        "plane slices is written as AffineTransform_double_2_2 (what ANTs applies to 2D "
        "images), any other 2D one as its 3D equivalent",
    )


def refinement_from(args: Any, model_default: bool = False) -> Any:
    """The :class:`~hyperreg.registration.refine.Refinement` of ``args``: None without
    ``--refine`` (the callee's default: with ``model_default`` the model's, as ``register``
    and ``batch`` run it, else none), 0 steps for ``--refine 0``. With ``model_default``,
    ``--refine-sim`` / ``--refine-lr`` without ``--refine`` give a
    :class:`~hyperreg.apps.models.DefaultSteps` (the model's steps, these settings).

    Raises:
        InputError (a ValueError): If ``--refine-lr`` is not in (0, 100); its ``argument`` is the
            ``dest`` of the option that fed the field of ``Refinement``.
        ValueError: If ``--refine-sim`` or ``--refine-lr`` is given without ``--refine``.
    """
    given_sim = getattr(args, "refine_sim", None) is not None
    settings = given_sim or getattr(args, "refine_lr", None)
    if getattr(args, "refine", None) is None and not settings:
        return None
    if args.refine is None and not model_default:
        option = "--refine-sim" if given_sim else "--refine-lr"
        raise ValueError(f"{option} needs --refine N (how many steps to refine with it)")
    from hyperreg._errors import passed_as
    from hyperreg.registration.refine import Refinement, check_refinement

    options = {} if args.refine_lr is None else {"lr": args.refine_lr}
    steps = 1 if args.refine is None else args.refine  # 1: checks the settings alone
    refinement = Refinement(steps=steps, sim=args.refine_sim, **options)
    with passed_as(steps="refine", sim="refine_sim", lr="refine_lr"):  # field -> dest
        check_refinement("refine", refinement)
    if args.refine is None:
        from hyperreg.apps.models import DefaultSteps

        return DefaultSteps(sim=args.refine_sim, lr=args.refine_lr)
    return refinement
