"""Training checkpoints: model, optimiser, step and every random state in one atomic file.

A training checkpoint is an ordinary :func:`hyperreg.method.model.save_checkpoint` file (so
:func:`hyperreg.method.model.load_checkpoint` loads it for inference and ignores the rest) with one
extra key, ``"training_state"``: the optimiser state, the data/λ generator state, the torch, CUDA,
numpy and Python global random states, and the best validation score so far. Restoring all of them
makes a resumed run reproduce an uninterrupted one step for step (same device, same seed).
Checkpoints are named ``checkpoint_<step>.pt``; only the newest K are kept. Must not import
train, inference or cli.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyperreg.method.model import HyperMorph, save_checkpoint

__all__ = [
    "TRAINING_STATE_KEY",
    "capture_random_state",
    "checkpoint_path",
    "latest_checkpoint",
    "load_training_checkpoint",
    "prune_checkpoints",
    "restore_random_state",
    "save_training_checkpoint",
]

logger = logging.getLogger(__name__)

TRAINING_STATE_KEY = "training_state"
_NAME = re.compile(r"^checkpoint_(\d+)\.pt$")


def checkpoint_path(folder: str | os.PathLike[str], step: int) -> Path:
    """``folder / "checkpoint_<step, 7 digits>.pt"``."""
    return Path(folder) / f"checkpoint_{step:07d}.pt"


def capture_random_state(generator: torch.Generator) -> dict[str, Any]:
    """Every random state a training step draws from, in a ``weights_only``-loadable form."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "generator": generator.get_state(),
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_random_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Inverse of :func:`capture_random_state` (CUDA states only where the device count matches)."""
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["name"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save_training_checkpoint(
    model: HyperMorph,
    folder: str | os.PathLike[str],
    step: int,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    keep: int = 3,
    state: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """Write ``checkpoint_<step>.pt`` atomically with the training state, then prune old ones.

    Args:
        model: The bare model (not a DDP or compiled wrapper).
        folder: Run folder.
        step: Steps completed.
        optimizer: Its ``state_dict`` is stored (tensors on the CPU).
        generator: The data/λ generator.
        keep: Newest checkpoints kept; 0 keeps all.
        state: More training state (e.g. ``best_score``), stored under ``training_state``.
        **extra: More top-level entries (e.g. ``train_config``).

    Returns:
        The checkpoint path.
    """
    training_state = {
        "optimizer": _to_cpu(optimizer.state_dict()),
        "random": capture_random_state(generator),
        **(state or {}),
    }
    extra[TRAINING_STATE_KEY] = training_state
    path = save_checkpoint(model, checkpoint_path(folder, step), step=step, **extra)
    prune_checkpoints(folder, keep)
    return path


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    return value


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def prune_checkpoints(folder: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` ``checkpoint_*.pt`` files (``keep=0``: none deleted).

    Returns:
        The deleted paths.
    """
    if keep <= 0:
        return []
    old = [path for _, path in _checkpoints(Path(folder))[:-keep]]
    for path in old:
        path.unlink(missing_ok=True)
    return old


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path:
    """The ``checkpoint_*.pt`` with the highest step in ``folder``.

    Raises:
        FileNotFoundError: If ``folder`` does not exist or holds no training checkpoint.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"latest_checkpoint(): no such folder: '{folder}'")
    found = _checkpoints(folder)
    if not found:
        raise FileNotFoundError(
            f"latest_checkpoint(): no checkpoint_*.pt in '{folder}' to resume from"
        )
    return found[-1][1]


def load_training_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a training checkpoint (on the CPU).

    Returns:
        The payload: ``step``, ``model_config``, ``state_dict``, ``training_state``, ...

    Raises:
        ValueError: If the file is unreadable or holds no training state (e.g. ``model.pt``,
            which is written for inference only).
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a bad file
        raise ValueError(f"load_training_checkpoint(): cannot read '{path}' ({err})") from err
    if not isinstance(payload, dict) or TRAINING_STATE_KEY not in payload:
        raise ValueError(
            f"load_training_checkpoint(): '{path}' holds no training state; resume from a "
            "checkpoint_*.pt written by 'hyperreg train'"
        )
    return payload
