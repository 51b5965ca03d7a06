"""The ``hyperreg train`` parser and what its flags become: :func:`add_train_parser` adds the
subcommand with its flag groups (data, model and optimiser, objective, run, the trained model's
registration defaults); :func:`train_settings` turns the parsed flags into the run's TrainConfig
fields, on ``--resume`` taking every setting not given from the run's ``config.json``.

Must not import :mod:`hyperreg.cli.train_commands` (which imports this module) nor the library
at module level (``hyperreg --help`` stays fast).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.method.similarities import TRAIN_SIMILARITIES  # the registry, no torch

__all__ = ["add_train_parser", "train_settings"]


def add_train_parser(sub: Any) -> None:
    """Add the ``train`` subparser to ``sub`` and record its defaults for
    :func:`train_settings`."""
    train = sub.add_parser("train", help="train a HyperMorph model")
    _add_train_data(train)
    _add_train_model(train)
    _add_train_objective(train)
    _add_train_run(train)
    _add_train_defaults(train)
    # what a flag left alone holds: on --resume such settings come from the run's config.json
    _TRAIN_DEFAULTS.update({action.dest: action.default for action in train._actions})


_TRAIN_DEFAULTS: dict[str, Any] = {}

# flags that are TrainConfig fields of the same name (others are mapped in train_settings)
_CONFIG_FLAGS = (
    "steps",
    "batch_size",
    "sim",
    "atlas",
    "atlas_seg",
    "checkpoint_every",
    "keep_checkpoints",
    "val_every",
    "val_fraction",
    "test_fraction",
    "amp",
    "compile",
    "spacing",
    "synth",
    "seed",
    "device",
    "label_loss",
    "label_weight",
    "max_labels",
    "label_downsize",
    "conform",
    "mse_sigma",
    "lam_endpoint_fraction",
    "prefetch",
    "cascade_every",
)
_TUPLE_FLAGS = ("val_lambdas", "crop", "holdout", "shape", "synth_labels")


def _add_train_objective(train: argparse.ArgumentParser) -> None:
    """The anatomy-aware part of the objective and the 3D storage orientation."""
    group = train.add_argument_group("anatomy-aware objective (label maps)")
    group.add_argument(
        "--label-loss",
        choices=("none", "dice", "mse"),
        default=None,
        help="label overlap term where a pair has label maps on both sides (real pairs with "
        "labels, synthetic pairs): soft Dice over the pair's labels, or MSE of one-hot "
        "probabilities (SynthMorph); none = image similarity only (default: that of --init, "
        "else none). Loss = (1 − λ)·[similarity + weight·label term] + λ·smoothness; "
        "synthetic pairs use the label term alone",
    )
    group.add_argument(
        "--label-weight",
        type=float,
        default=None,
        help="weight of the label term (default: that of --init, else 1)",
    )
    group.add_argument(
        "--max-labels",
        type=opts.positive_int,
        default=None,
        help="labels per pair in the label term, a random subset when there are more "
        "(default: that of --init, else 24)",
    )
    group.add_argument(
        "--label-downsize",
        type=int,
        choices=(1, 2, 4),
        default=None,
        help="evaluate the label term on a grid this many times coarser (2: 8x cheaper in 3D; "
        "default: that of --init, else 1)",
    )
    group.add_argument(
        "--conform",
        action="store_true",
        help="3D: resample every scan to RAS storage order (recorded in the model, so any "
        "storage order registers alike) and place each person's foreground in the --shape "
        "grid (needs --shape): for people each scanned in their own position (on with an "
        "--init model that records an orientation, in its own grid)",
    )
    group.add_argument(
        "--cascade-every",
        type=opts.non_negative_int,
        default=0,
        metavar="K",
        help="every K-th step trains the network as the second of two passes: on its own "
        "moved image (no gradient through the first pass), the loss on the composed field, "
        "as 'register --passes 2' runs it (default 0: never)",
    )


def _default_lambda(text: str) -> float | str:
    """``--default-lambda``: a λ in [0, 1], ``keep`` or ``validation``."""
    if text in ("keep", "validation"):
        return text
    try:
        return opts.lambda_value(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be a λ in [0, 1], 'keep' or 'validation', got {text!r}"
        ) from None


def _add_train_defaults(train: argparse.ArgumentParser) -> None:
    """What the trained model registers with when 'register' is given nothing else."""
    group = train.add_argument_group("the trained model's registration defaults")
    group.add_argument(
        "--default-lambda",
        type=_default_lambda,
        default=None,
        metavar="LAM",
        help="λ the model registers at when none is asked for: a number, 'keep' (that of "
        "--init; the default with --init) or 'validation' (best validation Dice of the final "
        "weights over --val-lambdas; the default without --init, and the fallback 0.1 when "
        "the run does not validate)",
    )
    group.add_argument(
        "--default-refine",
        type=opts.refine_steps,
        default=None,
        metavar="N",
        help="test-time refinement steps the model runs when none are asked for (default: "
        "that of --init, e.g. 30 for hypermorph-3d; else 0)",
    )
    group.add_argument(
        "--passes",
        type=opts.pass_count,
        default=None,
        metavar="N",
        help="network passes the model runs when none are asked for, 1-4 (default: that of "
        "--init, else 1)",
    )
    group.add_argument(
        "--flip-average",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="test-time left-right flip averaging on or off by default (needs a 3D model with "
        "an orientation: --conform or an --init model with one; default: that of --init, "
        "else off)",
    )


def train_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's TrainConfig fields from the flags given (objective flags not given are None:
    the --init model's or the default, :func:`hyperreg.apps.training.train_model`); on
    --resume, every setting not given on the command line (a flag at its default counts as
    not given) is the run's own (config.json), so a resumed run checkpoints, validates and
    fine-tunes as it was started."""
    values = {name: getattr(args, name) for name in _CONFIG_FLAGS}
    values.update({name: tuple(getattr(args, name)) for name in _TUPLE_FLAGS})
    values.update(
        data=args.data[0] if len(args.data) == 1 else tuple(args.data),
        out=args.out or args.resume,
        lr=args.lr if args.lr is not None else 0.0,  # 0: config.DEFAULT_LR for the ndim
        init=args.init,
    )
    if not args.resume:
        values.pop("init")  # train_model resolves --init
    if args.resume and (Path(args.resume) / "config.json").is_file():
        stored = json.loads((Path(args.resume) / "config.json").read_text())
        stored.pop("model", None)  # the architecture comes from the checkpoint
        defaults = {**_TRAIN_DEFAULTS, "lr": None, "init": ""}
        for name in values:
            if name in ("data", "out"):  # --data is required; the output is the run folder
                continue
            if name in stored and getattr(args, name, None) == defaults.get(name):
                value = stored[name]
                values[name] = tuple(value) if isinstance(value, list) else value
    return values


