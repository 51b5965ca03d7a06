"""HyperMorph training: λ per sample, loss (1 − λ)·similarity + λ·smoothness, checkpoints, logs.

``train(config)`` draws pairs from a :class:`~hyperreg.training.data.PairSampler` (or any object with the
same ``sample(batch_size, generator)`` method), draws one λ per sample, and minimises the batch
mean of each sample's own loss ``(1 − λ_i)·L_sim,i + λ_i·L_smooth,i`` with Adam. It writes into
``config.out``: ``train_log.csv``, ``checkpoint_<step>.pt`` (model + optimiser + every random
state, the newest ``keep_checkpoints`` kept; see :mod:`hyperreg.training.checkpointing`), ``model.pt``,
``config.json``, and with validation ``val_log.csv``, ``best.pt`` and ``split.json``.
``train(config, resume=DIR)`` continues exactly where the newest checkpoint in ``DIR`` stopped.
Under ``torchrun`` it trains with DistributedDataParallel (see :mod:`hyperreg.training.distributed`);
only rank 0 writes. Seeds are set here from the config, never at import. Validation goes
through :mod:`hyperreg.training.validation` (which reuses the inference code). Must not import cli.

References:
    Hoopes et al., HyperMorph, IPMI 2021 / MELBA 2022 (amortised λ training).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm.auto import tqdm

from hyperreg.training import distributed
from hyperreg.training.checkpointing import (
    TRAINING_STATE_KEY,
    latest_checkpoint,
    load_training_checkpoint,
    restore_random_state,
    save_training_checkpoint,
)
from hyperreg.config import TrainConfig, to_dict
from hyperreg.training.data import (
    LambdaSampler,
    PairSampler,
    Scan,
    ValidationPair,
    find_scans,
    split_subjects,
    validation_pairs,
)
from hyperreg.method.losses import gradient_loss, mse_loss, ncc_loss
from hyperreg.method.model import HyperMorph, RegistrationOutput, save_checkpoint
from hyperreg.training.validation import evaluate, validation_columns

__all__ = ["SIMILARITIES", "PairSource", "hypermorph_loss", "train"]

logger = logging.getLogger(__name__)

SIMILARITIES = ("ncc", "mse")
LOG_COLUMNS = ("step", "loss", "similarity", "smoothness", "lam_mean", "seconds")


class PairSource(Protocol):
    """Anything that yields training pairs ``(moving, fixed)``, each ``(B, 1, *S)``."""

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]: ...


def hypermorph_loss(
    out: RegistrationOutput, fixed: Tensor, lam: Tensor, config: TrainConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Batch loss with each sample weighted by its own λ.

    Args:
        out: Model output for the batch.
        fixed: ``(B, C, *S)`` fixed images.
        lam: ``(B,)`` λ per sample.
        config: Supplies ``sim``, ``ncc_window`` and ``mse_sigma``.

    Returns:
        ``(loss, similarity, smoothness)``: the scalar to minimise, ``mean_i((1 − λ_i)·sim_i +
        λ_i·smooth_i)``, and the two per-sample terms ``(B,)`` for logging.

    Regulariser scale (so λ is comparable with published HyperMorph λ): ``smooth`` is
    :func:`~hyperreg.method.losses.gradient_loss` of the velocity (of the displacement without
    integration), multiplied by ``int_downsize`` when the velocity lives at ``1/int_downsize``
    resolution, as VoxelMorph's ``Grad('l2', loss_mult=int_downsize)`` does.

    References:
        Balakrishnan et al. VoxelMorph. IEEE TMI 2019 (``scripts/torch/train.py``: the
        ``loss_mult=args.int_downsize`` of the gradient loss). Hoopes et al. HyperMorph. MELBA 2022.
    """
    if config.sim == "ncc":
        sim = ncc_loss(out.moved, fixed, window=config.ncc_window, reduction="none")
    else:
        sim = mse_loss(out.moved, fixed, sigma=config.mse_sigma, reduction="none")
    field = out.velocity if out.velocity is not None else out.disp
    smooth = gradient_loss(field, reduction="none")
    downsize = field.shape[2] < fixed.shape[2]  # a velocity at 1/int_downsize resolution
    if downsize and config.model.int_downsize > 1:
        smooth = smooth * config.model.int_downsize
    loss = ((1 - lam) * sim + lam * smooth).mean()
    return loss, sim, smooth


def _validate(config: TrainConfig) -> None:
    if config.sim not in SIMILARITIES:
        raise ValueError(f"train(): 'sim' must be one of {SIMILARITIES}, got {config.sim!r}")
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


