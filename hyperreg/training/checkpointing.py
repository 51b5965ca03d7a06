"""Training checkpoints: model, optimiser, step and every random state in one atomic file.

A training checkpoint is an ordinary :func:`hyperreg.method.model.save_checkpoint` file (so
:func:`hyperreg.method.model.load_checkpoint` loads it for inference and ignores the rest) with one
extra key, ``"training_state"``: the optimiser state, the data/λ generator state, the torch, CUDA,
numpy and Python global random states, and the best validation score so far. Restoring all of them
makes a resumed run reproduce an uninterrupted one step for step (same device, same seed).
Checkpoints are named ``checkpoint_<step>.pt``; only the newest K are kept. Once a run has
finished, all but the newest lose their optimiser state (:func:`slim_old_checkpoints`): the
finished run keeps ``model.pt`` and ``best.pt`` (weights only), one full checkpoint to extend
the run with ``--resume``, and K − 1 weights-only checkpoints (with Adam a third of the size).
Also here: resuming (:func:`resume_training`), fine-tuning from a pretrained model
(:func:`init_from_model`), and the SIGTERM / SIGINT handling that writes a checkpoint before a
killed run exits (:class:`StopSignals`, :class:`TrainingInterrupted`). Must not import train,
inference or cli.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyperreg._files import atomic_write
from hyperreg.config import TrainConfig, to_dict
from hyperreg.method.model import (
    HyperMorph,
    checkpoint_config,
    load_checkpoint,
    save_checkpoint,
)

__all__ = [
    "TRAINING_STATE_KEY",
    "StopSignals",
    "TrainingInterrupted",
    "capture_random_state",
    "checkpoint_path",
    "init_from_model",
    "latest_checkpoint",
    "load_training_checkpoint",
    "prune_checkpoints",
    "restore_random_state",
    "resume_training",
    "save_training_checkpoint",
    "slim_old_checkpoints",
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


def slim_old_checkpoints(folder: str | os.PathLike[str]) -> list[Path]:
    """Drop the optimiser state from every ``checkpoint_*.pt`` but the newest (atomically).

    Called when a run has finished: the newest checkpoint keeps everything (``--resume`` with a
    larger step count extends the run from it); older ones keep weights, step and random
    states, a third of their size with Adam (whose state is two tensors per parameter).

    Returns:
        The checkpoints rewritten.
    """
    slimmed = []
    for _, path in _checkpoints(Path(folder))[:-1]:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        state = payload.get(TRAINING_STATE_KEY)
        if not isinstance(state, dict) or "optimizer" not in state:
            continue
        del state["optimizer"]
        atomic_write(path, lambda tmp, payload=payload: torch.save(payload, tmp))
        slimmed.append(path)
    return slimmed


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


def resume_training(
    folder: str | os.PathLike[str],
    config: TrainConfig,
    model: HyperMorph,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
) -> tuple[int, dict[str, Any]]:
    """Restore model, optimiser and random states from the newest checkpoint in ``folder``.

    Args:
        folder: Run folder holding ``checkpoint_*.pt``.
        config: This run's settings (its model config must equal the checkpoint's).
        model: The bare model, weights overwritten.
        optimizer: Its state is overwritten; the learning rate is set to ``config.lr``.
        generator: The data/λ generator, state overwritten.

    Returns:
        ``(step, training_state)``: steps completed and the stored training state.

    Raises:
        FileNotFoundError: If ``folder`` holds no checkpoint.
        ValueError: If the checkpoint's model config differs, or it is already at
            ``config.steps`` or beyond.

    Warns:
        UserWarning: If seed, batch size, learning rate, similarity, λ sampling, data or crop
            changed since the checkpoint (the run will not match an uninterrupted one).
    """
    path = latest_checkpoint(folder)
    payload = load_training_checkpoint(path)
    stored = checkpoint_config(payload)
    if stored.architecture() != config.model.architecture():
        raise ValueError(
            f"train(): cannot resume from '{path}': its model config {stored.architecture()} "
            f"differs from this run's {config.model.architecture()}"
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
    if "optimizer" not in state:
        raise ValueError(
            f"train(): '{path}' holds no optimiser state (an older checkpoint of a finished run, "
            "see slim_old_checkpoints); resume from the run's newest checkpoint"
        )
    model.load_state_dict(payload["state_dict"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    for group in optimizer.param_groups:
        group["lr"] = config.lr
    restore_random_state(state["random"], generator)
    logger.info("resuming from %s at step %d", path, step)
    return step, state


def init_from_model(path: str | os.PathLike[str], model: HyperMorph) -> int:
    """Copy the weights of a pretrained model into ``model`` (fine-tuning).

    Only the weights are taken: optimiser, step and random states start fresh.

    Args:
        path: Any hyperreg checkpoint (``model.pt``, ``best.pt``, ``checkpoint_*.pt``).
        model: The model to initialise; its config must equal the checkpoint's.

    Returns:
        The step the pretrained model was trained to (0 if not recorded).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If it is not a hyperreg checkpoint, or its architecture differs: the message
            names every differing setting with both values, in one line.
    """
    try:
        pretrained, payload = load_checkpoint(path)
    except RuntimeError as err:  # unknown format_version or weights not matching their config
        raise ValueError(f"train(): cannot use --init '{path}': {err}") from err
    ours, theirs = model.config.architecture(), pretrained.config.architecture()
    differing = [key for key in ours if ours[key] != theirs.get(key)]
    if differing:
        details = "; ".join(
            f"{key}: {theirs.get(key)} in the model, {ours[key]} in this run" for key in differing
        )
        raise ValueError(
            f"train(): --init model '{path}' has another architecture ({details}); fine-tuning "
            "needs the same settings"
        )
    model.load_state_dict(pretrained.state_dict(), strict=True)
    logger.info("initialised from %s", path)
    return int(payload.get("step", 0) or 0)


class TrainingInterrupted(Exception):
    """Training stopped on SIGTERM or SIGINT after writing a checkpoint.

    Attributes:
        signal_number: The signal received (``signal.SIGTERM`` or ``signal.SIGINT``).
        step: Steps completed; the checkpoint holds exactly these.
        checkpoint: Path of the checkpoint written (None on ranks that do not write).
    """

    def __init__(self, signal_number: int, step: int, checkpoint: Path | None) -> None:
        name = signal.Signals(signal_number).name
        where = f"; checkpoint {checkpoint}" if checkpoint is not None else ""
        super().__init__(f"training stopped by {name} after step {step}{where}")
        self.signal_number = signal_number
        self.step = step
        self.checkpoint = checkpoint


class StopSignals:
    """Context manager that turns SIGTERM and SIGINT into a stop request between steps.

    Inside the ``with`` block the first SIGTERM or SIGINT (Ctrl-C) only sets :attr:`requested`;
    the training loop checks it when it reads the step statistics (after every step on a CPU,
    every ``steplog.CUDA_READ_EVERY`` steps on a GPU), writes a checkpoint and stops. A second
    signal stops at once (``KeyboardInterrupt``; checkpoint files are written atomically, so none
    is left half-written). Outside the main thread signals cannot be caught, and nothing is
    installed. The previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signum
        logger.warning(
            "%s received: stopping with a checkpoint after this step (on a GPU within a few "
            "steps; again to stop now)",
            signal.Signals(signum).name,
        )

    def install(self) -> None:
        """Catch SIGTERM and SIGINT (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()
