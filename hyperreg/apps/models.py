"""Which model a user means: a checkpoint file, a training run folder, or a bundled name.

:func:`model_file` turns such a spec into the checkpoint file; :func:`resolve_model` loads it
(or, without a spec, the bundled model for the images' dimensionality) onto a device and says
which bundled model it took; :func:`model_architecture` reconciles the architecture a training
run asks for with that of the checkpoint it continues or fine-tunes. Errors are
:class:`~hyperreg.registration.pipeline.InputError` carrying the caller's argument name in
``argument`` (a front end maps it to its own option); messages never name command-line flags.
Must not import cli.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperreg.apps.pretrained import BundledModel, bundled_models, default_model
from hyperreg.registration.pipeline import InputError

__all__ = ["MODEL_FILE", "ResolvedModel", "model_architecture", "model_file", "resolve_model"]

MODEL_FILE = "model.pt"  # what 'hyperreg train' writes into its output folder
_IMAGE_SUFFIXES = (".nii.gz", ".nii", ".mgz", ".mgh", ".npz")


def model_file(spec: str | os.PathLike[str], argument: str = "model") -> Path:
    """The checkpoint file ``spec`` names: the file itself, ``model.pt`` in a run folder, or a
    bundled model by name (``hypermorph-2d``, as ``hyperreg models`` lists them).

    Raises:
        InputError: If ``spec`` names nothing (``FileNotFoundError`` is its cause) or a folder
            without ``model.pt``; ``argument`` is stored in the error.
    """
    fn = "model_file"
    path = Path(spec)
    if not path.exists():
        named = {m.name: m.path for m in bundled_models()}
        if str(spec) in named:
            return named[str(spec)]
    if path.is_dir():
        if (path / MODEL_FILE).is_file():
            return path / MODEL_FILE
        found = sorted(p.name for p in path.glob("*.pt"))
        hint = f"; it holds {', '.join(found[:3])}: give one of them" if found else ""
        raise InputError(
            f"{fn}(): folder '{spec}' holds no {MODEL_FILE} (the checkpoint 'hyperreg train' "
            f"writes){hint}",
            argument,
        )
    if not path.exists():
        names = ", ".join(m.name for m in bundled_models())
        raise InputError(
            f"{fn}(): no such file or folder: '{spec}' (nor a bundled model: {names})", argument
        )
    return path


def _load(path: Path, device: Any, argument: str) -> Any:
    from hyperreg.method.model import load_checkpoint

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
        raise InputError(
            f"resolve_model(): '{path}' is not a hyperreg checkpoint ({reason}); give the "
            f"{MODEL_FILE} that 'hyperreg train' wrote, or its folder",
            argument,
        ) from err
    return model


@dataclass(frozen=True)
class ResolvedModel:
    """Output of :func:`resolve_model`: the model, its file, and the bundled model it is (None
    when the spec named a file or folder)."""

    model: Any
    path: Path
    bundled: BundledModel | None


def resolve_model(
    spec: str | os.PathLike[str] | None,
    device: Any = "cpu",
    *,
    image: str | os.PathLike[str] | None = None,
    argument: str = "model",
) -> ResolvedModel:
    """Load the model ``spec`` names onto ``device``.

    Args:
        spec: A checkpoint file, a run folder holding ``model.pt``, a bundled model's name, or
            None: the bundled model for the dimensionality of ``image``.
        device: A torch device (or its name).
        image: An image of the pair(s) to register (only its header is read); needed when
            ``spec`` is None.
        argument: The caller's name for ``spec``, stored in errors.

    Returns:
        A :class:`ResolvedModel`.

    Raises:
        InputError: If ``spec`` names nothing usable, is not a hyperreg checkpoint, or no
            bundled model registers images like ``image``.
        RuntimeError: If the checkpoint's format is unknown or its weights do not match its
            config (:func:`hyperreg.method.model.load_checkpoint`).
    """
    bundled = None
    if spec is None:
        if image is None:
            raise InputError("resolve_model(): give a model, or an image to pick one for", argument)
        ndim = _image_ndim(image)
        try:
            bundled = default_model(ndim)
        except ValueError as err:
            raise InputError(
                f"resolve_model(): no bundled model registers {ndim}D images like '{image}'; "
                "give a model trained with 'hyperreg train'",
                argument,
            ) from err
        path = bundled.path
    else:
        path = model_file(spec, argument)
    return ResolvedModel(_load(path, device, argument), path, bundled)


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


def model_architecture(source: str | os.PathLike[str] | None, **given: Any) -> Any:
    """The :class:`~hyperreg.config.ModelConfig` of a run that continues or fine-tunes
    ``source`` (a checkpoint file; None: a new model from ``given``).

    Args:
        source: The checkpoint whose architecture the run keeps, or None.
        **given: Architecture fields asked for (``ndim``, ``int_steps``, ``parametrization``);
            None values are not asked for.

    Raises:
        InputError: If a field asked for differs from the checkpoint's (``argument`` is that
            field's name).
    """
    from hyperreg.config import ModelConfig
    from hyperreg.method.model import load_checkpoint

    asked = {key: value for key, value in given.items() if value is not None}
    if not source:
        return ModelConfig(**asked)
    config = load_checkpoint(source)[0].config
    for key, value in asked.items():
        if getattr(config, key) != value:
            raise InputError(
                f"model_architecture(): '{source}' was trained with {key} "
                f"{getattr(config, key)}, but {key} {value} was asked for; drop it or pass "
                "that value",
                key,
            )
    return config
