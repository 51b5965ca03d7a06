"""HyperMorph training: λ per sample, loss (1 − λ)·similarity + λ·smoothness, checkpoints, logs.

``train(config)`` draws pairs from a :class:`~hyperreg.training.data.PairSampler` (or any
object with the same ``sample(batch_size, generator)`` method), draws one λ per sample, and
minimises the batch mean of each sample's own loss ``(1 − λ_i)·L_sim,i + λ_i·L_smooth,i`` with
Adam. It writes into ``config.out``: ``train_log.csv``, ``checkpoint_<step>.pt`` (model +
optimiser + every random state, the newest ``keep_checkpoints`` kept; see
:mod:`hyperreg.training.checkpointing`), ``model.pt``, ``config.json``, and with validation
``val_log.csv``, ``best.pt`` and ``split.json``.
``train(config, resume=DIR)`` continues exactly where the newest checkpoint in ``DIR`` stopped;
``config.init`` starts from a pretrained model's weights instead (fine-tuning). SIGTERM or
SIGINT during training writes a checkpoint after the step in flight and raises
:class:`~hyperreg.training.checkpointing.TrainingInterrupted`. ``config.data`` may name several
sources; they are split by person, pairs are drawn within each source, and a share
``config.synth`` of the pairs is synthesised from label maps (:mod:`hyperreg.training.synth`).
Under ``torchrun`` it trains with DistributedDataParallel (see
:mod:`hyperreg.training.distributed`); only rank 0 writes. Seeds are set from the config, never
at import. What it trains on comes from :mod:`hyperreg.training.prepare` (split, samplers,
validation pairs); the steps, logs, validation and checkpoints are a
:class:`~hyperreg.training.loop.TrainingLoop`. Validation goes through
:mod:`hyperreg.training.validation` (which reuses the inference code). Must not import cli.

References:
    Hoopes et al., HyperMorph, IPMI 2021 / MELBA 2022 (amortised λ training).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from hyperreg._files import write_json
from hyperreg.config import TrainConfig, to_dict
from hyperreg.method.model import RegistrationOutput, load_checkpoint
from hyperreg.method.objective import LABEL_LOSSES, Objective
from hyperreg.method.similarities import TRAIN_SIMILARITIES
from hyperreg.training import distributed
from hyperreg.training.checkpointing import init_from_model
from hyperreg.training.holdout import ValidationPair
from hyperreg.training.loop import TrainingLoop
from hyperreg.training.prepare import PairSource, prepare_data
from hyperreg.training.steplog import StepStats, read_every

__all__ = [
    "SIMILARITIES",
    "PairSource",
    "hypermorph_loss",
    "init_settings",
    "prepare_data",
    "train",
    "training_objective",
]

logger = logging.getLogger(__name__)

SIMILARITIES = TRAIN_SIMILARITIES  # the registry, hyperreg.method.similarities


def training_objective(config: TrainConfig) -> Objective:
    """The :class:`~hyperreg.method.objective.Objective` a run trains on: its similarity
    (``sim``, ``ncc_window``, ``mse_sigma``), label term (``label_loss``, ``label_weight``) and
    the regulariser scale of its model (``int_downsize`` for a half-resolution velocity). The
    trained model carries it (``model.objective``) into its checkpoint."""
    model = config.model
    return Objective(
        similarity=config.sim,
        ncc_window=config.ncc_window,
        mse_sigma=config.mse_sigma,
        label_loss=config.label_loss,
        label_weight=config.label_weight,
        int_downsize=model.int_downsize if model.int_steps > 0 else 1,
        label_downsize=config.label_downsize,
    )


def hypermorph_loss(
    out: RegistrationOutput, fixed: Tensor, lam: Tensor, config: TrainConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Batch loss of image pairs with each sample weighted by its own λ.

    A shorthand for :func:`training_objective` on pairs without label maps (the objective
    itself is in :mod:`hyperreg.method.objective`, written once).

    Args:
        out: Model output for the batch.
        fixed: ``(B, C, *S)`` fixed images.
        lam: ``(B,)`` λ per sample.
        config: Supplies the objective's settings.

    Returns:
        ``(loss, similarity, smoothness)``: the scalar to minimise, ``mean_i((1 − λ_i)·sim_i +
        λ_i·k·smooth_i)``, and the two per-sample terms ``(B,)`` for logging.
    """
    field = out.velocity if out.velocity is not None else out.disp
    terms = training_objective(config)(out.moved, fixed, field, lam)
    return terms.loss, terms.similarity, terms.smoothness


