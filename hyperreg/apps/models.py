"""Which model a user means: a checkpoint file, a training run folder, or a bundled name.

:func:`model_file` turns such a spec into the checkpoint file; :func:`model_source` also picks,
without a spec, the bundled model for the images' dimensionality (nothing loaded);
:func:`resolve_model` loads it onto a device (and turns its test-time flip averaging on or off)
and records on it its default λ and refinement (read by :mod:`hyperreg.registration.defaults`);
:func:`model_architecture` reconciles a training run's architecture with the checkpoint it
continues. Errors are :class:`~hyperreg.registration.pipeline.InputError` carrying the caller's
argument name (a front end maps it to its own option; messages never name flags).
What a model registers with when nothing is asked for, and a request turned into one pair's λ
or refinement (:func:`model_default_lambda`, :func:`pair_lambda`, :func:`model_default_refine`,
:func:`pair_refinement`, ...), are resolved in :mod:`hyperreg.registration.defaults`, beside the
registration settings; this module re-exports those names. Must not import cli.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hyperreg._errors import InputError, passed_as
from hyperreg.pretrained import BundledModel, bundled_models, default_model
from hyperreg.registration.defaults import (
    AUTO,
    FALLBACK_LAMBDA,
    ChosenLambda,
    DefaultLambda,
    DefaultRefine,
    DefaultSteps,
    check_lambda,
    checkpoint_default_lambda,
    checkpoint_default_refine,
    model_default_lambda,
    model_default_refine,
    pair_lambda,
    pair_refinement,
)

__all__ = [
    "AUTO",
    "FALLBACK_LAMBDA",
    "MODEL_FILE",
    "ChosenLambda",
    "DefaultLambda",
    "DefaultRefine",
    "DefaultSteps",
    "ResolvedModel",
    "check_lambda",
    "checkpoint_default_lambda",
    "checkpoint_default_refine",
    "model_architecture",
    "model_default_lambda",
    "model_default_refine",
    "model_file",
    "model_source",
    "pair_lambda",
    "pair_refinement",
    "resolve_model",
]

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
            fn,
            "folder '{spec}' holds no {file} (the checkpoint 'hyperreg train' writes){hint}",
            argument,
            spec=spec,
            file=MODEL_FILE,
            hint=hint,
        )
    if not path.exists():
        names = ", ".join(m.name for m in bundled_models())
        raise InputError(
            fn,
            "no such file or folder: '{spec}' (nor a bundled model: {names})",
            argument,
            spec=spec,
            names=names,
        )
    return path


def _load(path: Path, device: Any, argument: str) -> tuple[Any, dict[str, Any]]:
    from hyperreg.method.model import load_checkpoint

    try:
        model, payload = load_checkpoint(path, map_location=device)
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
            "resolve_model",
            "'{path}' is not a hyperreg checkpoint ({reason}); give the {file} that 'hyperreg "
            "train' wrote, or its folder",
            argument,
            path=path,
            reason=reason,
            file=MODEL_FILE,
        ) from err
    return model, payload


@dataclass(frozen=True)
class ResolvedModel:
    """Output of :func:`resolve_model`: the model, its file, the bundled model it is (None
    when the spec named a file or folder), and its default λ (also recorded on the model, see
    :func:`model_default_lambda`)."""

    model: Any
    path: Path
    bundled: BundledModel | None
    default_lambda: DefaultLambda | None = None


def model_source(
    spec: str | os.PathLike[str] | None,
    *,
    image: str | os.PathLike[str] | None = None,
    argument: str = "model",
) -> tuple[Path, BundledModel | None]:
    """The checkpoint file ``spec`` names, and the bundled model it is (None for a file or
    folder), without loading it: what :func:`resolve_model` loads.

    Args:
        spec: A checkpoint file, a run folder holding ``model.pt``, a bundled model's name, or
            None: the bundled model for the dimensionality of ``image``.
        image: An image of the pair(s) to register (only its header is read); needed when
            ``spec`` is None.
        argument: The caller's name for ``spec``, stored in errors.

    Raises:
        InputError: If ``spec`` names nothing usable, or no bundled model registers images
            like ``image``.
    """
    bundled = None
    if spec is None:
        if image is None:
            raise InputError("model_source", "give a model, or an image to pick one for", argument)
        with passed_as(path="image"):  # the file's errors name this function's argument
            ndim = _image_ndim(image)
        try:
            bundled = default_model(ndim)
        except ValueError as err:
            raise InputError(
                "model_source",
                "no bundled model registers {ndim}D images like '{image}'; give a model trained "
                "with 'hyperreg train'",
                argument,
                ndim=ndim,
                image=image,
            ) from err
        path = bundled.path
    else:
        path = model_file(spec, argument)
    return path, bundled


def resolve_model(
    spec: str | os.PathLike[str] | None,
    device: Any = "cpu",
    *,
    image: str | os.PathLike[str] | None = None,
    argument: str = "model",
    flip_average: bool | None = None,
) -> ResolvedModel:
    """Load the model ``spec`` names onto ``device``.

    Args:
        spec, image, argument: As :func:`model_source`.
        device: A torch device (or its name).
        flip_average: Turns the model's test-time left-right flip averaging on or off
            (``ModelConfig.flip_average``); None keeps what its file records.

    Returns:
        A :class:`ResolvedModel`; its model carries its default λ as ``model.default_lambda``
        (:func:`checkpoint_default_lambda`) and its default refinement as
        ``model.default_refine`` (:func:`checkpoint_default_refine`).

    Raises:
        InputError: If ``spec`` names nothing usable, is not a hyperreg checkpoint, no
            bundled model registers images like ``image``, or ``flip_average`` is asked of a
            model that records no orientation (no left-right axis).
        RuntimeError: If the checkpoint's format is unknown or its weights do not match its
            config (:func:`hyperreg.method.model.load_checkpoint`).
    """
    path, bundled = model_source(spec, image=image, argument=argument)
    model, payload = _load(path, device, argument)
    if flip_average and model.config.flip_axis() is None:
        raise InputError(
            "resolve_model",
            "{0} needs a model that records its orientation (its left-right axis); {path} "
            "records none",
            "flip_average",
            path=path,
        )
    if flip_average is not None:
        model.config = replace(model.config, flip_average=flip_average)
    default = checkpoint_default_lambda(payload, path)
    model.default_lambda = default
    model.default_refine = checkpoint_default_refine(path, payload)
    return ResolvedModel(model, path, bundled, default)


def _image_ndim(path: str | os.PathLike[str]) -> int:
    """Spatial dimensions of an image from its header alone (the command reads the data later);
    a file whose header does not tell is read whole, so its error is load_volume's."""
    from hyperreg.geometry.io import load_volume, spatial_shape_of

    try:
        import nibabel as nib

        return len(spatial_shape_of(Path(path), tuple(nib.load(path).shape)))
    except Exception:  # npz, unreadable, 4D, ...: let load_volume say what it is
        with warnings.catch_warnings():  # the command loads the file again and warns then
            warnings.simplefilter("ignore")  # (and chooses the geometry of an npz then)
            return load_volume(path, assume_identity=True).ndim


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
                "model_architecture",
                "'{source}' was trained with {key} {trained}, but {key} {value} was asked for; "
                "drop it or pass that value",
                key,
                source=source,
                key=key,
                trained=getattr(config, key),
                value=value,
            )
    return config
