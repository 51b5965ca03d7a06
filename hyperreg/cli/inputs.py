"""Checks of command-line inputs that name the option, made before any work is done.

:func:`model_for` asks the library for the model ``--model`` names (a checkpoint, a run folder
or a bundled name; :func:`hyperreg.apps.models.resolve_model`); :func:`check_label_maps`
rejects an intensity image given as a label map; :func:`check_out_folder` rejects an ``--out``
folder that cannot be created. Each raises with a one-line message that names the option
(``run.main`` turns it into ``hyperreg <cmd>: error: …`` and exit code 2). torch and the
library are imported inside the functions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = [
    "check_inputs_exist",
    "check_label_maps",
    "check_out_folder",
    "created_folders",
    "model_for",
    "model_path_for",
    "new_folders",
    "pair_options",
    "preprocessing_options",
    "tuned_lambda",
]


def model_for(args: Any) -> Any:
    """The model ``--model`` names (:func:`model_path_for`), loaded on the device of
    ``--device`` (:func:`hyperreg.apps.models.resolve_model`), with ``--flip-average`` where
    the command has it."""
    from hyperreg._checks import resolve_device
    from hyperreg.apps.models import resolve_model

    device = resolve_device(args.command, args.device)
    flips = getattr(args, "flip_average", None)
    return resolve_model(model_path_for(args), device, flip_average=flips).model


def model_path_for(args: Any) -> str:
    """The checkpoint file ``--model`` names (:func:`hyperreg.apps.models.model_source`);
    without ``--model``, the bundled model for the dimensionality of the fixed image
    (``--fixed``, or the first row of ``--pairs``), and which one is printed. ``args.model``
    becomes that file."""
    from hyperreg._errors import passed_as
    from hyperreg.apps.models import model_source

    check_inputs_exist(args)  # a missing input is said before any model is read
    image = getattr(args, "fixed", None)
    source = "fixed"  # the dest that gave ``image``
    if image is None and args.model is None:
        from hyperreg.apps.inputs import read_pairs

        with passed_as(path="pairs"):
            image = read_pairs(args.pairs)[0].fixed
        source = "pairs"
    with passed_as(image=source):
        path, bundled = model_source(args.model, image=image)
    if bundled is not None:
        name, card = bundled.name, bundled.card
        print(f"hyperreg {args.command}: using the bundled model {name} (card: {card})")
    args.model = str(path)
    return args.model


def tuned_lambda(args: Any) -> None:
    """``--lambda tune.json``: ``args.lam`` becomes its λ*
    (:func:`hyperreg.apps.tune.read_tuned_lambda`), printed with its source, and a note when
    it was measured with other refinement steps or passes than the command runs; a number,
    ``auto`` or None is left as it is.

    Raises:
        InputError: If the file is missing or holds no λ* (named as ``--lambda``).
    """
    if not isinstance(args.lam, str) or args.lam == "auto":
        return
    from hyperreg.apps.tune import read_tuned_lambda

    tuned = read_tuned_lambda(args.lam)
    args.lam, args.lam_source = tuned.lam, tuned.source  # the source: for the closing lines too
    print(f"hyperreg {args.command}: λ {tuned.lam:.4g} ({tuned.source})")
    refine = getattr(args, "refine", None)
    if refine is not None and tuned.refine_steps is not None and refine != tuned.refine_steps:
        print(
            f"hyperreg {args.command}: note: λ* was measured with {tuned.refine_steps} "
            f"refinement steps, this run refines {refine}"
        )


def check_inputs_exist(args: Any) -> None:
    """The input files of ``--moving``, ``--fixed``, ``--moving-seg`` and ``--fixed-seg``
    (those the command has and was given) exist.

    Raises:
        MissingInputError: For the first that does not, naming its option
            (``argument --moving: no such file: 'm.nii.gz'``).
    """
    from hyperreg._errors import MissingInputError

    for dest in ("moving", "fixed", "moving_seg", "fixed_seg"):
        path = getattr(args, dest, None)
        if path is not None and not Path(path).exists():
            raise MissingInputError("", "no such file: '{path}'", dest, path=path)


def check_label_maps(**maps: str | os.PathLike[str] | None) -> None:
    """Each given label map holds integer ids, not intensities (see ``check_label_map``).

    Keyword names are argument ``dest`` names (``moving_seg=args.moving_seg``); the message
    names the option.
    """
    from hyperreg.apps.inputs import check_label_map

    for dest, path in maps.items():
        if path is not None:
            check_label_map("check_label_maps", dest, path)


def pair_options(args: Any, *, check_labels: bool = True) -> dict[str, Any]:
    """Label maps (checked first, see :func:`check_label_maps`; ``check_labels=False`` for a
    library function that checks them as it reads them, ``register_files``: one read per
    file), normalisation and resampling of ``register`` and ``sweep``, as keyword arguments of
    ``register_files`` / ``sweep_files``."""
    if check_labels:
        check_label_maps(moving_seg=args.moving_seg, fixed_seg=args.fixed_seg)
    return {
        "moving_seg": args.moving_seg,
        "fixed_seg": args.fixed_seg,
        **preprocessing_options(args),
    }


def preprocessing_options(args: Any) -> dict[str, Any]:
    """``--normalization``, ``--no-resample``, ``--bias-correct`` and ``--replace-nonfinite``
    (``opts.add_preprocessing_arguments``) as keyword arguments of the library functions."""
    return {
        "normalization": args.normalization,
        "resample": args.resample,
        "bias_correct": args.bias_correct,
        "replace_nonfinite": args.replace_nonfinite,
    }


def check_out_folder(value: str, option: str = "--out") -> None:
    """``value`` is a folder, or one can be created there (no file in the way, writable).

    Raises:
        ValueError: If ``value`` or one of its parents is a file, or the nearest existing
            parent is not writable.
    """
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"argument {option}: '{value}' is a file, not a folder; give a folder (it is "
            "created if missing)"
        )
    folder = path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"argument {option}: cannot create folder '{value}': '{folder}' is a file")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"argument {option}: cannot write into '{value}': '{folder}' is read-only")


def new_folders(*paths: str | os.PathLike[str] | None) -> list[Path]:
    """The folders of ``paths`` that do not exist yet (writing the outputs creates them)."""
    found: list[Path] = []
    for path in paths:
        if path is not None and path != "" and not Path(path).parent.exists():
            if Path(path).parent not in found:
                found.append(Path(path).parent)
    return found


def created_folders(folders: list[Path]) -> None:
    """Say which output folders a command created (none were there before it ran)."""
    for folder in folders:
        if folder.is_dir():
            print(f"created folder {folder}")
