"""Multi-process training under ``torchrun``: process group, device per rank, batch slicing.

``torchrun --nproc-per-node N -m hyperreg train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; :func:`setup` then joins the process group (NCCL on CUDA, gloo on CPU) and picks
``cuda:<LOCAL_RANK>`` or the CPU. Data parallelism is defined so that N processes with batch B
see exactly what one process with batch N·B sees: every rank draws the same global batch from a
generator seeded identically, and keeps rows ``rank·B … (rank+1)·B − 1``
(:func:`local_slice`). The loss is a batch mean and DDP averages gradients over ranks, so the
updates match. Must not import train, inference or cli.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hyperreg._checks import resolve_device

__all__ = ["DistributedContext", "cleanup", "local_slice", "read_env", "setup"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: ``rank`` of ``world_size`` (1 = not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # True when setup() created the process group

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """More than one process."""
        return self.world_size > 1


def read_env() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.

    These are the variables ``torchrun`` sets; ``(0, 1, 0)`` when unset, and ``local_rank``
    defaults to ``rank``. The one reader of the distributed environment (training and batch).

    Raises:
        ValueError: If a variable is not an integer or the rank lies outside ``[0, world_size)``.
    """
    values: dict[str, int | None] = {}
    for key, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", None)):
        text = os.environ.get(key)
        try:
            values[key] = int(text) if text not in (None, "") else default
        except ValueError:
            raise ValueError(f"${key} must be an integer, got {text!r}") from None
    rank, world = int(values["RANK"] or 0), int(values["WORLD_SIZE"] or 1)
    local = values["LOCAL_RANK"] if values["LOCAL_RANK"] is not None else rank
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"$RANK must lie in [0, $WORLD_SIZE), got {rank} and {world}")
    return rank, world, int(local)


def setup(device: str) -> tuple[DistributedContext, torch.device]:
    """Join the torchrun process group if ``WORLD_SIZE`` > 1 and choose this rank's device.

    Args:
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. Under torchrun a CUDA device
            becomes ``cuda:<LOCAL_RANK>``.

    Returns:
        ``(context, device)``.

    Raises:
        ValueError: On an unknown device, CUDA asked for where none is available, or a
            malformed torchrun environment (:func:`read_env`).
    """
    resolved = resolve_device("train", device)
    rank, world_size, local_rank = read_env()
    if world_size <= 1:
        return DistributedContext(), resolved
    if resolved.type == "cuda":
        resolved = torch.device("cuda", local_rank)
        torch.cuda.set_device(resolved)
    owns = not dist.is_initialized()
    if owns:
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    logger.info("rank %d of %d on %s", rank, world_size, resolved)
    return DistributedContext(rank, world_size, local_rank, owns), resolved


def local_slice(context: DistributedContext, batch_size: int) -> slice:
    """Rows of the global batch (``world_size · batch_size``) that this rank trains on."""
    return slice(context.rank * batch_size, (context.rank + 1) * batch_size)


def cleanup(context: DistributedContext) -> None:
    """Leave the process group if :func:`setup` created it."""
    if context.owns_group and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
