"""Training logs: the per-step statistics, read from the device in blocks, and their files.

Reading a CUDA tensor on the host (``.tolist()``, ``float()``) waits for every queued kernel, so
a read after every step keeps the CPU from queueing step ``k + 1`` while the GPU still runs step
``k``. :class:`StepStats` keeps each step's statistics on the device and reads a block of them in
one transfer: every :data:`CUDA_READ_EVERY` steps on a GPU, every step on a CPU (where nothing is
queued and a read costs nothing). The training loop also reads before any validation,
checkpoint or the last step, so what it saves has been checked; a non-finite loss is still
reported at its own step, up to ``every − 1`` steps after it happened. :class:`StepRecord`
names the statistics of one step as read; :class:`RunLogs` holds a run's open log files.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "CUDA_READ_EVERY",
    "LOG_COLUMNS",
    "RunLogs",
    "StepRecord",
    "StepStats",
    "open_log",
    "open_tensorboard",
    "read_every",
]

LOG_COLUMNS = ("step", "loss", "similarity", "smoothness", "lam_mean", "seconds")
CUDA_READ_EVERY = 10  # steps between host reads of the statistics on a GPU


@dataclass(frozen=True)
class StepRecord:
    """The statistics of one training step, as read from the device.

    On the device a step's statistics are one 1D tensor (:meth:`pack`), so a block of steps is
    read in one transfer and, under DDP, averaged over the ranks in one ``all_reduce``.

    Attributes:
        step: The step (1-based).
        loss: The batch loss minimised, ``mean_i((1 − λ_i)·sim_i + λ_i·k·smooth_i)`` plus the
            label term.
        similarity: Batch mean of the per-sample similarity term.
        smoothness: Batch mean of the per-sample smoothness term.
        lam_mean: Mean λ of the batch.
        stop: Whether a stop signal (SIGTERM, SIGINT) had reached some rank by this step.
        seconds: Time into the run (resumed runs included) when the step was queued.
    """

    step: int
    loss: float
    similarity: float
    smoothness: float
    lam_mean: float
    stop: bool
    seconds: float

    @staticmethod
    def pack(
        loss: Tensor, similarity: Tensor, smoothness: Tensor, lam: Tensor, stop: bool
    ) -> Tensor:
        """One step's statistics as a float32 tensor on the loss's device, in field order
        ``loss, similarity, smoothness, lam_mean, stop``: ``similarity``, ``smoothness`` and
        ``lam`` are per-sample ``(B,)`` and averaged here; nothing is read on the host."""
        stats = torch.stack([loss.detach(), similarity.mean().detach(), smoothness.mean().detach()])
        # filled on the device (torch.tensor(..., device=cuda) would copy and block)
        flag = torch.full((1,), float(stop), device=stats.device)
        return torch.cat([stats.float(), lam.mean().reshape(1), flag])

    @classmethod
    def from_values(cls, step: int, values: Sequence[float], seconds: float) -> StepRecord:
        """A record from a row of :meth:`StepStats.read` (a tensor made by :meth:`pack`)."""
        loss, similarity, smoothness, lam_mean, stop = values
        return cls(step, loss, similarity, smoothness, lam_mean, stop > 0, seconds)

    @property
    def finite(self) -> bool:
        """Whether the loss is finite."""
        return math.isfinite(self.loss)

    def log_row(self) -> list[Any]:
        """The row of ``train_log.csv`` (:data:`LOG_COLUMNS`)."""
        terms = (self.loss, self.similarity, self.smoothness)
        return [
            self.step,
            *(f"{v:.6g}" for v in terms),
            f"{self.lam_mean:.4f}",
            f"{self.seconds:.2f}",
        ]


def read_every(device: torch.device) -> int:
    """Steps per host read of the statistics on ``device``: :data:`CUDA_READ_EVERY` on a GPU,
    1 elsewhere."""
    return CUDA_READ_EVERY if device.type == "cuda" else 1


class StepStats:
    """Per-step statistics held on the device until :meth:`read`.

    Args:
        every: Steps per host read (1 = read after every step).

    Raises:
        ValueError: If ``every`` < 1.
    """

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"StepStats(): 'every' must be >= 1, got {every}")
        self.every = every
        self._pending: list[tuple[int, float, Tensor]] = []

    def add(self, step: int, stats: Tensor, seconds: float) -> None:
        """Keep ``stats`` (a 1D tensor, any device) of ``step``, queued ``seconds`` into the run."""
        self._pending.append((step, seconds, stats))

    def due(self, force: bool = False) -> bool:
        """Whether the held steps should be read now: ``every`` of them, or ``force``."""
        return bool(self._pending) and (force or len(self._pending) >= self.every)

    def read(self) -> list[tuple[int, list[float], float]]:
        """``[(step, values, seconds), …]`` of every held step, in order, in one host transfer;
        the buffer is then empty."""
        if not self._pending:
            return []
        values = torch.stack([stats for _, _, stats in self._pending]).tolist()
        rows = [(step, row, seconds) for (step, seconds, _), row in zip(self._pending, values)]
        self._pending.clear()
        return rows


def open_log(path: Path, columns: list[str] | tuple[str, ...], resume_step: int | None):
    """CSV writer for ``path``; on resume, rows after ``resume_step`` are dropped.

    Returns:
        ``(handle, writer)``: the open file (line-buffered; the caller closes it) and its writer.
    """
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


def open_tensorboard(folder: Path) -> Any:
    """A TensorBoard ``SummaryWriter`` in ``folder / "tensorboard"`` when tensorboard is
    installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder / "tensorboard"))


class RunLogs:
    """A run's open logs: ``train_log.csv``, and with validation ``val_log.csv`` and TensorBoard.

    Args:
        folder: The run folder.
        val_columns: Columns of ``val_log.csv``; None: no validation log (nor TensorBoard).
        resume_step: On resume, the step resumed from (later rows are dropped, see
            :func:`open_log`); None for a new run.
    """

    def __init__(
        self, folder: Path, val_columns: Sequence[str] | None, resume_step: int | None
    ) -> None:
        self.train = open_log(folder / "train_log.csv", LOG_COLUMNS, resume_step)
        self.val = self.tensorboard = None
        if val_columns is not None:
            self.val = open_log(folder / "val_log.csv", list(val_columns), resume_step)
            self.tensorboard = open_tensorboard(folder)

    def write_step(self, record: StepRecord) -> None:
        """One row of ``train_log.csv`` (and the loss on TensorBoard)."""
        self.train[1].writerow(record.log_row())
        if self.tensorboard is not None:
            self.tensorboard.add_scalar("train/loss", record.loss, record.step)

    def write_validation(self, step: int, cells: Sequence[str], row: dict[str, Any]) -> None:
        """One row of ``val_log.csv`` (``cells`` after the step) and every value of ``row`` on
        TensorBoard as ``val/<key>``."""
        if self.val is not None:
            self.val[1].writerow([step, *cells])
        if self.tensorboard is not None:
            for key, value in row.items():
                self.tensorboard.add_scalar(f"val/{key}", value, step)

    def close(self) -> None:
        """Close every file."""
        for item in (self.train, self.val):
            if item is not None:
                item[0].close()
        if self.tensorboard is not None:
            self.tensorboard.close()
