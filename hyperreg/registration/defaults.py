"""The defaults a model registers with when none are asked for, resolved for a pair.

What a registration runs with when a caller leaves λ or refinement out is decided here, once,
beside :mod:`hyperreg.registration.settings` (which turns the resolved values into the frozen
:class:`~hyperreg.registration.settings.RegistrationSettings`):
:func:`checkpoint_default_lambda` reads a checkpoint's default λ (its own, its bundled card's,
its best validation Dice, or :data:`FALLBACK_LAMBDA`, always with where it came from) and
:func:`checkpoint_default_refine` its default test-time refinement steps;
:func:`model_default_lambda` and :func:`model_default_refine` give those of a loaded model (what
:func:`hyperreg.apps.models.resolve_model` recorded on it, or its bundled card's);
:func:`pair_lambda` turns a request (a number, ``"auto"`` or None) into one pair's λ and
:func:`pair_refinement` a refinement request (steps, :class:`DefaultSteps` or None) into the
refinement it runs. Nothing here loads a model; :mod:`hyperreg.apps.models` (finding and loading
models) re-exports every public name. Errors are :class:`~hyperreg._errors.InputError` naming
the caller's argument. Must not import training, apps or cli.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperreg._errors import InputError
from hyperreg.pretrained import BundledModel, bundled_models

__all__ = [
    "AUTO",
    "FALLBACK_LAMBDA",
    "ChosenLambda",
    "DefaultLambda",
    "DefaultRefine",
    "DefaultSteps",
    "check_lambda",
    "checkpoint_default_lambda",
    "checkpoint_default_refine",
    "model_default_lambda",
    "model_default_refine",
    "pair_lambda",
    "pair_refinement",
]

AUTO = "auto"
"""The λ request that chooses λ per pair without labels (:func:`pair_lambda`)."""

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


@dataclass(frozen=True)
class DefaultSteps:
    """Refinement settings without a step count: the model's default number of steps
    (:func:`model_default_refine`) with this similarity and learning rate (what
    ``--refine-sim`` or ``--refine-lr`` without ``--refine`` asks for).

    Attributes:
        sim: A refinement similarity, or None for the model's own
            (:class:`~hyperreg.registration.refine.Refinement`).
        lr: Adam learning rate, or None for the library's.
    """

    sim: str | None = None
    lr: float | None = None


def pair_refinement(model: Any, refine: Any) -> Any:
    """The :class:`~hyperreg.registration.refine.Refinement` to register with: ``refine``
    itself; for None the model's default steps (:func:`model_default_refine`) with the
    library's settings; for :class:`DefaultSteps` those steps with its settings. Returns None
    when that is 0 steps.

    Raises:
        InputError: If ``refine`` is a :class:`DefaultSteps` and the model refines no steps by
            default (argument ``refine``), or its settings are invalid.
    """
    from hyperreg.registration.refine import Refinement, check_refinement

    if refine is None or isinstance(refine, DefaultSteps):
        steps = model_default_refine(model).steps
        if not steps and refine is not None:
            raise InputError(
                "pair_refinement",
                "give {0} a number of steps: the model refines none by default, so a "
                "similarity or learning rate alone would change nothing",
                "refine",
            )
        if not steps:
            return None
        given = refine or DefaultSteps()
        options = {} if given.lr is None else {"lr": given.lr}
        refine = Refinement(steps=steps, sim=given.sim, **options)
        check_refinement("pair_refinement", refine)
    return refine if refine.steps > 0 else None


def check_lambda(fn: str, lam: Any, argument: str = "lam") -> None:
    """``lam`` is a number in [0, 1], ``"auto"`` or None.

    Raises:
        InputError: Otherwise (NaN, out of range, another word); ``argument`` is stored.
    """
    if lam is None or lam == AUTO:
        return
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not 0.0 <= lam <= 1.0:
        raise InputError(
            fn, "{0} must be a number in [0, 1], 'auto' or None, got {lam!r}", argument, lam=lam
        )


@dataclass(frozen=True)
class ChosenLambda:
    """The λ one pair is registered at, and why.

    Attributes:
        lam: λ in [0, 1].
        reason: One line: ``"given"``, the model's default and its source, or the label-free
            rule's reason (``auto``).
        auto: The :class:`~hyperreg.registration.autolambda.AutoLambda` of ``"auto"``, else
            None.
    """

    lam: float
    reason: str
    auto: Any = None


def pair_lambda(prepared: Any, model: Any, lam: float | str | None) -> ChosenLambda:
    """The λ to register ``prepared`` at: ``lam`` itself, the model's default
    (:func:`model_default_lambda`) for None, or for ``"auto"`` the label-free choice of
    :func:`hyperreg.registration.autolambda.auto_lambda` (one batched sweep over its grid).

    Args:
        prepared: A :class:`~hyperreg.registration.pipeline.PreparedPair`.
        model: The model that registers it.
        lam: A number in [0, 1], ``"auto"`` or None.

    Raises:
        InputError: If ``lam`` is none of those (``argument`` ``"lam"``).
    """
    check_lambda("pair_lambda", lam)
    if lam == AUTO:
        from hyperreg.registration.autolambda import auto_lambda

        pick = auto_lambda(prepared, model)
        return ChosenLambda(pick.lam, f"auto: {pick.reason}", pick)
    if lam is None:
        default = model_default_lambda(model)
        return ChosenLambda(default.lam, f"the model's default λ, from {default.source}")
    return ChosenLambda(float(lam), "given")
