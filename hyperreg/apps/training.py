"""Training runs as a user starts them: a new model, a run continued, or a model fine-tuned.

:func:`train_model` is what ``hyperreg train`` calls: it resolves the model to start from (a
bundled name, a checkpoint or a run folder, :func:`init_model`), keeps what that model was
where the caller asks for nothing else (architecture, training grid, voxel size, orientation,
objective with its label term, network passes, flip averaging, step count, default λ and
refinement), trains (:func:`hyperreg.training.train.train`), and writes a model card beside
the checkpoint (:func:`write_model_card`). The defaults a trained model registers with travel
in its checkpoint (``default_lambda``, ``default_refine`` and their notes), where
:mod:`hyperreg.apps.models` reads them. Must not import cli.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperreg._errors import InputError
from hyperreg.apps.models import (
    DefaultLambda,
    DefaultRefine,
    checkpoint_default_lambda,
    checkpoint_default_refine,
    model_architecture,
    model_file,
)
from hyperreg.pretrained import bundled_models, checkpoint_total_steps

__all__ = [
    "CARD_FILE",
    "KEEP",
    "OBJECTIVE_SETTINGS",
    "VALIDATION",
    "InitModel",
    "TrainedModel",
    "init_model",
    "train_model",
    "write_model_card",
]

CARD_FILE = "model.md"
"""The model card written beside a run's ``model.pt``."""
KEEP = "keep"
"""Default-λ request: the init model's own default λ."""
VALIDATION = "validation"
"""Default-λ request: the λ of best validation Dice of the trained model (its final step)."""

# TrainConfig fields of the objective -> where an init model records them: its objective
# (the checkpoint's "objective") or its run's train_config
OBJECTIVE_SETTINGS = {
    "sim": ("objective", "similarity"),
    "mse_sigma": ("objective", "mse_sigma"),
    "label_loss": ("objective", "label_loss"),
    "label_weight": ("objective", "label_weight"),
    "label_downsize": ("objective", "label_downsize"),
    "max_labels": ("train_config", "max_labels"),
}


@dataclass(frozen=True)
class InitModel:
    """The model a run fine-tunes (:func:`init_model`).

    Attributes:
        path: Its checkpoint file.
        name: The bundled model's name, else the file.
        config: Its :class:`~hyperreg.config.ModelConfig` (architecture, passes, flips).
        payload: Its checkpoint entries other than the weights (``objective``,
            ``train_config``, ``step``, ...).
        total_steps: Optimiser steps its weights had in all.
        default_lambda: The λ it registers at when none is asked for.
        default_refine: The refinement steps it runs when none are asked for.
    """

    path: Path
    name: str
    config: Any
    payload: dict[str, Any]
    total_steps: int
    default_lambda: DefaultLambda
    default_refine: DefaultRefine

    def setting(self, name: str) -> Any:
        """The value of the objective setting ``name`` (a key of :data:`OBJECTIVE_SETTINGS`)
        this model was trained with, or None when it records none."""
        where, key = OBJECTIVE_SETTINGS[name]
        recorded = self.payload.get(where)
        return recorded.get(key) if isinstance(recorded, dict) else None


def init_model(spec: str | os.PathLike[str], argument: str = "init") -> InitModel:
    """The model ``spec`` names (a bundled name, a checkpoint, or a run folder holding
    ``model.pt``), read on the CPU with what it registers and trains with.

    Raises:
        InputError: If ``spec`` names nothing usable or not a hyperreg checkpoint (the error
            carries ``argument``).
        RuntimeError: If the checkpoint's format is unknown or its weights do not match its
            config.
    """
    from hyperreg.apps.models import resolve_model

    resolved = resolve_model(model_file(spec, argument), "cpu", argument=argument)
    path = resolved.path
    import torch

    payload = torch.load(path, map_location="cpu", weights_only=True)
    payload = {key: value for key, value in payload.items() if key != "state_dict"}
    bundled = next(
        (m.name for m in bundled_models() if m.path.resolve() == path.resolve()), str(path)
    )
    return InitModel(
        path=path,
        name=bundled,
        config=resolved.model.config,
        payload=payload,
        total_steps=checkpoint_total_steps(payload, path),
        default_lambda=checkpoint_default_lambda(payload, path),
        default_refine=checkpoint_default_refine(path, payload),
    )


