"""The defaults a model registers with when none are asked for: its λ and its refinement.

:func:`checkpoint_default_lambda` reads a checkpoint's default λ (its own, its bundled card's,
its best validation Dice, or :data:`FALLBACK_LAMBDA`, always with where it came from) and
:func:`checkpoint_default_refine` its default test-time refinement steps;
:func:`model_default_lambda` and :func:`model_default_refine` give those of a loaded model (what
:func:`hyperreg.apps.models.resolve_model` recorded on it, or its bundled card's). Nothing here
loads a model. :mod:`hyperreg.apps.models` re-exports every public name.
Must not import cli or :mod:`hyperreg.apps.models` (which imports this module).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperreg.pretrained import BundledModel, bundled_models

__all__ = [
    "FALLBACK_LAMBDA",
    "DefaultLambda",
    "DefaultRefine",
    "checkpoint_default_lambda",
    "checkpoint_default_refine",
    "model_default_lambda",
    "model_default_refine",
]

FALLBACK_LAMBDA = 0.1
"""λ of a model that records no default (no ``default_lambda``, card or validation Dice)."""


@dataclass(frozen=True)
class DefaultLambda:
    """The λ a model registers at when none is asked for.

    Attributes:
        lam: λ in [0, 1].
        source: One line saying where it comes from (printed by the command line).
    """

    lam: float
    source: str


def _valid_lambda(value: Any) -> float | None:
    try:
        lam = float(value)
    except (TypeError, ValueError):
        return None
    return lam if math.isfinite(lam) and 0.0 <= lam <= 1.0 else None


def checkpoint_default_lambda(
    payload: dict[str, Any], path: str | os.PathLike[str]
) -> DefaultLambda:
    """The default λ of the checkpoint ``path`` whose contents are ``payload``.

    In this order: the payload's ``"default_lambda"`` (its source: the payload's
    ``"default_lambda_note"``, where it came from, as ``hyperreg train`` records it); for a
    bundled model (the file is one of
    :func:`~hyperreg.pretrained.bundled_models`), ``default_lambda`` of its entry in
    ``index.json`` (from its model card); for a training run's ``best.pt``/``model.pt``, the λ
    of best mean Dice in the payload's ``"validation"`` row (keys ``dice_<λ>``); else
    :data:`FALLBACK_LAMBDA`, said to be the fallback.

    Args:
        payload: The checkpoint dict (:func:`hyperreg.method.model.load_checkpoint`).
        path: The checkpoint file (named in ``source``; matched against the bundled models).

    Returns:
        A :class:`DefaultLambda`.
    """
    path = Path(path)
    own = _valid_lambda(payload.get("default_lambda"))
    if own is not None:
        note = payload.get("default_lambda_note")
        if isinstance(note, str) and note:
            return DefaultLambda(own, note)
        return DefaultLambda(own, f"the default_lambda stored in '{path}'")
    for bundled in bundled_models():
        if bundled.default_lambda is not None and bundled.path.resolve() == path.resolve():
            note = f" ({bundled.default_lambda_note})" if bundled.default_lambda_note else ""
            return DefaultLambda(
                bundled.default_lambda, f"the card of the bundled model {bundled.name}{note}"
            )
    row = payload.get("validation")
    if isinstance(row, dict):
        scores = []
        for key, value in row.items():
            lam = _valid_lambda(key[5:]) if str(key).startswith("dice_") else None
            if lam is not None and isinstance(value, (int, float)) and math.isfinite(value):
                scores.append((float(value), lam))
        if scores:
            dice, lam = max(scores)
            step = payload.get("step")
            at = f" at step {step}" if step is not None else ""
            return DefaultLambda(lam, f"the best validation Dice of '{path}' ({dice:.4f}{at})")
    return DefaultLambda(
        FALLBACK_LAMBDA,
        f"the fallback value, as '{path}' records none (no default_lambda, model card or "
        "validation Dice)",
    )


@dataclass(frozen=True)
class DefaultRefine:
    """The test-time refinement steps a model runs when none are asked for.

    Attributes:
        steps: Adam steps (:class:`~hyperreg.registration.refine.Refinement`); 0 = none.
        source: One line, ``"refinement: <n> steps, <where from>"`` (printed by the command
            line).
    """

    steps: int
    source: str


def checkpoint_default_refine(
    path: str | os.PathLike[str], payload: dict[str, Any] | None = None
) -> DefaultRefine:
    """The default refinement of the checkpoint ``path``: the ``"default_refine"`` steps its
    contents ``payload`` record (with ``"default_refine_note"``; ``hyperreg train`` records
    them, read from the file when ``payload`` is None), else ``default_refine`` of its entry in
    ``index.json`` for a bundled model (from its model card), else none (0 steps)."""
    if payload is None:
        payload = _payload_keys(path)
    own = payload.get("default_refine")
    if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
        note = payload.get("default_refine_note")
        note = note if isinstance(note, str) and note else f"recorded in '{path}'"
        if not own:
            return DefaultRefine(0, f"refinement: none, {note}")
        return DefaultRefine(own, f"refinement: {own} steps, {note}")
    for bundled in bundled_models():
        if bundled.default_refine and bundled.path.resolve() == Path(path).resolve():
            note = f" ({bundled.default_refine_note})" if bundled.default_refine_note else ""
            steps = bundled.default_refine
            source = f"refinement: {steps} steps, the default of the bundled model {bundled.name}"
            return DefaultRefine(steps, source + note)
    return DefaultRefine(0, f"refinement: none, '{path}' records no default")


def _payload_keys(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's entries other than its weights ({} for a file torch cannot read: the
    caller's own loading says what is wrong with it)."""
    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch raises many types for a bad file
        return {}
    if not isinstance(payload, dict):
        return {}
    return {key: value for key, value in payload.items() if key != "state_dict"}


def model_default_refine(model: Any) -> DefaultRefine:
    """The default refinement :func:`~hyperreg.apps.models.resolve_model` recorded on ``model``
    (attribute ``default_refine``), or its bundled card's (a model from
    :func:`hyperreg.pretrained.load_pretrained`), else none (0 steps)."""
    found = getattr(model, "default_refine", None)
    if isinstance(found, DefaultRefine):
        return found
    bundled = getattr(model, "bundled", None)  # hyperreg.pretrained.load_pretrained
    if isinstance(bundled, BundledModel):
        return checkpoint_default_refine(bundled.path)
    return DefaultRefine(0, "refinement: none, the model records no default")


def model_default_lambda(model: Any) -> DefaultLambda:
    """The default λ of ``model``: the one :func:`~hyperreg.apps.models.resolve_model` recorded
    on it (attribute ``default_lambda``, see :func:`checkpoint_default_lambda`), or its bundled
    card's (a model from :func:`hyperreg.pretrained.load_pretrained`), else
    :data:`FALLBACK_LAMBDA` (a model built or loaded some other way records none)."""
    found = getattr(model, "default_lambda", None)
    if isinstance(found, DefaultLambda):
        return found
    bundled = getattr(model, "bundled", None)  # hyperreg.pretrained.load_pretrained
    if isinstance(bundled, BundledModel):
        return checkpoint_default_lambda({}, bundled.path)
    return DefaultLambda(
        FALLBACK_LAMBDA,
        "the fallback value, as the model records none (load it with "
        "hyperreg.apps.models.resolve_model to use its own)",
    )