def _add_train_data(train: argparse.ArgumentParser) -> None:
    """Where the scans come from, how they are split and gridded, and synthesis."""
    train.add_argument(
        "--data",
        required=True,
        nargs="+",
        action="extend",
        metavar="SOURCE",
        help="one or more sources (repeat the flag or list them): neurite-oasis folder, folder "
        "of NIfTI/MGZ/npz scans (one person each; label maps are the files named *seg*/*label*), "
        "folder of subject folders (one person each, e.g. T1 and T2), or CSV list (column "
        "'image', optional 'seg' and 'subject'). The split is by person; pairs are drawn "
        "within a source",
    )
    train.add_argument(
        "--holdout",
        type=lambda text: [name for name in text.split(",") if name],
        action="extend",
        default=[],
        metavar="PEOPLE",
        help="comma-separated person ids (subject folder names, e.g. "
        "OASIS-TRT-20-9,OASIS-TRT-20-10) held out of training for validation, instead of "
        "--val-fraction; --test-fraction still draws test people from the others",
    )
    train.add_argument(
        "--shape",
        type=opts.positive_int,
        nargs="+",
        default=[],
        metavar="N",
        help="training grid, one size per axis: every scan is centred in it by zero padding "
        "or central crop (no interpolation); default: that of --init, else the largest scan "
        "per axis when scans differ in size",
    )
    train.add_argument(
        "--spacing",
        type=float,
        default=0.0,
        metavar="MM",
        help="resample every scan (and label map) to isotropic voxels of MM mm first, keeping "
        "axis order and orientation (default 0: keep the scans' voxels)",
    )
    train.add_argument(
        "--synth",
        type=opts.fraction,
        default=0.0,
        metavar="FRACTION",
        help="share of training pairs synthesised from label maps (SynthMorph): 0 = real "
        "pairs only (default), 1 = synthetic only; label maps of the training people, plus "
        "--synth-labels",
    )
    train.add_argument(
        "--synth-labels",
        nargs="+",
        default=[],
        metavar="PATH",
        help="more label maps for --synth: label-map files, or sources (as --data) whose "
        "label maps are used; never validated on",
    )
    train.add_argument(
        "--init",
        metavar="MODEL",
        default="",
        help="start from the weights of a pretrained model and fine-tune: a .pt file, a run "
        "folder, or a bundled model's name ('hyperreg models', e.g. hypermorph-3d); its "
        "architecture is used (--ndim/--int-steps/--parametrization must match it), and what "
        "is not given here is kept from it: training grid, voxel size, orientation, objective "
        "with its label term, passes, flip averaging, default λ and refinement; the new "
        "model's steps count on from its",
    )
    train.add_argument(
        "--ndim",
        type=int,
        choices=(2, 3),
        default=None,
        help="2: train on slices (coronal slices cut from 3D volumes); 3: volumes (default 2, "
        "or that of --init)",
    )


