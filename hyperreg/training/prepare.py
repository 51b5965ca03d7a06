"""What a training run trains and validates on: the person split, samplers, validation pairs.

:func:`prepare_data` composes three steps, each usable alone: :func:`split_data` finds every
source's scans, splits the people (:func:`~hyperreg.training.holdout.split_people`) and starts
the split record that :func:`~hyperreg.training.train.train` writes to ``split.json``;
:func:`training_samplers` builds the pair samplers of the training people (one per source, mixed
in proportion to their scans) and the synthesis sources (:mod:`hyperreg.training.synth`);
:func:`validation_set` loads the validation pairs (held-out people, else held-out slices or
training pairs) and completes the record. Must not import train, inference or cli.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from hyperreg.config import TrainConfig
from hyperreg.training.batches import MixtureSampler
from hyperreg.training.data import PairSampler
from hyperreg.training.holdout import ValidationPair, split_people, validation_pairs
from hyperreg.training.sources import (
    Scan,
    find_scans,
    label_map_scans,
    scan_shape,
    training_shape,
)
from hyperreg.training.synth import SynthPairSampler, label_maps_from_scans

__all__ = [
    "DataSplit",
    "PairSource",
    "prepare_data",
    "split_data",
    "training_samplers",
    "validation_set",
]

logger = logging.getLogger(__name__)

# warnings point at the caller of train(): warn in training_samplers <- prepare_data <-
# train's _training_data <- _run <- train <- caller
_TRAIN_CALLER = 6


class PairSource(Protocol):
    """Anything that yields training pairs ``(moving, fixed)``, each ``(B, 1, *S)``."""

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]: ...


@dataclass
class DataSplit:
    """Every source's scans split by person, the training grid, and the split record.

    Attributes:
        sources: ``config.data`` as a list.
        groups: Every scan of each source.
        atlas: The atlas (fixed image of every pair), or None.
        people: Every person id, sorted.
        split: ``{"train", "val", "test"}`` person ids (see
            :func:`~hyperreg.training.holdout.split_people`).
        train_groups: Each source's training scans.
        val_groups: Each source's validation scans.
        shape: The training grid (``config.shape``, else the largest scan per axis; ``()`` when
            the scans share one shape and none is set).
        orientation: ``"RAS"`` for a conformed 3D run, else ``""``.
        record: The split record (``split.json``), completed by the later steps.
    """

    sources: list[str]
    groups: list[list[Scan]]
    atlas: Scan | None
    people: list[str]
    split: dict[str, list[str]]
    train_groups: list[list[Scan]]
    val_groups: list[list[Scan]]
    shape: tuple[int, ...]
    orientation: str
    record: dict[str, Any]


def prepare_data(
    config: TrainConfig, load_validation: bool = True
) -> tuple[PairSource, list[ValidationPair], dict]:
    """Training sampler, validation pairs and the split record (written to split.json).

    What :func:`~hyperreg.training.train.train` trains and validates on for ``config``; public
    so that a baseline trained by other code (a benchmark's fixed-λ model) sees the same pairs
    and the same held-out people.

    Every source is split by person (:attr:`~hyperreg.training.sources.Scan.person`); pairs are
    drawn within a source, each pair's source with probability proportional to its training
    scans, and a share ``config.synth`` of the pairs is synthesised from the training people's
    label maps (plus ``config.synth_labels``). ``load_validation=False`` (ranks other than 0)
    records the split but loads no pairs.

    Returns:
        ``(sampler, validation pairs, split record)``; ``sampler.sample(batch, generator)`` gives
        ``(moving, fixed)`` tensors of shape ``(batch, 1, *spatial)``, intensities in [0, 1].

    Raises:
        ValueError: If no source has enough training scans, or ``synth`` finds no label maps.
        FileNotFoundError: If a source does not exist.
    """
    data = split_data(config)
    sampler, real = training_samplers(config, data)
    val = validation_set(config, data, real, load_validation)
    if load_validation:
        logger.info("data split: %s", data.record["note"])
    return sampler, val, data.record


def split_data(config: TrainConfig) -> DataSplit:
    """Step 1: every source's scans, split by person, the training grid and the split record.

    Raises:
        ValueError: If ``config.data`` is empty, or an atlas is given with several sources.
        FileNotFoundError: If a source does not exist.
    """
    ndim = config.model.ndim
    sources = _sources(config)
    if not sources:
        raise ValueError("train(): 'data' must name at least one source (a folder or CSV list)")
    groups = [find_scans(source, ndim) for source in sources]
    atlas = None
    if config.atlas:
        if len(groups) > 1:
            raise ValueError(f"train(): 'atlas' needs a single data source, got {len(groups)}")
        atlas = Scan(Path(config.atlas), Path(config.atlas_seg) if config.atlas_seg else None)
    people = sorted({scan.person for scans in groups for scan in scans})
    split = split_people(
        people,
        config.seed,
        holdout=config.holdout,
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
        min_train=1 if atlas is not None else 2,
    )
    train_groups = [[s for s in scans if s.person in split["train"]] for scans in groups]
    val_groups = [[s for s in scans if s.person in split["val"]] for scans in groups]
    record: dict[str, Any] = {"seed": config.seed, **split}
    if config.holdout:
        record["holdout"] = sorted(config.holdout)
    record["sources"] = [
        {
            "data": source,
            "train": [s.name for s in train],
            "val": [s.name for s in val],
            "test": [s.name for s in scans if s.person in split["test"]],
        }
        for source, scans, train, val in zip(sources, groups, train_groups, val_groups)
    ]
    shape = _training_grid(config, train_groups, atlas)
    if shape:
        record["shape"] = list(shape)
    orientation = "RAS" if config.conform and ndim == 3 else ""
    return DataSplit(
        sources, groups, atlas, people, split, train_groups, val_groups, shape, orientation, record
    )


def _training_grid(
    config: TrainConfig, train_groups: list[list[Scan]], atlas: Scan | None
) -> tuple[int, ...]:
    """``config.shape``, else the largest training scan (and atlas, and synthesis label map)
    per axis when they differ in shape."""
    ndim = config.model.ndim
    extra_labels = [s for source in config.synth_labels for s in label_map_scans(source, ndim)]
    grid_scans = train_groups + ([[atlas]] if atlas else [])
    grid_scans += [extra_labels] if config.synth > 0 else []
    return tuple(config.shape) or training_shape(
        grid_scans, ndim, slice_axis=config.slice_axis, spacing=config.spacing
    )


def training_samplers(config: TrainConfig, data: DataSplit) -> tuple[Any, list[PairSampler]]:
    """Step 2: the sampler of training pairs, with the real pair samplers it mixes.

    One :class:`~hyperreg.training.data.PairSampler` per source with enough training scans
    (weighted by its scans; a source too small for pairs is kept for validation, with a
    warning), and with ``config.synth`` > 0 the synthesis sampler mixed in at that share (its
    entry ``"synth"`` added to ``data.record``).

    Returns:
        ``(sampler, real samplers)``: the pair source :func:`~hyperreg.training.train.train`
        draws from, and the :class:`~hyperreg.training.data.PairSampler` of each source used
        (none for synthesis only).

    Raises:
        ValueError: If no source has enough training scans, or ``synth`` finds no label maps.
    """
    ndim, groups, atlas = config.model.ndim, data.groups, data.atlas
    has_val = any(data.val_groups)
    holdout = 0 if has_val or config.val_every == 0 or len(groups) > 1 else config.holdout_every
    labelled = config.label_loss != "none" and config.label_weight > 0
    orientation = data.orientation
    options = {
        "slice_axis": config.slice_axis,
        "crop": config.crop,
        "shape": data.shape,
        "spacing": config.spacing,
        "labels": labelled,
        "orientation": orientation,
        "centre": bool(orientation),
        "max_labels": config.max_labels,
    }
    samplers: list[PairSampler] = []
    weights: list[float] = []
    if config.synth < 1:
        for source, train in zip(data.sources, data.train_groups):
            if len(groups) > 1 and not _pairable(train, ndim, config, atlas):
                warnings.warn(
                    f"train(): source '{source}' has {len(train)} training scan(s), too few for "
                    "pairs; it is used for validation only",
                    stacklevel=_TRAIN_CALLER,
                )
                continue
            atlas_image = atlas.image if atlas else None
            sampler = PairSampler(train, ndim, atlas=atlas_image, holdout_every=holdout, **options)
            samplers.append(sampler)
            weights.append(float(len(train)))
        if not samplers:
            raise ValueError("train(): no data source has enough training scans to make pairs")
    mixed: Any = samplers[0] if len(samplers) == 1 else None
    if len(samplers) > 1:
        mixed = MixtureSampler(samplers, weights)
    if config.synth > 0:
        synth, count = _synth_sampler(config, data.train_groups, data.shape, orientation)
        data.record["synth"] = {"fraction": config.synth, "label_maps": count}
        mixed = (
            synth
            if mixed is None
            else MixtureSampler([mixed, synth], [1.0 - config.synth, config.synth])
        )
    return mixed, samplers


def validation_set(
    config: TrainConfig,
    data: DataSplit,
    samplers: list[PairSampler],
    load_validation: bool = True,
) -> list[ValidationPair]:
    """Step 3: the validation pairs, with their mode, note and names added to ``data.record``.

    Held-out people when there are any (``"subjects"``); else, with ``config.val_every`` > 0
    and one source, the held-out slices of the training people (``"slices"``, 2D from 3D) or
    their training pairs (``"training-pairs"``); else none. ``load_validation=False`` records
    the choice but loads no pairs.

    Args:
        config: The run.
        data: Step 1's split (its record is completed here).
        samplers: Step 2's real pair samplers (their held-out slices).
        load_validation: Load the pairs (rank 0) or only record them.
    """
    record = data.record
    val: list[ValidationPair] = []
    if any(data.val_groups):
        val = _held_out_people(config, data, load_validation)
    elif config.val_every > 0 and len(samplers) == 1:
        val = _held_out_slices(config, data, samplers[0], load_validation)
    else:
        record["mode"] = "none"
        record["note"] = "validation off (no held-out people and val_every = 0)"
    record["val_pairs"] = [pair.name for pair in val]
    unlabelled = [pair.name for pair in val if pair.moving_seg is None or pair.fixed_seg is None]
    if unlabelled:
        record["val_unlabelled"] = unlabelled
        if load_validation:
            logger.warning(
                "validation: %d of %d pairs have no label map on one side (%s): their Dice is "
                "not computed%s",
                len(unlabelled),
                len(val),
                ", ".join(unlabelled[:3]),
                "; validation scores by similarity" if len(unlabelled) == len(val) else "",
            )
    return val


def _common(config: TrainConfig, data: DataSplit) -> dict[str, Any]:
    """Loading options shared by every validation pair (see
    :func:`~hyperreg.training.holdout.validation_pairs`)."""
    common: dict[str, Any] = {"slice_axis": config.slice_axis, "spacing": config.spacing}
    if data.orientation:
        common.update(orientation=data.orientation, shape=data.shape)
    return common


def _held_out_people(
    config: TrainConfig, data: DataSplit, load_validation: bool
) -> list[ValidationPair]:
    """Pairs of the validation people of every source that has some (``"subjects"``)."""
    atlas = data.atlas
    data.record["mode"] = "subjects"
    data.record["note"] = f"validation on {len(data.split['val'])} held-out person(s)"
    used = [
        (v, t)
        for v, t in zip(data.val_groups, data.train_groups)
        if len(v) > 1 or (v and (t or atlas))
    ]
    per_group = max(1, config.val_max_pairs // max(1, len(used)))
    val: list[ValidationPair] = []
    for val_scans, train in used:
        pairs = _subject_pairs(val_scans, train, atlas)
        if load_validation:
            val += validation_pairs(
                pairs,
                config.model.ndim,
                slice_every=config.holdout_every,
                max_pairs=per_group,
                **_common(config, data),
            )
    return val


def _held_out_slices(
    config: TrainConfig, data: DataSplit, sampler: PairSampler, load_validation: bool
) -> list[ValidationPair]:
    """With no person to hold out: the sampler's held-out slices of the training people
    (``"slices"``), else their training pairs (``"training-pairs"``), else nothing."""
    record, ndim, atlas = data.record, config.model.ndim, data.atlas
    train_scans = data.train_groups[0]
    pairs = _subject_pairs(train_scans, [], atlas) if len(train_scans) > 1 or atlas else []
    common = {**_common(config, data), "max_pairs": config.val_max_pairs}
    people = len(data.people)
    if sampler.heldout_slices is not None and pairs:
        record["mode"] = "slices"
        record["val_slices"] = sampler.heldout_slices.tolist()
        record["note"] = (
            f"only {people} person(s): nothing held out by person; validation on "
            f"every {config.holdout_every}th brain slice along axis {config.slice_axis}, "
            "not used for training (same people as training)"
        )
        if load_validation:
            return validation_pairs(pairs, ndim, slices=sampler.heldout_slices, **common)
    elif pairs:
        record["mode"] = "training-pairs"
        record["note"] = (
            f"only {people} person(s) and no slices to hold out: validation on "
            "training pairs (not held out)"
        )
        if load_validation:
            return validation_pairs(pairs, ndim, slice_every=config.holdout_every, **common)
    else:
        record["mode"] = "none"
        record["note"] = "no pair to validate on"
    return []


def _subject_pairs(scans: list[Scan], others: list[Scan], atlas: Scan | None) -> list[tuple]:
    """(moving, fixed) validation pairs: each to the atlas, in a cycle, or to a training scan."""
    if atlas is not None:
        return [(scan, atlas) for scan in scans]
    if len(scans) == 2:
        return [(scans[1], scans[0])]
    if len(scans) > 2:
        return [(scans[(i + 1) % len(scans)], scans[i]) for i in range(len(scans))]
    return [(scans[0], others[0])]


def _sources(config: TrainConfig) -> list[str]:
    """``config.data`` as a list of sources (one string or a tuple of them)."""
    if isinstance(config.data, str):
        return [config.data] if config.data else []
    return [str(source) for source in config.data]


def _synth_sampler(
    config: TrainConfig, train_groups: list[list[Scan]], shape: tuple[int, ...], orientation: str
) -> tuple[Any, int]:
    """Synthetic pairs from the training people's label maps and ``config.synth_labels``:
    one :class:`SynthPairSampler` per source (a source holds one label convention, and the two
    maps of a synthetic pair must share one, or the label term compares unlike ids), mixed in
    proportion to their maps. Returns ``(sampler, number of maps)``."""
    ndim = config.model.ndim
    groups = [train for train in train_groups if train]
    groups += [label_map_scans(source, ndim) for source in config.synth_labels]
    samplers, weights = [], []
    for scans in groups:
        maps = label_maps_from_scans(
            scans,
            ndim,
            shape=shape,
            slice_axis=config.slice_axis,
            spacing=config.spacing,
            orientation=orientation,
            centre=bool(orientation),
        )
        if maps:
            samplers.append(
                SynthPairSampler(maps, ndim, crop=config.crop, max_labels=config.max_labels)
            )
            weights.append(float(len(maps)))
    if not samplers:
        raise ValueError(
            "train(): 'synth' needs label maps, but no training scan has one; add label "
            "maps with 'synth_labels' (--synth-labels)"
        )
    count = int(sum(weights))
    return (samplers[0] if len(samplers) == 1 else MixtureSampler(samplers, weights)), count


def _pairable(scans: list[Scan], ndim: int, config: TrainConfig, atlas: Scan | None) -> bool:
    """Whether a source's training scans make pairs: two scans, an atlas, or slices of a volume."""
    if len(scans) >= 2 or (scans and atlas is not None):
        return True
    return bool(scans) and len(scan_shape(scans[0], config.spacing)) > ndim