def _validate(config: TrainConfig) -> None:
    if config.sim not in SIMILARITIES:
        raise ValueError(f"train(): 'sim' must be one of {SIMILARITIES}, got {config.sim!r}")
    if config.label_loss not in LABEL_LOSSES:
        raise ValueError(
            f"train(): 'label_loss' must be one of {LABEL_LOSSES}, got {config.label_loss!r}"
        )
    if config.conform and not config.shape:
        raise ValueError("train(): 'conform' needs a training grid 'shape' (e.g. 96 112 96)")
    if config.max_labels < 1:
        raise ValueError(f"train(): 'max_labels' must be >= 1, got {config.max_labels}")
    for name in ("steps", "batch_size", "checkpoint_every", "holdout_every", "val_max_pairs"):
        if getattr(config, name) < 1:
            raise ValueError(f"train(): '{name}' must be >= 1, got {getattr(config, name)}")
    for name in ("keep_checkpoints", "val_every"):
        if getattr(config, name) < 0:
            raise ValueError(f"train(): '{name}' must be >= 0, got {getattr(config, name)}")
    if not config.lr > 0:
        raise ValueError(f"train(): 'lr' must be > 0, got {config.lr}")
    if not config.val_lambdas or not all(0.0 <= lam <= 1.0 for lam in config.val_lambdas):
        raise ValueError(
            f"train(): 'val_lambdas' must be values in [0, 1], got {config.val_lambdas}"
        )


def train(
    config: TrainConfig,
    pairs: PairSource | None = None,
    progress: bool = True,
    *,
    val_pairs: list[ValidationPair] | None = None,
    resume: str | os.PathLike[str] | None = None,
    record: dict[str, Any] | None = None,
) -> Path:
    """Train a HyperMorph model and return the path of the final checkpoint.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) each process trains with DistributedDataParallel on
    ``config.batch_size`` pairs per step (the global batch is ``world_size × batch_size``) and
    only rank 0 writes files.

    Args:
        config: Run settings; ``config.data`` is read unless ``pairs`` is given.
        pairs: Optional pair source (for in-memory data such as the demo's).
        progress: Show a tqdm progress bar.
        val_pairs: Optional validation pairs (else taken from ``config.data`` as configured).
        resume: Run folder to continue from: its newest ``checkpoint_*.pt`` restores model,
            optimiser, step and every random state, then training runs to ``config.steps``.
            A fine-tuning run (``config.init``) keeps its model's voxel size, orientation,
            training grid and step count where the config sets none (see
            ``_keep_init_settings``); every checkpoint records ``total_steps``.
        record: More entries written into every checkpoint of the run (e.g.
            ``default_lambda``, ``default_refine`` and their notes, which
            :mod:`hyperreg.apps.models` reads).

    Returns:
        ``Path(config.out) / "model.pt"``.

    Raises:
        ValueError: On invalid settings or data (see :class:`~hyperreg.training.data.PairSampler`),
            or a checkpoint to resume that does not fit this run.
        FileNotFoundError: If ``config.data`` does not exist, or ``resume`` holds no checkpoint.
        RuntimeError: If the loss becomes non-finite.
    """
    config = _keep_init_settings(config, resume)
    config = config.resolved()  # lr 0 -> DEFAULT_LR[ndim]; model.spacing = spacing
    _validate(config)
    context, device = distributed.setup(config.device)
    try:
        final = _run(config, pairs, progress, val_pairs, resume, context, device, record)
    except BaseException:
        if context.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        raise
    distributed.cleanup(context)
    return final