@dataclass(frozen=True)
class TrainedModel:
    """Output of :func:`train_model`.

    Attributes:
        path: The final checkpoint (``model.pt``).
        card: The model card written beside it.
        config: Its :class:`~hyperreg.config.ModelConfig` (passes, flip averaging).
        steps: Steps of this run (its last step).
        total_steps: Optimiser steps its weights had in all (counting the init model's).
        init: The model it was fine-tuned from, or None.
        default_lambda: The λ it registers at when none is asked for, and why.
        default_refine: The refinement it runs when none is asked for, and why.
        kept: The settings taken from the init model because none were asked for
            (``{TrainConfig field or "passes"/"flip_average": value}``).
        validation: The final weights' validation row (Dice per λ), or None.
        validation_lambda: The λ of best validation Dice in that row (what
            ``default_lambda`` :data:`VALIDATION` would choose), or None without one.
    """

    path: Path
    card: Path
    config: Any
    steps: int
    total_steps: int
    init: InitModel | None
    default_lambda: DefaultLambda
    default_refine: DefaultRefine
    kept: dict[str, Any]
    validation: dict[str, Any] | None
    validation_lambda: DefaultLambda | None = None


def _defaults_record(
    init: InitModel | None,
    resume: str | os.PathLike[str] | None,
    default_lambda: float | str | None,
    default_refine: int | None,
) -> dict[str, Any]:
    """The ``default_lambda`` / ``default_refine`` entries (and notes) every checkpoint of
    the run records: asked for, the init model's (kept), or on resume the run's own."""
    record: dict[str, Any] = {}
    if resume is not None:  # the run's own, unless asked for anew
        from hyperreg.training.checkpointing import latest_checkpoint

        stored = _entries(latest_checkpoint(resume))
        keys = ("default_lambda", "default_lambda_note", "default_refine", "default_refine_note")
        record = {key: stored[key] for key in keys if key in stored}
    if default_lambda is None:
        default_lambda = KEEP if init is not None else None
    if default_lambda == KEEP:
        if init is None:
            raise InputError(
                "train_model",
                "'keep' keeps the default λ of the model fine-tuned, and none is given ({1})",
                "default_lambda",
                "init",
            )
        record["default_lambda"] = init.default_lambda.lam
        source = init.default_lambda.source
        record["default_lambda_note"] = f"{init.name} (kept at fine-tuning): {source}"
    elif default_lambda == VALIDATION:
        for key in ("default_lambda", "default_lambda_note"):
            record.pop(key, None)
    elif default_lambda is not None:
        lam = default_lambda
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam <= 1:
            raise InputError(
                "train_model",
                "{0} must be a λ in [0, 1], 'keep' or 'validation', got {lam!r}",
                "default_lambda",
                lam=lam,
            )
        record["default_lambda"] = float(lam)
        record["default_lambda_note"] = "given when the model was trained"
    if default_refine is not None:
        if isinstance(default_refine, bool) or not 0 <= int(default_refine) <= 10000:
            raise InputError(
                "train_model",
                "{0} must be a number of steps in [0, 10000], got {steps!r}",
                "default_refine",
                steps=default_refine,
            )
        record["default_refine"] = int(default_refine)
        record["default_refine_note"] = "given when the model was trained"
    elif init is not None and resume is None:
        record["default_refine"] = init.default_refine.steps
        source = init.default_refine.source.removeprefix("refinement: ").split(", ", 1)[-1]
        record["default_refine_note"] = f"from {init.name} (kept at fine-tuning): {source}"
    return record


