"""Pretrained models shipped inside the package, so registration needs no training run first.

The files live beside this module, in ``hyperreg/pretrained/``: one checkpoint (``<name>.pt``,
written by ``hyperreg train``) and one model card (``<name>.md``: command, data and people,
steps, λ distribution, validation Dice against λ on people held out of training) per model,
listed in ``index.json``. :func:`bundled_models` lists them, :func:`default_model` picks the
one for a dimensionality (what ``register``, ``sweep``, ``tune`` and ``batch`` use without
``--model``).
Imports :mod:`hyperreg.method.model` (lazily, to load a checkpoint) and nothing above it.
"""

from __future__ import annotations

import dataclasses

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PRETRAINED_DIR",
    "BundledModel",
    "bundled_models",
    "checkpoint_total_steps",
    "default_model",
    "export_model",
    "load_pretrained",
]

PRETRAINED_DIR = Path(__file__).resolve().parent
_INDEX = "index.json"


@dataclass(frozen=True)
class BundledModel:
    """One shipped model.

    Attributes:
        name: Its name, e.g. ``"hypermorph-2d"``.
        ndim: Spatial dimensions it registers (2 or 3).
        path: The checkpoint file.
        card: The model card (Markdown).
        summary: One line: what it was trained on and how well it does on held-out people.
        default: Whether it is the default for its ``ndim``.
        default_lambda: The λ its card recommends when none is given (``index.json``), or None.
        default_lambda_note: Where that λ comes from (one line, from ``index.json``).
        default_refine: Test-time refinement steps its card recommends when none are asked for
            (``index.json``; 0 = the network's field as it is).
        default_refine_note: Why (one line, from ``index.json``).
        total_steps: Optimiser steps its weights had in all, counting the models it was
            fine-tuned from (``index.json``, from its card); 0: the ``step`` its file records.
    """

    name: str
    ndim: int
    path: Path
    card: Path
    summary: str
    default: bool
    default_lambda: float | None = None
    default_lambda_note: str = ""
    default_refine: int = 0
    default_refine_note: str = ""
    total_steps: int = 0


def bundled_models(folder: Path = PRETRAINED_DIR) -> list[BundledModel]:
    """The models listed in ``folder/index.json`` whose checkpoint is present, sorted by name.

    Raises:
        RuntimeError: If the index exists but is malformed (a packaging error).
    """
    index = folder / _INDEX
    if not index.is_file():
        return []
    try:
        entries = json.loads(index.read_text())["models"]
        models = [
            BundledModel(
                name=str(e["name"]),
                ndim=int(e["ndim"]),
                path=folder / e["file"],
                card=folder / e["card"],
                summary=str(e.get("summary", "")),
                default=bool(e.get("default", False)),
                default_lambda=(
                    None if e.get("default_lambda") is None else float(e["default_lambda"])
                ),
                default_lambda_note=str(e.get("default_lambda_note", "")),
                default_refine=int(e.get("default_refine", 0)),
                default_refine_note=str(e.get("default_refine_note", "")),
                total_steps=int(e.get("total_steps", 0)),
            )
            for e in entries
        ]
    except (KeyError, TypeError, ValueError) as err:
        raise RuntimeError(f"bundled_models(): '{index}' is malformed ({err})") from err
    return sorted((m for m in models if m.path.is_file()), key=lambda m: m.name)


def checkpoint_total_steps(payload: dict[str, Any], path: str | Path) -> int:
    """Optimiser steps the weights of the checkpoint ``path`` (contents ``payload``) had in
    all, counting the models they were fine-tuned from: the payload's ``"total_steps"``
    (``hyperreg train`` records it), else ``total_steps`` of a bundled model's entry in
    ``index.json`` (from its card), else the payload's ``"step"`` (0 when none)."""
    total = payload.get("total_steps")
    if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
        return total
    for bundled in bundled_models():
        if bundled.total_steps and bundled.path.resolve() == Path(path).resolve():
            return bundled.total_steps
    step = payload.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0


def default_model(ndim: int, folder: Path = PRETRAINED_DIR) -> BundledModel:
    """The bundled model for ``ndim``-dimensional images (the one marked default, else the first).

    Raises:
        ValueError: If no bundled model registers ``ndim``-dimensional images.
    """
    found = [m for m in bundled_models(folder) if m.ndim == ndim]
    if not found:
        shipped = ", ".join(f"{m.name} ({m.ndim}D)" for m in bundled_models(folder)) or "none"
        raise ValueError(
            f"default_model(): no bundled model registers {ndim}D images (shipped: {shipped}); "
            "train one with 'hyperreg train' and give it with --model"
        )
    return next((m for m in found if m.default), found[0])


def load_pretrained(ndim: int = 2, device: Any = "cpu") -> Any:
    """Load the default bundled model for ``ndim``-dimensional images onto ``device``.

    Args:
        ndim: 2 or 3.
        device: A ``torch.device`` or its name (``"cpu"``, ``"cuda"``); never chosen here.

    Returns:
        The :class:`~hyperreg.method.model.HyperMorph` in eval mode; its ``bundled`` attribute
        is the :class:`BundledModel` it came from, so the registration entry points
        (``hyperreg.apps``) use its card's default λ and refinement, as the command line does.

    Raises:
        ValueError: If no bundled model registers ``ndim``-dimensional images.
    """
    from hyperreg.method.model import load_checkpoint

    bundled = default_model(ndim)
    model, _ = load_checkpoint(bundled.path, map_location=device)
    model.bundled = bundled  # its card's defaults (λ, refinement) for hyperreg.apps.models
    return model.eval()


# what an exported file keeps of a checkpoint besides the weights, config and objective: what
# its card cites and the defaults it registers with (hyperreg.apps.models)
_EXPORTED = (
    "step",
    "total_steps",
    "train_config",
    "validation",
    "default_lambda",
    "default_lambda_note",
    "default_refine",
    "default_refine_note",
)


def export_model(
    checkpoint: str | Path,
    out: str | Path,
    passes: int | None = None,
    flip_average: bool | None = None,
) -> Path:
    """Write a training checkpoint as a bundled model file: weights in float16, no optimiser.

    Keeps what a model card cites (``step``, ``total_steps``, ``train_config``,
    ``validation``) and the defaults it registers with (``default_lambda``,
    ``default_refine`` and their notes), the objective and the model config with its
    voxel size; drops the optimiser and random states. Weights are stored as float16 (half the
    size; every weight within 2^-11 of its float32 value) and load back as float32.

    Args:
        checkpoint: Any hyperreg checkpoint (``best.pt``, ``model.pt``, ``checkpoint_*.pt``).
        out: The ``.pt`` file to write (e.g. ``hyperreg/pretrained/hypermorph-3d.pt``).
        passes: Network passes the model runs by default (``ModelConfig.passes``, what its card
            measured); None keeps the checkpoint's.
        flip_average: Whether the model averages its flow over a left-right mirror at test
            time (``ModelConfig.flip_average``; needs the model's orientation); None keeps the
            checkpoint's.

    Returns:
        ``Path(out)``.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: As
            :func:`~hyperreg.method.model.load_checkpoint`.
    """
    import torch

    from hyperreg.method.model import load_checkpoint, save_checkpoint

    model, payload = load_checkpoint(checkpoint)
    if passes is not None:
        model.config = dataclasses.replace(model.config, passes=passes)
    if flip_average is not None:
        model.config = dataclasses.replace(model.config, flip_average=flip_average)
    keep = {key: payload[key] for key in _EXPORTED if key in payload}
    return save_checkpoint(model, out, weights_dtype=torch.float16, **keep)