def init_settings(config: TrainConfig) -> dict[str, Any]:
    """What a fine-tuning run (``config.init``) keeps of its model where the config sets
    nothing else: the voxel size (``spacing`` 0: a model trained at 1 mm is fine-tuned at
    1 mm, not at the data's own voxels), the storage orientation (``conform``), the training
    grid (``shape`` empty: the grid of the model's own run, from its ``train_config``), and
    its step count (``init_steps`` 0: the model's steps in all, see
    :func:`~hyperreg.pretrained.checkpoint_total_steps`).

    Returns:
        The changes, ``{field: value}`` ({} without ``init`` or when the config sets all).

    Raises:
        FileNotFoundError, ValueError, RuntimeError: As
            :func:`~hyperreg.method.model.load_checkpoint` for ``config.init``.
    """
    if not config.init:
        return {}
    from hyperreg.pretrained import checkpoint_total_steps

    model, payload = load_checkpoint(config.init)
    stored = model.config
    changes: dict[str, Any] = {}
    if stored.spacing and not config.spacing:
        changes["spacing"] = float(stored.spacing)
    if stored.orientation and config.model.ndim == 3 and not config.conform:
        changes["conform"] = True
    grid = (payload.get("train_config") or {}).get("shape")
    if not config.shape and grid and len(grid) == stored.ndim:
        changes["shape"] = tuple(int(n) for n in grid)
    if not config.init_steps:
        changes["init_steps"] = checkpoint_total_steps(payload, config.init)
    return changes


def _keep_init_settings(config: TrainConfig, resume: str | os.PathLike[str] | None) -> TrainConfig:
    """``config`` with :func:`init_settings` applied (logged); a resumed run counts its steps
    on from the ``init_steps`` its start recorded (``config.json``)."""
    if resume is not None:
        stored_run = Path(resume) / "config.json"
        if config.init and not config.init_steps and stored_run.is_file():
            steps = json.loads(stored_run.read_text()).get("init_steps", 0)
            return dataclasses.replace(config, init_steps=int(steps or 0))
        return config
    changes = init_settings(config)
    shown = {key: value for key, value in changes.items() if key != "init_steps"}
    if shown:
        logger.info("fine-tuning '%s' at its own settings %s", config.init, shown)
    return dataclasses.replace(config, **changes) if changes else config


def _run(
    config: TrainConfig,
    pairs: PairSource | None,
    progress: bool,
    val_pairs: list[ValidationPair] | None,
    resume: str | os.PathLike[str] | None,
    context: distributed.DistributedContext,
    device: torch.device,
    record: dict[str, Any] | None = None,
) -> Path:
    """The run once set up: its data and files, then a :class:`TrainingLoop` from the start,
    a checkpoint (``resume``) or a pretrained model (``config.init``)."""
    pairs, val_pairs, val_every = _training_data(config, pairs, val_pairs, context.is_main)
    # one host read per block of steps on a GPU, so the CPU queues ahead (steplog)
    step_stats = StepStats(read_every(device))
    objective = training_objective(config)
    loop = TrainingLoop(config, objective, context, device, step_stats, record)
    if resume is not None:
        loop.resume(resume)
    elif config.init:
        init_from_model(config.init, loop.model)
        logger.info(
            "fine-tuning from %s: %d steps in all before this run, %d after it",
            config.init,
            config.init_steps,
            config.init_steps + config.steps,
        )
    return loop.run(pairs, val_pairs, val_every, progress)


def _training_data(
    config: TrainConfig,
    pairs: PairSource | None,
    val_pairs: list[ValidationPair] | None,
    main: bool,
) -> tuple[PairSource, list[ValidationPair], int]:
    """``(pairs, validation pairs, val_every)`` of the run: ``config.data`` prepared unless
    ``pairs`` is given; validation at each checkpoint when ``val_every`` is 0 and there are
    held-out people (or given validation pairs). Rank 0 writes ``config.json`` and
    ``split.json``."""
    record = None
    if pairs is None:
        pairs, loaded, record = prepare_data(config, load_validation=main)
        val_pairs = loaded if val_pairs is None else val_pairs
    val_pairs = list(val_pairs or [])
    val_every = config.val_every
    if val_every == 0 and val_pairs and (record is None or record["mode"] == "subjects"):
        val_every = config.checkpoint_every
    if main:
        out_dir = Path(config.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "config.json", to_dict(config), indent=2)
        if record is not None:
            write_json(out_dir / "split.json", record, indent=2)
    return pairs, val_pairs, val_every
