"""HyperMorph training: λ per sample, loss (1 − λ)·similarity + λ·smoothness, checkpoints, logs.

``train(config)`` draws pairs from a :class:`~hyperreg.training.data.PairSampler` (or any object
with the
same ``sample(batch_size, generator)`` method), draws one λ per sample, and minimises the batch
mean of each sample's own loss ``(1 − λ_i)·L_sim,i + λ_i·L_smooth,i`` with Adam. It writes into
``config.out``: ``train_log.csv``, ``checkpoint_<step>.pt`` (model + optimiser + every random
state, the newest ``keep_checkpoints`` kept; see :mod:`hyperreg.training.checkpointing`),
``model.pt``, ``config.json``, and with validation ``val_log.csv``, ``best.pt`` and ``split.json``.
``train(config, resume=DIR)`` continues exactly where the newest checkpoint in ``DIR`` stopped;
``config.init`` starts from a pretrained model's weights instead (fine-tuning). SIGTERM or
SIGINT during training writes a checkpoint after the step in flight and raises
:class:`~hyperreg.training.checkpointing.TrainingInterrupted`. ``config.data`` may name several
sources; they are split by person, pairs are drawn within each source, and a share
``config.synth`` of the pairs is synthesised from label maps (:mod:`hyperreg.training.synth`).
Under ``torchrun`` it trains with DistributedDataParallel (see
:mod:`hyperreg.training.distributed`);
only rank 0 writes. Seeds are set here from the config, never at import. Validation goes
through :mod:`hyperreg.training.validation` (which reuses the inference code). Must not import cli.

References:
    Hoopes et al., HyperMorph, IPMI 2021 / MELBA 2022 (amortised λ training).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm.auto import tqdm

from hyperreg._files import write_json
from hyperreg.training import distributed
from hyperreg.training.checkpointing import (
    StopSignals,
    TrainingInterrupted,
    init_from_model,
    resume_training,
    save_training_checkpoint,
    slim_old_checkpoints,
)
from hyperreg.config import TrainConfig, to_dict
from hyperreg.training.data import (
    LambdaSampler,
    MixtureSampler,
    PairSampler,
    ValidationPair,
    batch_of,
    split_people,
    validation_pairs,
)
from hyperreg.training.sources import (
    Scan,
    find_scans,
    label_map_scans,
    scan_shape,
    training_shape,
)
from hyperreg.training.synth import SynthPairSampler, label_maps_from_scans
from hyperreg.method.objective import LABEL_LOSSES, Objective
from hyperreg.method.model import HyperMorph, RegistrationOutput, load_checkpoint, save_checkpoint
from hyperreg.training.steplog import (
    LOG_COLUMNS,
    StepStats,
    open_log,
    open_tensorboard,
    read_every,
)
from hyperreg.training.validation import evaluate, validation_columns

__all__ = [
    "SIMILARITIES",
    "PairSource",
    "hypermorph_loss",
    "prepare_data",
    "train",
    "training_objective",
]

logger = logging.getLogger(__name__)

SIMILARITIES = ("ncc", "mse")


class PairSource(Protocol):
    """Anything that yields training pairs ``(moving, fixed)``, each ``(B, 1, *S)``."""

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]: ...


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


def _subject_pairs(scans: list[Scan], others: list[Scan], atlas: Scan | None) -> list[tuple]:
    """(moving, fixed) validation pairs: each to the atlas, in a cycle, or to a training scan."""
    if atlas is not None:
        return [(scan, atlas) for scan in scans]
    if len(scans) == 2:
        return [(scans[1], scans[0])]
    if len(scans) > 2:
        return [(scans[(i + 1) % len(scans)], scans[i]) for i in range(len(scans))]
    return [(scans[0], others[0])]


def _sources(config: TrainConfig) -> list[str]:
    """``config.data`` as a list of sources (one string or a tuple of them)."""
    if isinstance(config.data, str):
        return [config.data] if config.data else []
    return [str(source) for source in config.data]


def prepare_data(
    config: TrainConfig, load_validation: bool = True
) -> tuple[PairSource, list[ValidationPair], dict]:
    """Training sampler, validation pairs and the split record (written to split.json).

    What :func:`train` trains and validates on for ``config``; public so that a baseline trained
    by other code (a benchmark's fixed-λ model) sees the same pairs and the same held-out people.

    Every source is split by person (:attr:`~hyperreg.training.sources.Scan.person`); pairs are
    drawn within a source, each pair's source with probability proportional to its training
    scans, and a share ``config.synth`` of the pairs is synthesised from the training people's
    label maps (plus ``config.synth_labels``). ``load_validation=False`` (ranks other than 0)
    records the split but loads no pairs.

    Returns:
        ``(sampler, validation pairs, split record)``; ``sampler.sample(batch, generator)`` gives
        ``(moving, fixed)`` tensors of shape ``(batch, 1, *spatial)``, intensities in [0, 1].

    Raises:
        ValueError: If no source has enough training scans, or ``synth`` finds no label maps.
        FileNotFoundError: If a source does not exist.
    """
    ndim = config.model.ndim
    sources = _sources(config)
    if not sources:
        raise ValueError("train(): 'data' must name at least one source (a folder or CSV list)")
    groups = [find_scans(source, ndim) for source in sources]
    atlas = None
    if config.atlas:
        if len(groups) > 1:
            raise ValueError(f"train(): 'atlas' needs a single data source, got {len(groups)}")
        atlas = Scan(Path(config.atlas), Path(config.atlas_seg) if config.atlas_seg else None)
    min_train = 1 if atlas is not None else 2
    people = sorted({scan.person for scans in groups for scan in scans})
    split = split_people(
        people,
        config.seed,
        holdout=config.holdout,
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
        min_train=min_train,
    )
    train_groups = [[s for s in scans if s.person in split["train"]] for scans in groups]
    val_groups = [[s for s in scans if s.person in split["val"]] for scans in groups]
    record: dict[str, Any] = {"seed": config.seed, **split}
    if config.holdout:
        record["holdout"] = sorted(config.holdout)
    record["sources"] = [
        {
            "data": source,
            "train": [s.name for s in train],
            "val": [s.name for s in val],
            "test": [s.name for s in scans if s.person in split["test"]],
        }
        for source, scans, train, val in zip(sources, groups, train_groups, val_groups)
    ]
    extra_labels = [s for source in config.synth_labels for s in label_map_scans(source, ndim)]
    grid_scans = train_groups + ([[atlas]] if atlas else [])
    grid_scans += [extra_labels] if config.synth > 0 else []
    shape = tuple(config.shape) or training_shape(
        grid_scans, ndim, slice_axis=config.slice_axis, spacing=config.spacing
    )
    if shape:
        record["shape"] = list(shape)
    has_val = any(val_groups)
    holdout = 0 if has_val or config.val_every == 0 or len(groups) > 1 else config.holdout_every
    labelled = config.label_loss != "none" and config.label_weight > 0
    orientation = "RAS" if config.conform and ndim == 3 else ""
    options = {"slice_axis": config.slice_axis, "crop": config.crop, "shape": shape,
               "spacing": config.spacing, "labels": labelled, "orientation": orientation,
               "centre": bool(orientation), "max_labels": config.max_labels}
    samplers: list[PairSampler] = []
    weights: list[float] = []
    if config.synth < 1:
        for source, train in zip(sources, train_groups):
            if len(groups) > 1 and not _pairable(train, ndim, config, atlas):
                warnings.warn(
                    f"train(): source '{source}' has {len(train)} training scan(s), too few for "
                    "pairs; it is used for validation only",
                    stacklevel=4,
                )
                continue
            sampler = PairSampler(
                train, ndim, atlas=atlas.image if atlas else None, holdout_every=holdout,
                **options,
            )
            samplers.append(sampler)
            weights.append(float(len(train)))
        if not samplers:
            raise ValueError("train(): no data source has enough training scans to make pairs")
    sampler: Any = samplers[0] if len(samplers) == 1 else None
    if len(samplers) > 1:
        sampler = MixtureSampler(samplers, weights)
    if config.synth > 0:
        synth = _synth_sampler(config, train_groups, shape, orientation)
        record["synth"] = {"fraction": config.synth, "label_maps": synth[1]}
        sampler = synth[0] if sampler is None else MixtureSampler(
            [sampler, synth[0]], [1.0 - config.synth, config.synth]
        )
    val: list[ValidationPair] = []
    common = {"slice_axis": config.slice_axis, "spacing": config.spacing}
    if orientation:
        common.update(orientation=orientation, shape=shape)
    if has_val:
        record["mode"] = "subjects"
        record["note"] = f"validation on {len(split['val'])} held-out person(s)"
        used = [
            (v, t) for v, t in zip(val_groups, train_groups) if len(v) > 1 or (v and (t or atlas))
        ]
        per_group = max(1, config.val_max_pairs // max(1, len(used)))
        for val_scans, train in used:
            pairs = _subject_pairs(val_scans, train, atlas)
            if load_validation:
                val += validation_pairs(
                    pairs, ndim, slice_every=config.holdout_every, max_pairs=per_group, **common
                )
    elif config.val_every > 0 and len(samplers) == 1:
        train_scans = train_groups[0]
        pairs = _subject_pairs(train_scans, [], atlas) if len(train_scans) > 1 or atlas else []
        common["max_pairs"] = config.val_max_pairs
        if samplers[0].heldout_slices is not None and pairs:
            record["mode"] = "slices"
            record["val_slices"] = samplers[0].heldout_slices.tolist()
            record["note"] = (
                f"only {len(people)} person(s): nothing held out by person; validation on "
                f"every {config.holdout_every}th brain slice along axis {config.slice_axis}, "
                "not used for training (same people as training)"
            )
            if load_validation:
                val = validation_pairs(pairs, ndim, slices=samplers[0].heldout_slices, **common)
        elif pairs:
            record["mode"] = "training-pairs"
            record["note"] = (
                f"only {len(people)} person(s) and no slices to hold out: validation on "
                "training pairs (not held out)"
            )
            if load_validation:
                val = validation_pairs(pairs, ndim, slice_every=config.holdout_every, **common)
        else:
            record["mode"] = "none"
            record["note"] = "no pair to validate on"
    else:
        record["mode"] = "none"
        record["note"] = "validation off (no held-out people and val_every = 0)"
    record["val_pairs"] = [pair.name for pair in val]
    unlabelled = [pair.name for pair in val if pair.moving_seg is None or pair.fixed_seg is None]
    if unlabelled:
        record["val_unlabelled"] = unlabelled
        if load_validation:
            logger.warning(
                "validation: %d of %d pairs have no label map on one side (%s): their Dice is "
                "not computed%s", len(unlabelled), len(val), ", ".join(unlabelled[:3]),
                "; validation scores by similarity" if len(unlabelled) == len(val) else "",
            )
    if load_validation:
        logger.info("data split: %s", record["note"])
    return sampler, val, record


def _synth_sampler(
    config: TrainConfig, train_groups: list[list[Scan]], shape: tuple[int, ...], orientation: str
) -> tuple[Any, int]:
    """Synthetic pairs from the training people's label maps and ``config.synth_labels``:
    one :class:`SynthPairSampler` per source (a source holds one label convention, and the two
    maps of a synthetic pair must share one, or the label term compares unlike ids), mixed in
    proportion to their maps. Returns ``(sampler, number of maps)``."""
    ndim = config.model.ndim
    groups = [train for train in train_groups if train]
    groups += [label_map_scans(source, ndim) for source in config.synth_labels]
    samplers, weights = [], []
    for scans in groups:
        maps = label_maps_from_scans(
            scans, ndim, shape=shape, slice_axis=config.slice_axis, spacing=config.spacing,
            orientation=orientation, centre=bool(orientation),
        )
        if maps:
            samplers.append(
                SynthPairSampler(maps, ndim, crop=config.crop, max_labels=config.max_labels)
            )
            weights.append(float(len(maps)))
    if not samplers:
        raise ValueError(
            "train(): 'synth' needs label maps, but no training scan has one; add label "
            "maps with 'synth_labels' (--synth-labels)"
        )
    count = int(sum(weights))
    return (samplers[0] if len(samplers) == 1 else MixtureSampler(samplers, weights)), count


def _pairable(scans: list[Scan], ndim: int, config: TrainConfig, atlas: Scan | None) -> bool:
    """Whether a source's training scans make pairs: two scans, an atlas, or slices of a volume."""
    if len(scans) >= 2 or (scans and atlas is not None):
        return True
    return bool(scans) and len(scan_shape(scans[0], config.spacing)) > ndim


def train(
    config: TrainConfig,
    pairs: PairSource | None = None,
    progress: bool = True,
    *,
    val_pairs: list[ValidationPair] | None = None,
    resume: str | os.PathLike[str] | None = None,
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
        final = _train(config, pairs, progress, val_pairs, resume, context, device)
    except BaseException:
        if context.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        raise
    distributed.cleanup(context)
    return final


def _keep_init_settings(
    config: TrainConfig, resume: str | os.PathLike[str] | None
) -> TrainConfig:
    """A fine-tuning run (``init``) that does not set a voxel size works at its model's: a
    model trained at 1 mm is fine-tuned at 1 mm, not at the data's own voxels (and its
    storage orientation is kept with ``conform``)."""
    if not config.init or resume is not None or config.spacing:
        return config
    stored = load_checkpoint(config.init)[0].config
    changes: dict[str, Any] = {}
    if stored.spacing:
        changes["spacing"] = float(stored.spacing)
    if stored.orientation and config.model.ndim == 3 and not config.conform:
        changes["conform"] = True
    if changes:
        logger.info("fine-tuning '%s' at its own settings %s", config.init, changes)
    return dataclasses.replace(config, **changes) if changes else config


def _train(
    config: TrainConfig,
    pairs: PairSource | None,
    progress: bool,
    val_pairs: list[ValidationPair] | None,
    resume: str | os.PathLike[str] | None,
    context: distributed.DistributedContext,
    device: torch.device,
) -> Path:
    main = context.is_main
    record = None
    if pairs is None:
        pairs, loaded, record = prepare_data(config, load_validation=main)
        val_pairs = loaded if val_pairs is None else val_pairs
    val_pairs = list(val_pairs or [])
    val_every = config.val_every
    if val_every == 0 and val_pairs and (record is None or record["mode"] == "subjects"):
        val_every = config.checkpoint_every
    out_dir = Path(config.out)
    resolved = to_dict(config)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "config.json", resolved, indent=2)
        if record is not None:
            write_json(out_dir / "split.json", record, indent=2)

    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = HyperMorph(config.model).to(device)
    objective = model.objective = training_objective(config)
    labelled = objective.label_loss != "none" and objective.label_weight > 0
    model.train()
    # one fused kernel for every parameter instead of a Python loop of small ops
    fused = device.type in ("cpu", "cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, fused=fused)
    lam_sampler = LambdaSampler(config.lam_endpoint_fraction)
    extra = {"train_config": resolved}
    start_step, best_score, elapsed = 0, -math.inf, 0.0
    if resume is not None:
        start_step, state = resume_training(resume, config, model, optimizer, generator)
        best_score = float(state.get("best_score", -math.inf))
        elapsed = float(state.get("seconds", 0.0))
    elif config.init:
        init_from_model(config.init, model)

    forward: Any = model
    if context.enabled:
        ids = [device.index] if device.type == "cuda" else None
        forward = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if config.compile:
        forward = torch.compile(forward)
    use_amp = config.amp and device.type == "cuda"
    if config.amp and not use_amp:
        warnings.warn("train(): 'amp' needs CUDA; training in float32", stacklevel=3)

    resumed = start_step if resume is not None else None
    log = val_log = tensorboard = None
    if main:
        log = open_log(out_dir / "train_log.csv", LOG_COLUMNS, resumed)
        if val_every:
            val_log = open_log(
                out_dir / "val_log.csv", validation_columns(config.val_lambdas), resumed
            )
            tensorboard = open_tensorboard(out_dir)
    # one host read per block of steps on a GPU, so the CPU queues ahead (steplog)
    step_stats = StepStats(read_every(device))
    pinned = device.type == "cuda"  # pinned inputs: the copy to the GPU does not block the host
    rows = distributed.local_slice(context, config.batch_size)
    global_batch = config.batch_size * context.world_size
    start = time.perf_counter() - elapsed
    signals = StopSignals()
    bar = tqdm(
        range(start_step + 1, config.steps + 1),
        initial=start_step,
        total=config.steps,
        disable=not (progress and main),
        desc="train",
        unit="step",
    )
    try:
        signals.install()
        for step in bar:
            batch = batch_of(pairs, global_batch, generator)
            lam = lam_sampler.sample(global_batch, generator)
            tensors = (*batch, lam)
            if context.enabled:
                tensors = tuple(t[rows] for t in tensors)
            if pinned:
                tensors = tuple(t.pin_memory() for t in tensors)
            tensors = tuple(t.to(device, non_blocking=pinned) for t in tensors)
            moving, fixed, moving_labels, fixed_labels, image_pairs, lam = tensors
            amp = torch.autocast("cuda", torch.bfloat16) if use_amp else contextlib.nullcontext()
            with amp:
                out = forward(moving, fixed, lam)
            if use_amp:  # losses in float32
                out = RegistrationOutput(*(t if t is None else t.float() for t in out))
            terms = objective(
                out.moved,
                fixed,
                out.velocity if out.velocity is not None else out.disp,
                lam,
                disp=out.disp,
                moving_labels=moving_labels if labelled else None,
                fixed_labels=fixed_labels if labelled else None,
                image_pairs=image_pairs,
            )
            loss, sim, smooth = terms.loss, terms.similarity, terms.smoothness
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            stats = torch.stack([loss.detach(), sim.mean().detach(), smooth.mean().detach()])
            # filled on the device (torch.tensor(..., device=cuda) would copy and block)
            stop = torch.full((1,), float(signals.requested is not None), device=stats.device)
            stats = torch.cat([stats.float(), lam.mean().reshape(1), stop])
            if context.enabled:
                dist.all_reduce(stats)
                stats /= context.world_size
            step_stats.add(step, stats, time.perf_counter() - start)
            validating = bool(val_every) and (step % val_every == 0 or step == config.steps)
            saving = step % config.checkpoint_every == 0 or step == config.steps
            if not step_stats.due(force=validating or saving):
                continue  # every rank reads at the same steps, so all see a stop together
            stopping = False
            for logged, values, queued_at in step_stats.read():
                if not math.isfinite(values[0]):
                    raise RuntimeError(f"train(): loss became non-finite at step {logged}")
                stopping = stopping or values[4] > 0  # a signal reached some rank: all stop
                if main:
                    cells = [logged, *(f"{v:.6g}" for v in values[:3]), f"{values[3]:.4f}"]
                    log[1].writerow([*cells, f"{queued_at:.2f}"])
                    if tensorboard is not None:
                        tensorboard.add_scalar("train/loss", values[0], logged)
            if not main:
                if stopping:
                    raise TrainingInterrupted(signals.requested or signal.SIGTERM, step, None)
                continue
            bar.set_postfix(loss=f"{values[0]:.4f}")
            seconds = time.perf_counter() - start
            if validating:
                row = evaluate(model, val_pairs, config.val_lambdas)
                columns = validation_columns(config.val_lambdas)
                val_log[1].writerow([step, *(f"{row[c]:.6g}" for c in columns[1:])])
                logger.info("step %d: validation mean Dice %.4f", step, row["mean_dice"])
                if tensorboard is not None:
                    for key, value in row.items():
                        tensorboard.add_scalar(f"val/{key}", value, step)
                if row["score"] > best_score:
                    best_score = row["score"]
                    save_checkpoint(model, out_dir / "best.pt", step=step, validation=row, **extra)
            if saving or stopping:
                written = save_training_checkpoint(
                    model,
                    out_dir,
                    step,
                    optimizer,
                    generator,
                    keep=config.keep_checkpoints,
                    state={"best_score": best_score, "seconds": seconds},
                    **extra,
                )
                if stopping:
                    logger.warning("stopped after step %d: resume with --resume %s", step, out_dir)
                    raise TrainingInterrupted(signals.requested or signal.SIGTERM, step, written)
    finally:
        signals.restore()
        for item in (log, val_log):
            if item is not None:
                item[0].close()
        if tensorboard is not None:
            tensorboard.close()
    final = out_dir / "model.pt"
    if main:
        save_checkpoint(model, final, step=config.steps, **extra)
        if config.keep_checkpoints > 0:  # only the newest keeps its optimiser state
            slim_old_checkpoints(out_dir)
        logger.info(
            "trained to step %d in %.1f s -> %s", config.steps, time.perf_counter() - start, final
        )
    return final