def _entries(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's entries other than its weights."""
    import torch

    payload = torch.load(path, map_location="cpu", weights_only=True)
    return {key: value for key, value in payload.items() if key != "state_dict"}


def _inference_settings(
    model: Any, init: InitModel | None, passes: int | None, flip_average: bool | None, conform: bool
) -> tuple[Any, dict[str, Any]]:
    """``model`` (a ModelConfig) with the passes and flip averaging asked for; without a
    request, an init model's are kept (they come with its config). Returns the config and
    what was kept."""
    kept: dict[str, Any] = {}
    if init is not None and passes is None:
        kept["passes"] = model.passes
    if init is not None and flip_average is None:
        kept["flip_average"] = model.flip_average
    changes: dict[str, Any] = {}
    if passes is not None:
        if isinstance(passes, bool) or not 1 <= int(passes) <= 4:
            raise InputError("train_model", "{0} must be 1 to 4, got {n!r}", "passes", n=passes)
        changes["passes"] = int(passes)
    if flip_average is not None:
        changes["flip_average"] = bool(flip_average)
        orientation = model.orientation or ("RAS" if conform and model.ndim == 3 else "")
        if flip_average and not orientation:
            raise InputError(
                "train_model",
                "flip averaging needs a model that records its orientation: a 3D run with "
                "{1}, or an init model that records one",
                "flip_average",
                "conform",
            )
        changes["orientation"] = orientation
    return dataclasses.replace(model, **changes), kept


def train_model(
    settings: dict[str, Any],
    *,
    init: str | os.PathLike[str] = "",
    resume: str | os.PathLike[str] | None = None,
    architecture: dict[str, Any] | None = None,
    passes: int | None = None,
    flip_average: bool | None = None,
    default_lambda: float | str | None = None,
    default_refine: int | None = None,
    progress: bool = True,
) -> TrainedModel:
    """Train a model, continue a run, or fine-tune a model, keeping what it was.

    With ``init`` (fine-tuning), every setting not asked for is the init model's: its
    architecture, voxel size, storage orientation and training grid
    (:func:`hyperreg.training.train.init_settings`), its objective with its label term
    (``settings`` values of None for the keys of :data:`OBJECTIVE_SETTINGS`), its network
    passes and flip averaging, its default λ and refinement, and its step count (the new
    checkpoints' ``total_steps`` count on from its steps in all). Without ``init`` a None
    objective setting takes :class:`~hyperreg.config.TrainConfig`'s default.

    Args:
        settings: :class:`~hyperreg.config.TrainConfig` fields (not ``model``, ``init``);
            objective settings may be None (not asked for).
        init: The model to fine-tune: a bundled name, a checkpoint or a run folder; "" for a
            new model (or the run continued).
        resume: A run folder to continue (its newest checkpoint; ``settings`` are the run's).
        architecture: ``ndim``, ``int_steps``, ``parametrization`` asked for (None values
            not asked for); a fine-tuned or resumed model's must match them.
        passes: Network passes the model runs by default (1-4), or None.
        flip_average: Test-time flip averaging on or off, or None.
        default_lambda: The λ the model registers at by default: a number in [0, 1],
            :data:`KEEP` (the init model's; the default with ``init``) or :data:`VALIDATION`
            (the best validation Dice of the final weights; the default without ``init``, and
            the fallback λ when the run does not validate, said so).
        default_refine: Refinement steps the model runs by default, or None (the init
            model's; none for a new model).
        progress: Show a progress bar.

    Returns:
        A :class:`TrainedModel`.

    Raises:
        InputError: If ``init`` names nothing usable, an architecture field differs from the
            model's, or ``passes``, ``flip_average``, ``default_lambda`` or
            ``default_refine`` is invalid.
        ValueError, FileNotFoundError, RuntimeError: As
            :func:`hyperreg.training.train.train`.
    """
    from hyperreg.config import TrainConfig
    from hyperreg.training.checkpointing import latest_checkpoint
    from hyperreg.training.train import init_settings, train

    fine_tuned = init_model(init) if init and resume is None else None
    source = latest_checkpoint(resume) if resume is not None else None
    if fine_tuned is not None:
        source = fine_tuned.path
    model = model_architecture(source, **(architecture or {}))
    values = dict(settings)
    kept: dict[str, Any] = {}
    for name in OBJECTIVE_SETTINGS:
        if values.get(name) is None:
            own = fine_tuned.setting(name) if fine_tuned is not None else None
            if own is not None:
                kept[name] = own
            values[name] = own if own is not None else _default(TrainConfig, name)
    conform = bool(values.get("conform"))
    model, inference = _inference_settings(model, fine_tuned, passes, flip_average, conform)
    kept.update(inference)
    record = _defaults_record(fine_tuned, resume, default_lambda, default_refine)
    init_path = str(fine_tuned.path) if fine_tuned is not None else str(values.pop("init", ""))
    values.pop("init", None)
    config = TrainConfig(**values, init=init_path, model=model)
    if resume is None:
        changes = init_settings(config)
        kept.update({k: v for k, v in changes.items() if k != "init_steps"})
        config = dataclasses.replace(config, **changes)
    final = train(config, resume=resume, progress=progress, record=record)
    return _trained(final, fine_tuned, kept)


def _plain(value: Any) -> str:
    """A setting as a user would type it (a grid as 96x112x96)."""
    if isinstance(value, (tuple, list)):
        return "x".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default(cls: Any, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _trained(final: Path, init: InitModel | None, kept: dict[str, Any]) -> TrainedModel:
    """The :class:`TrainedModel` of the checkpoint ``final``, its card written."""
    from hyperreg.method.model import load_checkpoint

    model, payload = load_checkpoint(final)
    validation = payload.get("validation") if isinstance(payload.get("validation"), dict) else None
    trained = TrainedModel(
        path=final,
        card=final.with_name(CARD_FILE),
        config=model.config,
        steps=int(payload.get("step", 0)),
        total_steps=checkpoint_total_steps(payload, final),
        init=init,
        default_lambda=checkpoint_default_lambda(payload, final),
        default_refine=checkpoint_default_refine(final, payload),
        kept=kept,
        validation=validation,
        validation_lambda=_validation_lambda(validation, final, payload.get("step")),
    )
    write_model_card(trained, payload)
    return trained


def _validation_lambda(row: dict[str, Any] | None, path: Path, step: Any) -> DefaultLambda | None:
    """The λ of best Dice in the validation row of ``path`` at ``step`` (None without a row
    or a finite Dice)."""
    scores = [
        value
        for key, value in (row or {}).items()
        if str(key).startswith("dice_") and isinstance(value, (int, float)) and math.isfinite(value)
    ]
    found = {"validation": row, "step": step}
    return checkpoint_default_lambda(found, path) if scores else None


def _people(folder: Path) -> dict[str, list[str]]:
    """``{"train", "val", "test"}`` person ids of the run's ``split.json`` ({} without)."""
    split = folder / "split.json"
    if not split.is_file():
        return {}
    record = json.loads(split.read_text())
    return {key: list(record.get(key) or []) for key in ("train", "val", "test")}


def write_model_card(trained: TrainedModel, payload: dict[str, Any]) -> Path:
    """Write the Markdown model card of ``trained`` (``trained.card``, atomically): file,
    steps (this run's, in all, and what it was fine-tuned from), data and people (trained on,
    validated on, held out for testing, from ``split.json``), objective, the defaults it
    registers with and why, and the validation Dice of its final weights per λ.

    Returns:
        ``trained.card``.
    """
    from hyperreg._files import atomic_write

    run = payload.get("train_config") or {}
    objective = payload.get("objective") or {}
    people = _people(trained.path.parent)
    config = trained.config
    lines = [f"# Model card: {trained.path.parent.name}/{trained.path.name}", "", "| | |"]
    lines.append("| --- | --- |")
    steps = f"{trained.steps} in this run"
    if trained.init is not None:
        steps += (
            f", fine-tuned from {trained.init.name} ({trained.init.total_steps} steps in all); "
            f"{trained.total_steps} in all"
        )
    data = run.get("data")
    data = ", ".join(data) if isinstance(data, list) else str(data or "not recorded")
    rows = [
        ("file", f"`{trained.path}`"),
        ("steps", steps),
        ("data", data),
    ]
    for key, label in (("train", "trained on"), ("val", "validated on"), ("test", "test")):
        if key in people:
            names = people[key]
            rows.append((f"people {label} ({len(names)})", ", ".join(names) or "none"))
    if not people:
        rows.append(("people", "not recorded (no split.json beside the model)"))
    label = objective.get("label_loss", "none")
    label_text = (
        "none"
        if label == "none"
        else f"{label}, weight {objective.get('label_weight')}, at most {run.get('max_labels')} "
        f"labels per pair, grid {objective.get('label_downsize')}x coarser"
    )
    rows += [
        ("objective", f"similarity {objective.get('similarity')}; label term {label_text}"),
        ("grid", _grid_text(run, config)),
        ("default λ", f"{trained.default_lambda.lam:g}: {trained.default_lambda.source}"),
        ("default refinement", trained.default_refine.source.removeprefix("refinement: ")),
        ("default passes", str(config.passes)),
        ("default flip averaging", "on" if config.flip_average else "off"),
    ]
    if trained.kept:
        kept = ", ".join(f"{k} {_plain(v)}" for k, v in trained.kept.items())
        rows.append(("kept from the init model", kept))
    lines += [f"| {key} | {value} |" for key, value in rows]
    lines += ["", "## Validation of the final weights", ""]
    lines += _validation_lines(trained.validation)
    text = "\n".join(lines) + "\n"
    atomic_write(trained.card, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return trained.card


def _grid_text(run: dict[str, Any], config: Any) -> str:
    shape = run.get("shape")
    grid = " x ".join(str(n) for n in shape) if shape else "the largest scan per axis"
    spacing = f"{config.spacing:g} mm" if config.spacing else "the scans' own voxels"
    orientation = f", {config.orientation} storage order" if config.orientation else ""
    return f"{grid} at {spacing}{orientation}"


def _validation_lines(row: dict[str, Any] | None) -> list[str]:
    if row is None:
        return ["Not measured: the run held out no validation people (or never validated)."]
    lams = sorted(float(key[5:]) for key in row if key.startswith("dice_") and _is_number(key[5:]))
    lines = ["| λ | mean Dice | folding % |", "| --- | --- | --- |"]
    for lam in lams:
        dice = row.get(f"dice_{lam:g}")
        fold = row.get(f"folding_pct_{lam:g}")
        lines.append(f"| {lam:g} | {_number(dice, 4)} | {_number(fold, 3)} |")
    return lines


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _number(value: Any, digits: int) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.{digits}f}"
    return "not measured"
