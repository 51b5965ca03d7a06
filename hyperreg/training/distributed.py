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

__all__ = ["DistributedContext", "cleanup", "local_slice", "setup"]

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


def setup(device: str) -> tuple[DistributedContext, torch.device]:
    """Join the torchrun process group if ``WORLD_SIZE`` > 1 and choose this rank's device.

    Args:
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. Under torchrun a CUDA device
            becomes ``cuda:<LOCAL_RANK>``.

    Returns:
        ``(context, device)``.

    Raises:
        ValueError: On an unknown device, or CUDA asked for where none is available.
    """
    resolved = resolve_device("train", device)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext(), resolved
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
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
