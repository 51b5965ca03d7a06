"""HyperMorph training: λ per sample, loss (1 − λ)·similarity + λ·smoothness, checkpoints, logs.

``train(config)`` draws pairs from a :class:`~hyperreg.data.PairSampler` (or any object with the
same ``sample(batch_size, generator)`` method), draws one λ per sample, and minimises the batch
mean of each sample's own loss ``(1 − λ_i)·L_sim,i + λ_i·L_smooth,i`` with Adam. It writes a CSV
log, periodic checkpoints and ``model.pt`` into ``config.out``, plus the resolved config as JSON.
Seeds are set here from the config, never at import. Must not import inference or cli.

References:
    Hoopes et al., HyperMorph, IPMI 2021 / MELBA 2022 (amortised λ training).
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor
from tqdm.auto import tqdm

from hyperreg._checks import resolve_device
from hyperreg.config import TrainConfig, to_dict
from hyperreg.data import LambdaSampler, PairSampler, find_scans
from hyperreg.losses import gradient_loss, mse_loss, ncc_loss
from hyperreg.model import HyperMorph, RegistrationOutput, save_checkpoint

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
    """
    if config.sim == "ncc":
        sim = ncc_loss(out.moved, fixed, window=config.ncc_window, reduction="none")
    else:
        sim = mse_loss(out.moved, fixed, sigma=config.mse_sigma, reduction="none")
    field = out.velocity if out.velocity is not None else out.disp
    smooth = gradient_loss(field, reduction="none")
    loss = ((1 - lam) * sim + lam * smooth).mean()
    return loss, sim, smooth


def _validate(config: TrainConfig) -> None:
    if config.sim not in SIMILARITIES:
        raise ValueError(f"train(): 'sim' must be one of {SIMILARITIES}, got {config.sim!r}")
    for name in ("steps", "batch_size", "checkpoint_every"):
        if getattr(config, name) < 1:
            raise ValueError(f"train(): '{name}' must be >= 1, got {getattr(config, name)}")
    if not config.lr > 0:
        raise ValueError(f"train(): 'lr' must be > 0, got {config.lr}")


def train(config: TrainConfig, pairs: PairSource | None = None, progress: bool = True) -> Path:
    """Train a HyperMorph model and return the path of the final checkpoint.

    Args:
        config: Run settings; ``config.data`` is read unless ``pairs`` is given.
        pairs: Optional pair source (for in-memory data such as the demo's).
        progress: Show a tqdm progress bar.

    Returns:
        ``Path(config.out) / "model.pt"``.

    Raises:
        ValueError: On invalid settings or data (see :class:`~hyperreg.data.PairSampler`).
        FileNotFoundError: If ``config.data`` does not exist.
    """
    _validate(config)
    device = resolve_device("train", config.device)
    if pairs is None:
        pairs = PairSampler(
            find_scans(config.data, config.model.ndim),
            config.model.ndim,
            atlas=config.atlas or None,
            slice_axis=config.slice_axis,
        )
    out_dir = Path(config.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2) + "\n")

    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = HyperMorph(config.model).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    lam_sampler = LambdaSampler(config.lam_endpoint_fraction)
    extra = {"train_config": to_dict(config)}

    log_path = out_dir / "train_log.csv"
    start = time.perf_counter()
    with log_path.open("w", newline="", buffering=1) as handle:
        writer = csv.writer(handle)
        writer.writerow(LOG_COLUMNS)
        bar = tqdm(range(1, config.steps + 1), disable=not progress, desc="train", unit="step")
        for step in bar:
            moving, fixed = pairs.sample(config.batch_size, generator)
            moving, fixed = moving.to(device), fixed.to(device)
            lam = lam_sampler.sample(config.batch_size, generator).to(device)
            out = model(moving, fixed, lam)
            loss, sim, smooth = hypermorph_loss(out, fixed, lam, config)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if not torch.isfinite(loss):
                raise RuntimeError(f"train(): loss became non-finite at step {step}")
            writer.writerow(
                [
                    step,
                    f"{loss.item():.6g}",
                    f"{sim.mean().item():.6g}",
                    f"{smooth.mean().item():.6g}",
                    f"{lam.mean().item():.4f}",
                    f"{time.perf_counter() - start:.2f}",
                ]
            )
            bar.set_postfix(loss=f"{loss.item():.4f}")
            if step % config.checkpoint_every == 0 and step < config.steps:
                handle.flush()
                save_checkpoint(model, out_dir / f"checkpoint_{step:07d}.pt", step=step, **extra)
    final = save_checkpoint(model, out_dir / "model.pt", step=config.steps, **extra)
    logger.info(
        "trained %d steps in %.1f s -> %s", config.steps, time.perf_counter() - start, final
    )
    return final