def _prepare_data(
    config: TrainConfig, load_validation: bool = True
) -> tuple[PairSampler, list[ValidationPair], dict]:
    """Training sampler, validation pairs and the split record (written to split.json).

    ``load_validation=False`` (ranks other than 0) records the split but loads no pairs.
    """
    ndim = config.model.ndim
    scans = find_scans(config.data, ndim)
    by_name = {scan.name: scan for scan in scans}
    atlas = None
    if config.atlas:
        atlas = Scan(Path(config.atlas), Path(config.atlas_seg) if config.atlas_seg else None)
    min_train = 1 if atlas is not None else 2
    if len(scans) > min_train:
        split = split_subjects(
            list(by_name), config.seed, config.val_fraction, config.test_fraction, min_train
        )
    else:
        split = {"train": list(by_name), "val": [], "test": []}
    train_scans = [by_name[name] for name in split["train"]]
    val_scans = [by_name[name] for name in split["val"]]
    record: dict[str, Any] = {"seed": config.seed, **split}
    holdout = 0 if val_scans or config.val_every == 0 else config.holdout_every
    sampler = PairSampler(
        train_scans,
        ndim,
        atlas=atlas.image if atlas else None,
        slice_axis=config.slice_axis,
        holdout_every=holdout,
        crop=config.crop,
    )
    val: list[ValidationPair] = []
    common = {"slice_axis": config.slice_axis, "max_pairs": config.val_max_pairs}
    if val_scans:
        record["mode"] = "subjects"
        record["note"] = f"validation on {len(val_scans)} held-out subject(s)"
        pairs = _subject_pairs(val_scans, train_scans, atlas)
        if load_validation:
            val = validation_pairs(pairs, ndim, slice_every=config.holdout_every, **common)
    elif config.val_every > 0:
        pairs = _subject_pairs(train_scans, [], atlas) if len(train_scans) > 1 or atlas else []
        if sampler.heldout_slices is not None and pairs:
            record["mode"] = "slices"
            record["val_slices"] = sampler.heldout_slices.tolist()
            record["note"] = (
                f"only {len(scans)} subject(s): nothing held out by subject; validation on "
                f"every {config.holdout_every}th brain slice along axis {config.slice_axis}, "
                "not used for training (same subjects as training)"
            )
            if load_validation:
                val = validation_pairs(pairs, ndim, slices=sampler.heldout_slices, **common)
        elif pairs:
            record["mode"] = "training-pairs"
            record["note"] = (
                f"only {len(scans)} subject(s) and no slices to hold out: validation on "
                "training pairs (not held out)"
            )
            if load_validation:
                val = validation_pairs(pairs, ndim, slice_every=config.holdout_every, **common)
        else:
            record["mode"] = "none"
            record["note"] = "no pair to validate on"
    else:
        record["mode"] = "none"
        record["note"] = "validation off (no held-out subjects and val_every = 0)"
    record["val_pairs"] = [pair.name for pair in val]
    if load_validation:
        logger.info("data split: %s", record["note"])
    return sampler, val, record


def _open_log(path: Path, columns: list[str] | tuple[str, ...], resume_step: int | None):
    """CSV writer for ``path``; on resume, rows after ``resume_step`` are dropped."""
    kept: list[list[str]] = []
    if resume_step is not None and path.is_file():
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))[1:]
        kept = [row for row in rows if row and int(row[0]) <= resume_step]
    handle = path.open("w", newline="", buffering=1)
    writer = csv.writer(handle)
    writer.writerow(columns)
    writer.writerows(kept)
    return handle, writer


