"""Training batches: the batch layout, mixing pair sources, label index maps, crops and λ.

:class:`TrainBatch` is what every pair source gives (:func:`batch_of` adapts a source with only
``sample``); :class:`MixtureSampler` draws each sample of a batch from one of several samplers
(several sources, real and synthetic pairs); :class:`LambdaSampler` draws one λ per sample.
Randomness always comes from an explicit ``torch.Generator``. Must not import model, train,
inference or cli.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "LambdaSampler",
    "MixtureSampler",
    "TrainBatch",
    "batch_of",
    "label_indices",
    "random_window",
    "stack_images",
    "stack_labels",
]


class TrainBatch(NamedTuple):
    """One training batch.

    Attributes:
        moving: ``(B, 1, *S)`` float32 images in [0, 1].
        fixed: ``(B, 1, *S)`` float32 images in [0, 1].
        moving_labels: ``(B, 1, *S)`` int16 index maps: 0 background (or a label left out),
            ``1..K`` the labels chosen for the pair, the same ids on both sides; all 0 for a
            pair without label maps. Only maps of one pair (one label convention) share an
            index meaning.
        fixed_labels: Same for the fixed side.
        image_pairs: ``(B,)`` bool: whether the image similarity term applies (False for a
            synthetic pair whose two images have independent random contrasts).
    """

    moving: Tensor
    fixed: Tensor
    moving_labels: Tensor
    fixed_labels: Tensor
    image_pairs: Tensor


def label_indices(
    maps: list[np.ndarray], ids: np.ndarray, max_labels: int, generator: torch.Generator
) -> list[np.ndarray]:
    """Label maps of one pair as index maps over (at most ``max_labels`` of) ``ids``.

    Args:
        maps: Integer label maps of one label convention (the two sides of a pair).
        ids: The foreground label ids to consider (sorted, > 0).
        max_labels: Most labels kept; with more ids, a random subset (from ``generator``) is
            kept, so every label is trained on over many steps at a bounded cost per step.
        generator: Random source.

    Returns:
        One int16 array per map: ``k`` where the map holds the ``k``-th kept id, else 0.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size > max_labels:
        keep = torch.randperm(ids.size, generator=generator)[:max_labels].numpy()
        ids = np.sort(ids[keep])
    top = int(max(int(m.max()) for m in maps)) if maps else 0
    table = np.zeros(max(top, int(ids.max()) if ids.size else 0) + 1, np.int16)
    table[ids] = np.arange(1, ids.size + 1, dtype=np.int16)
    return [table[np.clip(m, 0, None)] for m in maps]


def random_window(
    spatial_shape: tuple[int, ...], crop: tuple[int, ...], generator: torch.Generator
) -> tuple[slice, ...]:
    """A random crop window of size ``crop`` inside ``spatial_shape`` (uniform start per axis,
    drawn from ``generator``); ``crop`` sizes must not exceed the shape."""
    return tuple(
        slice(start, start + c)
        for c, size in zip(crop, spatial_shape)
        for start in [int(torch.randint(size - c + 1, (1,), generator=generator))]
    )


def stack_images(arrays: list[np.ndarray]) -> Tensor:
    """Stack 2D/3D arrays into a ``(B, 1, *S)`` float tensor."""
    return torch.from_numpy(np.ascontiguousarray(np.stack(arrays)[:, None]))


def stack_labels(arrays: list[np.ndarray]) -> Tensor:
    """Stack index maps into a ``(B, 1, *S)`` int16 tensor."""
    return torch.from_numpy(np.ascontiguousarray(np.stack(arrays)[:, None].astype(np.int16)))


