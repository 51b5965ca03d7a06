"""Training logs: the per-step statistics, read from the device in blocks, and their files.

Reading a CUDA tensor on the host (``.tolist()``, ``float()``) waits for every queued kernel, so
a read after every step keeps the CPU from queueing step ``k + 1`` while the GPU still runs step
``k``. :class:`StepStats` keeps each step's statistics on the device and reads a block of them in
one transfer: every :data:`CUDA_READ_EVERY` steps on a GPU, every step on a CPU (where nothing is
queued and a read costs nothing). The training loop also reads before any validation,
checkpoint or the last step, so what it saves has been checked; a non-finite loss is still
reported at its own step, up to ``every − 1`` steps after it happened.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "CUDA_READ_EVERY",
    "LOG_COLUMNS",
    "StepStats",
    "open_log",
    "open_tensorboard",
    "read_every",
]

LOG_COLUMNS = ("step", "loss", "similarity", "smoothness", "lam_mean", "seconds")
CUDA_READ_EVERY = 10  # steps between host reads of the statistics on a GPU


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