def _add_train_model(train: argparse.ArgumentParser) -> None:
    """The model (new, fine-tuned or resumed), its loss and the optimiser."""
    train.add_argument(
        "--steps", type=opts.positive_int, default=1500, help="optimiser steps (default 1500)"
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
        "random states); --steps is the total, not the number of further steps; settings not "
        "given (or given at their default) are the run's own, from DIR/config.json",
    )
    train.add_argument(
        "--sim",
        choices=TRAIN_SIMILARITIES,
        default=None,
        help="similarity: local NCC (window 9) or MSE scaled by 1/σ² (default: that of --init, "
        "else ncc)",
    )
    train.add_argument(
        "--mse-sigma",
        type=float,
        default=None,
        metavar="SIGMA",
        help="σ of --sim mse: the loss is MSE / σ² on intensities in [0, 1] (default: that of "
        "--init, else 0.05, as voxelmorph's HyperMorph script)",
    )
    train.add_argument(
        "--lam-endpoint-fraction",
        type=opts.fraction,
        default=0.2,
        metavar="FRACTION",
        help="share of training samples with λ exactly 0 or 1 (the rest U(0, 1); default 0.2)",
    )
    train.add_argument(
        "--parametrization",
        choices=("mip", "default"),
        default=None,
        help="hypernetwork parametrisation (default mip, or that of --init)",
    )
    train.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Adam learning rate (default 1e-3 for 2D, 1e-4 for 3D: at 1e-3 a 3D run on brain "
        "volumes at 80 x 96 x 112, batch 1, diverged at step 1283; benchmarks/RESULTS_hypernet.md)",
    )
    train.add_argument(
        "--batch-size",
        type=opts.positive_int,
        default=4,
        help="pairs per step per process (default 4); under torchrun the global batch is "
        "nproc × batch size",
    )
    train.add_argument("--atlas", default="", help="atlas image: fixed image of every pair")
    train.add_argument("--atlas-seg", default="", help="atlas label map, for validation Dice")
    train.add_argument(
        "--checkpoint-every",
        type=opts.positive_int,
        default=500,
        help="steps between checkpoints (default 500)",
    )
    train.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        help="newest checkpoint_*.pt files kept (default 3; 0 keeps all)",
    )


def _add_train_run(train: argparse.ArgumentParser) -> None:
    """Checkpoints, validation, speed options and the common flags."""
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
        type=opts.lambda_value,
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
        "--no-prefetch",
        dest="prefetch",
        action="store_false",
        help="draw each batch in the step's own thread (default: the next batch is drawn in a "
        "worker thread while the step runs; the batches are the same either way)",
    )
    train.add_argument(
        "--crop",
        type=opts.positive_int,
        nargs="+",
        default=[],
        metavar="N",
        help="random crop of each training pair, one size per axis (e.g. 128 160 192)",
    )
    train.add_argument(
        "--int-steps",
        type=int,
        default=None,
        help="scaling-and-squaring steps; 0 predicts displacements (default 7, or that of --init)",
    )
    train.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no tqdm progress bar"
    )
    opts.add_common(train, seed=True)