class MixtureSampler:
    """Draw each sample of a batch from one of several pair samplers.

    Sample ``i`` comes from sampler ``k`` with probability ``weights[k] / sum(weights)``, drawn
    per sample from the generator; each sampler then draws its share of the batch, and the
    samples are put back in the drawn order. The batch structure is that of
    :meth:`~hyperreg.training.data.PairSampler.sample`, so per-sample λ works unchanged. Used
    for several ``--data`` sources (weights = training scans per source) and for real /
    synthetic mixing (weights ``1 − f`` and ``f``).

    Args:
        samplers: Objects with ``sample(batch_size, generator) -> (moving, fixed)``, all giving
            one spatial shape.
        weights: One non-negative weight per sampler, not all zero.

    Raises:
        ValueError: If the lengths differ, ``samplers`` is empty, or the weights are invalid.
    """

    def __init__(self, samplers: list, weights: list[float]) -> None:
        if not samplers or len(samplers) != len(weights):
            raise ValueError(
                f"MixtureSampler(): need one weight per sampler, got {len(samplers)} samplers "
                f"and {len(weights)} weights"
            )
        if min(weights) < 0 or not sum(weights) > 0:
            raise ValueError(
                f"MixtureSampler(): 'weights' must be >= 0 and not all 0, got {weights}"
            )
        self.samplers = list(samplers)
        self.weights = torch.tensor(weights, dtype=torch.float64)

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Draw ``batch_size`` pairs; see :meth:`~hyperreg.training.data.PairSampler.sample`
        for the layout."""
        batch = self.sample_batch(batch_size, generator)
        return batch.moving, batch.fixed

    def sample_batch(self, batch_size: int, generator: torch.Generator) -> TrainBatch:
        """Draw ``batch_size`` pairs with labels (:class:`TrainBatch`); a sampler without
        ``sample_batch`` gives pairs without label maps on which the image term applies."""
        choice = torch.multinomial(self.weights, batch_size, replacement=True, generator=generator)
        rows_out: list[list[Tensor | None]] = [[None] * batch_size for _ in range(5)]
        for index, sampler in enumerate(self.samplers):
            rows = torch.nonzero(choice == index).flatten().tolist()
            if not rows:
                continue
            part = batch_of(sampler, len(rows), generator)
            for offset, row in enumerate(rows):
                for field, values in zip(part, rows_out):
                    values[row] = field[offset]
        return TrainBatch(*(torch.stack(values) for values in rows_out))  # type: ignore[arg-type]


def batch_of(source: object, batch_size: int, generator: torch.Generator) -> TrainBatch:
    """A :class:`TrainBatch` from any pair source: its ``sample_batch`` when it has one, else
    its ``sample`` (images only: index maps 0, image term on)."""
    sample_batch = getattr(source, "sample_batch", None)
    if callable(sample_batch):
        return sample_batch(batch_size, generator)
    moving, fixed = source.sample(batch_size, generator)  # type: ignore[attr-defined]
    empty = torch.zeros(moving.shape, dtype=torch.int16)
    image_pairs = torch.ones(len(moving), dtype=torch.bool)
    return TrainBatch(moving, fixed, empty, empty.clone(), image_pairs)


class LambdaSampler:
    """Per-sample λ for HyperMorph training: U(0, 1) with a share drawn exactly at 0 or 1.

    Args:
        endpoint_fraction: Share of samples set to 0 or 1 (half each on average), in [0, 1].

    Raises:
        ValueError: If ``endpoint_fraction`` is outside [0, 1].

    References:
        Hoopes et al., HyperMorph, MELBA 2022 (λ sampling with endpoint oversampling).
    """

    def __init__(self, endpoint_fraction: float = 0.2) -> None:
        if not 0.0 <= endpoint_fraction <= 1.0:
            raise ValueError(
                f"LambdaSampler(): 'endpoint_fraction' must lie in [0, 1], got {endpoint_fraction}"
            )
        self.endpoint_fraction = endpoint_fraction

    def sample(self, n: int, generator: torch.Generator) -> Tensor:
        """``(n,)`` float32 λ values in [0, 1]."""
        lam = torch.rand(n, generator=generator)
        endpoint = torch.rand(n, generator=generator) < self.endpoint_fraction
        ends = (torch.rand(n, generator=generator) < 0.5).float()
        return torch.where(endpoint, ends, lam)
