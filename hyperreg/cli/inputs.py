"""Checks of command-line inputs that name the option, made before any work is done.

:func:`load_model` reads ``--model`` (a checkpoint or a run folder holding ``model.pt``) for every
command that takes one; :func:`check_label_maps` rejects an intensity image given as a label map;
:func:`check_out_folder` rejects an ``--out`` folder that cannot be created. Each raises with a
one-line message that names the option (``run.main`` turns it into ``hyperreg <cmd>: error: …``
and exit code 2). torch and the library are imported inside the functions.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

__all__ = [
    "bundled_model_for",
    "check_label_maps",
    "check_out_folder",
    "load_model",
    "model_for",
    "model_path",
    "pair_options",
    "preprocessing_options",
]

MODEL_FILE = "model.pt"  # what 'hyperreg train' writes into its output folder
_IMAGE_SUFFIXES = (".nii.gz", ".nii", ".mgz", ".mgh", ".npz")


def model_path(value: str, option: str = "--model") -> Path:
    """The checkpoint file ``value`` names: the file itself, ``model.pt`` in a run folder, or
    a bundled model by name (``hypermorph-2d``, as ``hyperreg models`` lists them).

    Raises:
        FileNotFoundError: If ``value`` does not exist.
        ValueError: If it is a folder without ``model.pt``.
    """
    path = Path(value)
    if not path.exists():
        from hyperreg.apps.pretrained import bundled_models

        named = {m.name: m.path for m in bundled_models()}
        if value in named:
            return named[value]
    if path.is_dir():
        if (path / MODEL_FILE).is_file():
            return path / MODEL_FILE
        found = sorted(p.name for p in path.glob("*.pt"))
        hint = f"; it holds {', '.join(found[:3])}: give one of them" if found else ""
        raise ValueError(
            f"argument {option}: folder '{value}' holds no {MODEL_FILE} (the checkpoint "
            f"'hyperreg train' writes){hint}"
        )
    if not path.exists():
        raise FileNotFoundError(f"argument {option}: no such file or folder: '{value}'")
    return path


def load_model(value: str, device: Any, option: str = "--model") -> Any:
    """Load the model ``--model`` names onto ``device``; a bad file is a one-line ValueError.

    Raises:
        FileNotFoundError: If ``value`` does not exist.
        ValueError: If it is a folder without ``model.pt``, or a file that is not a hyperreg
            checkpoint (e.g. a NIfTI image).
        RuntimeError: If the checkpoint's format version is unknown or its weights do not
            match its config (from :func:`hyperreg.method.model.load_checkpoint`).
    """
    from hyperreg.method.model import load_checkpoint

    path = model_path(value, option)
    try:
        model, _ = load_checkpoint(path, map_location=device)
    except ValueError as err:
        # load_checkpoint wraps torch.load's many-line message; say in one line what it is.
        if "not a hyperreg checkpoint" not in str(err):
            raise
        if path.name.lower().endswith(_IMAGE_SUFFIXES):
            reason = "it is an image file"
        elif err.__cause__ is None:
            reason = "no format_version entry"
        else:
            reason = "torch.load cannot read it"
        raise ValueError(
            f"argument {option}: '{path}' is not a hyperreg checkpoint ({reason}); give the "
            f"{MODEL_FILE} that 'hyperreg train' wrote, or its folder"
        ) from err
    return model


def model_for(args: Any) -> Any:
    """The model of ``args.model`` on the device of ``args.device`` (for ``args.command``).

    Without ``--model`` it is the bundled model for the dimensionality of the fixed image
    (``--fixed``, or the first row of ``--pairs``); which one is printed.

    Raises:
        ValueError: If no bundled model fits the images (and no ``--model`` was given), or as
            :func:`load_model`.
    """
    from hyperreg._checks import resolve_device

    device = resolve_device(args.command, args.device)
    if args.model is None:
        args.model = str(bundled_model_for(args).path)
    return load_model(args.model, device)


def bundled_model_for(args: Any) -> Any:
    """The :class:`~hyperreg.apps.pretrained.BundledModel` for the images of ``args``, printed.

    Raises:
        ValueError: If none registers images of that dimensionality.
    """
    from hyperreg.apps.pretrained import default_model

    fixed = getattr(args, "fixed", None)
    if fixed is None:
        from hyperreg.apps.batch import read_pairs

        fixed = read_pairs(args.pairs)[0].fixed
    ndim = _image_ndim(fixed)
    try:
        bundled = default_model(ndim)
    except ValueError as err:
        raise ValueError(
            f"argument --model: no bundled model registers {ndim}D images like '{fixed}'; "
            "give a model trained with 'hyperreg train'"
        ) from err
    print(f"hyperreg {args.command}: using the bundled model {bundled.name} (card: {bundled.card})")
    return bundled


def _image_ndim(path: str | os.PathLike[str]) -> int:
    """Spatial dimensions of an image from its header alone (the command reads the data later);
    a file whose header does not tell is read whole, so its error is load_volume's."""
    from hyperreg.geometry.io import load_volume, spatial_shape_of

    try:
        import nibabel as nib

        return len(spatial_shape_of(Path(path), tuple(nib.load(path).shape)))
    except Exception:  # npz, unreadable, 4D, ...: let load_volume say what it is
        with warnings.catch_warnings():  # the command loads the file again and warns then
            warnings.simplefilter("ignore")
            return load_volume(path).ndim


def check_label_maps(**maps: str | os.PathLike[str] | None) -> None:
    """Each given label map holds integer ids, not intensities (see ``check_label_map``).

    Keyword names are argument ``dest`` names (``moving_seg=args.moving_seg``); the message
    names the option.
    """
    from hyperreg.apps.inference import check_label_map

    for dest, path in maps.items():
        if path is not None:
            check_label_map("check_label_maps", dest, path)


def pair_options(args: Any) -> dict[str, Any]:
    """Label maps (checked first, see :func:`check_label_maps`), normalisation and resampling
    of ``register`` and ``sweep``, as keyword arguments of ``register_files`` / ``sweep_files``."""
    check_label_maps(moving_seg=args.moving_seg, fixed_seg=args.fixed_seg)
    return {
        "moving_seg": args.moving_seg,
        "fixed_seg": args.fixed_seg,
        **preprocessing_options(args),
    }


def preprocessing_options(args: Any) -> dict[str, Any]:
    """``--normalization`` and ``--no-resample`` (``opts.add_preprocessing_arguments``) as
    keyword arguments of the library functions."""
    return {"normalization": args.normalization, "resample": args.resample}


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