def _tensorboard(folder: Path) -> Any:
    """A TensorBoard SummaryWriter when tensorboard is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder / "tensorboard"))


def _resume_from(
    folder: str | os.PathLike[str],
    config: TrainConfig,
    model: HyperMorph,
    optimizer: Any,
    generator: torch.Generator,
) -> tuple[int, dict[str, Any]]:
    path = latest_checkpoint(folder)
    payload = load_training_checkpoint(path)
    if payload["model_config"] != to_dict(config.model):
        raise ValueError(
            f"train(): cannot resume from '{path}': its model config {payload['model_config']} "
            f"differs from this run's {to_dict(config.model)}"
        )
    step = int(payload["step"])
    if step >= config.steps:
        raise ValueError(
            f"train(): '{path}' is already at step {step}; 'steps' ({config.steps}) is the total "
            "number of steps, so pass a larger value to train further"
        )
    previous = payload.get("train_config", {})
    changed = [
        key
        for key in ("seed", "batch_size", "lr", "sim", "lam_endpoint_fraction", "data", "crop")
        if key in previous and previous[key] != to_dict(config)[key]
    ]
    if changed:
        warnings.warn(
            f"train(): resuming with changed settings {changed}; the run will not match an "
            "uninterrupted one",
            stacklevel=3,
        )
    state = payload[TRAINING_STATE_KEY]
    model.load_state_dict(payload["state_dict"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    for group in optimizer.param_groups:
        group["lr"] = config.lr
    restore_random_state(state["random"], generator)
    logger.info("resuming from %s at step %d", path, step)
    return step, state


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
        ValueError: On invalid settings or data (see :class:`~hyperreg.training.data.PairSampler`), or a
            checkpoint to resume that does not fit this run.
        FileNotFoundError: If ``config.data`` does not exist, or ``resume`` holds no checkpoint.
        RuntimeError: If the loss becomes non-finite.
    """
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
        pairs, loaded, record = _prepare_data(config, load_validation=main)
        val_pairs = loaded if val_pairs is None else val_pairs
    val_pairs = list(val_pairs or [])
    val_every = config.val_every
    if val_every == 0 and val_pairs and (record is None or record["mode"] == "subjects"):
        val_every = config.checkpoint_every
    out_dir = Path(config.out)
    resolved = to_dict(config)
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(resolved, indent=2) + "\n")
        if record is not None:
            (out_dir / "split.json").write_text(json.dumps(record, indent=2) + "\n")

    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = HyperMorph(config.model).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    lam_sampler = LambdaSampler(config.lam_endpoint_fraction)
    extra = {"train_config": resolved}
    start_step, best_score, elapsed = 0, -math.inf, 0.0
    if resume is not None:
        start_step, state = _resume_from(resume, config, model, optimizer, generator)
        best_score = float(state.get("best_score", -math.inf))
        elapsed = float(state.get("seconds", 0.0))

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
        log = _open_log(out_dir / "train_log.csv", LOG_COLUMNS, resumed)
        if val_every:
            val_log = _open_log(
                out_dir / "val_log.csv", validation_columns(config.val_lambdas), resumed
            )
            tensorboard = _tensorboard(out_dir)
    rows = distributed.local_slice(context, config.batch_size)
    global_batch = config.batch_size * context.world_size
    start = time.perf_counter() - elapsed
    bar = tqdm(
        range(start_step + 1, config.steps + 1),
        initial=start_step,
        total=config.steps,
        disable=not (progress and main),
        desc="train",
        unit="step",
    )
    try:
        for step in bar:
            moving, fixed = pairs.sample(global_batch, generator)
            lam = lam_sampler.sample(global_batch, generator)
            if context.enabled:
                moving, fixed, lam = moving[rows], fixed[rows], lam[rows]
            moving, fixed, lam = moving.to(device), fixed.to(device), lam.to(device)
            amp = torch.autocast("cuda", torch.bfloat16) if use_amp else contextlib.nullcontext()
            with amp:
                out = forward(moving, fixed, lam)
            if use_amp:  # losses in float32
                out = RegistrationOutput(*(t if t is None else t.float() for t in out))
            loss, sim, smooth = hypermorph_loss(out, fixed, lam, config)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            stats = torch.stack([loss.detach(), sim.mean().detach(), smooth.mean().detach()])
            stats = torch.cat([stats.float(), lam.mean().reshape(1)])
            if context.enabled:
                dist.all_reduce(stats)
                stats /= context.world_size
            values = stats.tolist()
            if not math.isfinite(values[0]):
                raise RuntimeError(f"train(): loss became non-finite at step {step}")
            if not main:
                continue
            seconds = time.perf_counter() - start
            log[1].writerow(
                [step, *(f"{v:.6g}" for v in values[:3]), f"{values[3]:.4f}", f"{seconds:.2f}"]
            )
            bar.set_postfix(loss=f"{values[0]:.4f}")
            if tensorboard is not None:
                tensorboard.add_scalar("train/loss", values[0], step)
            if val_every and (step % val_every == 0 or step == config.steps):
                row = evaluate(
                    model,
                    val_pairs,
                    config.val_lambdas,
                    config.sim,
                    config.ncc_window,
                    config.mse_sigma,
                )
                columns = validation_columns(config.val_lambdas)
                val_log[1].writerow([step, *(f"{row[c]:.6g}" for c in columns[1:])])
                logger.info("step %d: validation mean Dice %.4f", step, row["mean_dice"])
                if tensorboard is not None:
                    for key, value in row.items():
                        tensorboard.add_scalar(f"val/{key}", value, step)
                if row["score"] > best_score:
                    best_score = row["score"]
                    save_checkpoint(model, out_dir / "best.pt", step=step, validation=row, **extra)
            if step % config.checkpoint_every == 0 or step == config.steps:
                save_training_checkpoint(
                    model,
                    out_dir,
                    step,
                    optimizer,
                    generator,
                    keep=config.keep_checkpoints,
                    state={"best_score": best_score, "seconds": seconds},
                    **extra,
                )
    finally:
        for item in (log, val_log):
            if item is not None:
                item[0].close()
        if tensorboard is not None:
            tensorboard.close()
    final = out_dir / "model.pt"
    if main:
        save_checkpoint(model, final, step=config.steps, **extra)
        logger.info(
            "trained to step %d in %.1f s -> %s", config.steps, time.perf_counter() - start, final
        )
    return final
