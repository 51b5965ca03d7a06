"""The training loop: one object that owns a run's model, optimiser, random state and logs.

:class:`TrainingLoop` is what :func:`hyperreg.training.train.train` runs once the data is
ready: it seeds the run, builds the model and Adam, resumes from a checkpoint
(:meth:`~TrainingLoop.resume`), then takes the steps (:meth:`~TrainingLoop.train_step`: a batch,
one λ per sample, the objective, one optimiser step), reads their statistics in blocks
(:class:`~hyperreg.training.steplog.StepRecord`), validates, writes checkpoints and stops
cleanly on SIGTERM/SIGINT. With ``config.prefetch`` each batch is drawn in a background thread
while the step before it runs (:mod:`hyperreg.training.prefetch`): the same batches, in the same
order, from the same generator, and checkpoints hold the generator state of the next batch
still to be drawn. Under DDP every rank runs the loop and only rank 0 writes. Must not import
train or cli.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm.auto import tqdm

from hyperreg.config import TrainConfig, to_dict
from hyperreg.method.model import HyperMorph, RegistrationOutput, save_checkpoint
from hyperreg.method.objective import Objective, ObjectiveTerms
from hyperreg.method.spatial import compose_displacements, warp
from hyperreg.training import distributed
from hyperreg.training.batches import LambdaSampler, TrainBatch, batch_of
from hyperreg.training.checkpointing import (
    StopSignals,
    TrainingInterrupted,
    resume_training,
    save_training_checkpoint,
    slim_old_checkpoints,
)
from hyperreg.training.holdout import ValidationPair
from hyperreg.training.prefetch import Prefetcher
from hyperreg.training.steplog import RunLogs, StepRecord, StepStats
from hyperreg.training.validation import evaluate, validation_columns

__all__ = ["TrainingLoop"]

logger = logging.getLogger(__name__)

# warnings point at the caller of train(): warn in _wrap_forward <- run <- train's _run <- train
# <- caller
_TRAIN_CALLER = 5


class TrainingLoop:
    """One training run: seeded model, optimiser and λ sampler, then its steps.

    Construction seeds torch and the run's generator from ``config.seed`` and builds the model
    (whose initial weights come from that seed) and Adam, in that order, so a run's numbers
    depend only on its config.

    Args:
        config: The run (resolved, checked).
        objective: The training objective; the model carries it into its checkpoints.
        record: More entries written into every checkpoint (e.g. the defaults the model
            registers with, :func:`hyperreg.training.train.train`).
        context: Distributed setup (one process: ``enabled`` False).
        device: Where the model trains.
        step_stats: Buffer of the step statistics (its ``every`` = steps per host read).
    """

    def __init__(
        self,
        config: TrainConfig,
        objective: Objective,
        context: distributed.DistributedContext,
        device: torch.device,
        step_stats: StepStats,
        record: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.context = context
        self.device = device
        self.main = context.is_main
        self.out_dir = Path(config.out)
        self.extra = {**(record or {}), "train_config": to_dict(config)}
        self.last_validation: dict[str, Any] | None = None
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.model = HyperMorph(config.model).to(device)
        self.objective = self.model.objective = objective
        self.labelled = objective.label_loss != "none" and objective.label_weight > 0
        self.model.train()
        # one fused kernel for every parameter instead of a Python loop of small ops
        fused = device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, fused=fused)
        self.lam_sampler = LambdaSampler(config.lam_endpoint_fraction)
        self.step_stats = step_stats
        self.start_step, self.best_score, self.elapsed = 0, -math.inf, 0.0
        self.resumed: int | None = None
        self.forward: Any = self.model
        self.use_amp = config.amp and device.type == "cuda"
        self.signals = StopSignals()
        self.logs: RunLogs | None = None
        self.pairs: Any = None
        self.batches: Prefetcher[tuple[Tensor, ...]] | None = None
        self.val_pairs: list[ValidationPair] = []
        self.val_every = 0
        self.start = 0.0

    def resume(self, folder: str | os.PathLike[str]) -> None:
        """Continue from the newest checkpoint in ``folder``: model, optimiser, step, best
        validation score, seconds so far and every random state (see
        :func:`~hyperreg.training.checkpointing.resume_training`)."""
        step, state = resume_training(
            folder, self.config, self.model, self.optimizer, self.generator
        )
        self.start_step = self.resumed = step
        self.best_score = float(state.get("best_score", -math.inf))
        self.elapsed = float(state.get("seconds", 0.0))

    def run(
        self,
        pairs: Any,
        val_pairs: list[ValidationPair],
        val_every: int,
        progress: bool = True,
    ) -> Path:
        """Train from the current step to ``config.steps``; returns the final model's path.

        Args:
            pairs: Pair source (``sample_batch`` or ``sample``, see
                :func:`~hyperreg.training.batches.batch_of`).
            val_pairs: Validation pairs.
            val_every: Steps between validations (0: none).
            progress: Show a tqdm bar (rank 0).

        Raises:
            RuntimeError: If the loss becomes non-finite.
            TrainingInterrupted: After a stop signal, once the checkpoint is written.
        """
        self.pairs, self.val_pairs, self.val_every = pairs, val_pairs, val_every
        self._wrap_forward()
        if self.main:
            columns = validation_columns(self.config.val_lambdas) if val_every else None
            self.logs = RunLogs(self.out_dir, columns, self.resumed)
        self.start = time.perf_counter() - self.elapsed
        bar = tqdm(
            range(self.start_step + 1, self.config.steps + 1),
            initial=self.start_step,
            total=self.config.steps,
            disable=not (progress and self.main),
            desc="train",
            unit="step",
        )
        self.batches = Prefetcher(
            self._draw,
            self.generator,
            self.config.steps - self.start_step,
            enabled=self.config.prefetch,
            prepare=self._prepare_thread(),
        )
        try:
            self.signals.install()
            for step in bar:
                stats = self.train_step(step)
                self.step_stats.add(step, stats, time.perf_counter() - self.start)
                self._after_step(step, bar)
        finally:
            self.batches.close()  # waits for a draw in flight; the thread ends here
            self.batches = None
            self.signals.restore()
            if self.logs is not None:
                self.logs.close()
        return self._finish()

    def _prepare_thread(self) -> Any:
        """What the prefetch thread sets first: the torch thread count and CUDA device of
        this thread (both are per thread), so its draws compute as the loop's own would."""
        threads = torch.get_num_threads()
        device = self.device

        def prepare() -> None:
            torch.set_num_threads(threads)
            if device.type == "cuda" and device.index is not None:
                torch.cuda.set_device(device)  # pinned memory on this rank's GPU

        return prepare

    def _wrap_forward(self) -> None:
        """DistributedDataParallel under torchrun, ``torch.compile`` when asked."""
        forward: Any = self.model
        if self.context.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            forward = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        if self.config.compile:
            forward = torch.compile(forward)
        self.forward = forward
        if self.config.amp and not self.use_amp:
            warnings.warn(
                "train(): 'amp' needs CUDA; training in float32", stacklevel=_TRAIN_CALLER
            )

    def _draw(self) -> tuple[Tensor, ...]:
        """The next batch's five tensors and its λ per sample, on the host (pinned for CUDA):
        the global batch is drawn on every rank from the same generator and each rank keeps its
        rows. Runs in the prefetch thread: nothing but the generator's draws may happen here."""
        global_batch = self.config.batch_size * self.context.world_size
        batch = batch_of(self.pairs, global_batch, self.generator)
        lam = self.lam_sampler.sample(global_batch, self.generator)
        tensors = (*batch, lam)
        if self.context.enabled:
            rows = distributed.local_slice(self.context, self.config.batch_size)
            tensors = tuple(t[rows] for t in tensors)
        if self.device.type == "cuda":  # pinned: the copy to the GPU does not block the host
            tensors = tuple(t.pin_memory() for t in tensors)
        return tensors

    def _batch(self) -> tuple[TrainBatch, Tensor]:
        """The next batch and its λ per sample, on the device. The batch after it is drawn
        meanwhile, except after a step that writes a checkpoint: that one is drawn once the
        checkpoint is written, as without prefetching."""
        if self.batches is None:  # a step outside run()
            tensors = self._draw()
        else:
            step = self.start_step + self.batches.delivered + 1
            tensors = self.batches.next(ahead=not self._saves_at(step))
        pinned = self.device.type == "cuda"
        tensors = tuple(t.to(self.device, non_blocking=pinned) for t in tensors)
        return TrainBatch(*tensors[:5]), tensors[5]

    def _saves_at(self, step: int) -> bool:
        """Whether a checkpoint is written after ``step``."""
        return step % self.config.checkpoint_every == 0 or step == self.config.steps

    def train_step(self, step: int = 0) -> Tensor:
        """One optimiser step on the next batch; returns its statistics, still on the device
        (:meth:`~hyperreg.training.steplog.StepRecord.pack`, averaged over the ranks).

        On a step that ``config.cascade_every`` divides, the network first registers the batch
        without gradient, and the step trains it on its own moved image (the second pass of a
        recursive cascade with shared weights, Zhao et al. ICCV 2019): the objective is on the
        composed field (label maps and images warped once from the inputs), the smoothness on
        the second pass's field."""
        batch, lam = self._batch()
        amp = torch.autocast("cuda", torch.bfloat16) if self.use_amp else contextlib.nullcontext()
        every = self.config.cascade_every
        first = None
        if every and step and step % every == 0:
            with torch.no_grad(), amp:
                first = self.model(batch.moving, batch.fixed, lam)
        with amp:
            moving = batch.moving if first is None else first.moved.float()
            out = self.forward(moving, batch.fixed, lam)
        if self.use_amp:  # losses in float32
            out = RegistrationOutput(*(t if t is None else t.float() for t in out))
        disp, moved = out.disp, out.moved
        if first is not None:
            disp = compose_displacements(first.disp.float(), out.disp, exact=False)
            moved = warp(batch.moving, disp, exact=False)
        terms: ObjectiveTerms = self.objective(
            moved,
            batch.fixed,
            out.velocity if out.velocity is not None else out.disp,
            lam,
            disp=disp,
            moving_labels=batch.moving_labels if self.labelled else None,
            fixed_labels=batch.fixed_labels if self.labelled else None,
            image_pairs=batch.image_pairs,
        )
        self.optimizer.zero_grad(set_to_none=True)
        terms.loss.backward()
        self.optimizer.step()
        stop = self.signals.requested is not None
        stats = StepRecord.pack(terms.loss, terms.similarity, terms.smoothness, lam, stop)
        if self.context.enabled:
            dist.all_reduce(stats)
            stats /= self.context.world_size
        return stats

    def _after_step(self, step: int, bar: Any) -> None:
        """Read and log the held statistics when due; validate, checkpoint or stop."""
        steps = self.config.steps
        validating = bool(self.val_every) and (step % self.val_every == 0 or step == steps)
        saving = self._saves_at(step)
        if not self.step_stats.due(force=validating or saving):
            return  # every rank reads at the same steps, so all see a stop together
        records = self.read_statistics()
        stopping = any(record.stop for record in records)  # a signal reached some rank: all stop
        if not self.main:
            if stopping:
                raise TrainingInterrupted(self.signals.requested or signal.SIGTERM, step, None)
            return
        bar.set_postfix(loss=f"{records[-1].loss:.4f}")
        seconds = time.perf_counter() - self.start
        if validating:
            self.validate(step)
        if saving or stopping:
            written = self.checkpoint(step, seconds)
            if stopping:
                logger.warning("stopped after step %d: resume with --resume %s", step, self.out_dir)
                raise TrainingInterrupted(self.signals.requested or signal.SIGTERM, step, written)

    def read_statistics(self) -> list[StepRecord]:
        """The held steps' statistics, each checked and written to ``train_log.csv`` (rank 0).

        Raises:
            RuntimeError: At the first step whose loss is not finite (the steps before it are
                logged).
        """
        records = [StepRecord.from_values(*row) for row in self.step_stats.read()]
        for record in records:
            if not record.finite:
                raise RuntimeError(f"train(): loss became non-finite at step {record.step}")
            if self.logs is not None:
                self.logs.write_step(record)
        return records

    def validate(self, step: int) -> dict[str, Any]:
        """Validate at ``step``: a row of ``val_log.csv``, and ``best.pt`` when the score is
        the best so far. Returns the validation row."""
        row = evaluate(self.model, self.val_pairs, self.config.val_lambdas)
        self.last_validation = row
        columns = validation_columns(self.config.val_lambdas)
        cells = [f"{row[c]:.6g}" for c in columns[1:]]
        if math.isnan(row["mean_dice"]):
            logger.info("step %d: validation has no Dice: %s", step, self._why_no_dice())
        else:
            logger.info("step %d: validation mean Dice %.4f", step, row["mean_dice"])
        if self.logs is not None:
            self.logs.write_validation(step, cells, row)
        if row["score"] > self.best_score:
            self.best_score = row["score"]
            path = self.out_dir / "best.pt"
            save_checkpoint(self.model, path, validation=row, **self._extra(step))
        return row

    def _why_no_dice(self) -> str:
        """Why a validation has no Dice, in words (one line); the score it uses instead."""
        labelled = sum(p.moving_seg is not None and p.fixed_seg is not None for p in self.val_pairs)
        if not labelled:
            why = (
                f"none of the {len(self.val_pairs)} validation pairs has a label map on both sides"
            )
        else:
            why = f"the label maps of the {labelled} labelled pairs share no label id"
        return f"{why}; the score is the image similarity"

    def checkpoint(self, step: int, seconds: float) -> Path:
        """Write ``checkpoint_<step>.pt`` (model, optimiser, every random state, best score
        and seconds so far; the newest ``keep_checkpoints`` kept). Returns its path. The
        generator state stored is the one the next batch is drawn from, also when the prefetch
        thread has drawn it already."""
        generator = self.generator if self.batches is None else self.batches.position()
        return save_training_checkpoint(
            self.model,
            self.out_dir,
            step,
            self.optimizer,
            generator,
            keep=self.config.keep_checkpoints,
            state={"best_score": self.best_score, "seconds": seconds},
            **{key: value for key, value in self._extra(step).items() if key != "step"},
        )

    def _extra(self, step: int) -> dict[str, Any]:
        """What every checkpoint written after ``step`` holds besides the model: the step,
        the steps in all (``total_steps``, counting on from a fine-tuned model's
        ``config.init_steps``), the run's config and the caller's ``record``."""
        return {"step": step, "total_steps": self.config.init_steps + step, **self.extra}

    def _finish(self) -> Path:
        """Write ``model.pt`` (rank 0) and slim the older checkpoints; return its path."""
        final = self.out_dir / "model.pt"
        if self.main:
            # the final weights' own validation (when the run validated at its last step):
            # their default λ can be chosen on it (hyperreg.apps.models)
            steps = self.config.steps
            last = self.last_validation
            own = {"validation": last} if last is not None and self.val_every else {}
            save_checkpoint(self.model, final, **own, **self._extra(steps))
            if self.config.keep_checkpoints > 0:  # only the newest keeps its optimiser state
                slim_old_checkpoints(self.out_dir)
            logger.info(
                "trained to step %d in %.1f s -> %s",
                self.config.steps,
                time.perf_counter() - self.start,
                final,
            )
        return final
