"""Configuration dataclasses: defaults in one place, plain dicts in and out.

``from_dict`` rejects unknown keys and names them. Must not import torch or other hyperreg
modules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["ModelConfig", "TrainConfig", "from_dict", "to_dict"]

T = TypeVar("T")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a HyperMorph model (everything needed to rebuild it from a checkpoint)."""

    ndim: int = 2
    in_channels: int = 1  # per image; the U-Net sees 2 * in_channels
    enc_channels: tuple[int, ...] = (16, 32, 32, 32)
    dec_channels: tuple[int, ...] = (32, 32, 32, 32, 32, 16, 16)
    int_steps: int = 7  # 0 = no integration: the U-Net outputs a displacement directly
    # Velocity predicted and integrated at 1/int_downsize resolution. The regulariser on that
    # velocity is multiplied by int_downsize (VoxelMorph's loss_mult), so λ is on the scale of
    # published HyperMorph/VoxelMorph λ (hyperreg.training.train.hypermorph_loss).
    int_downsize: int = 2
    hyper_hidden: tuple[int, ...] = (64, 64, 64, 64)
    parametrization: str = "mip"  # "mip" or "default"
    # Rank of the Δθ head: width of the linear bottleneck feeding the hypernetwork's output layer
    # (benchmarks/RESULTS_hypernet.md). 0 = the legacy full-width head of hyperreg 0.1.0, which is
    # what a checkpoint without this key holds.
    hyper_rank: int = 4
    # Voxel size (mm) the model works at, that of its training data (TrainConfig.spacing): an
    # input pair with other voxels is resampled to isotropic voxels of this size for the network
    # and the field brought back to the fixed grid (hyperreg.registration.pairs.network_grid).
    # 0 = the input's own voxels. Not part of the architecture: the weights do not depend on it.
    spacing: float = 0.0
    # Storage orientation (axis codes, e.g. "RAS") the network was trained in: a 3D pair is
    # resampled onto a grid of these axes for the network and the field brought back
    # (hyperreg.geometry.resample.conformed_grid). "" = the fixed image's own axes (models
    # trained before this setting existed). Not part of the architecture.
    orientation: str = ""
    # Network passes the registration pipeline runs when none are asked for: each pass
    # registers the previous pass's moved image, the fields composed
    # (hyperreg.registration.passes); forward() is always one pass. Not part of the architecture.
    passes: int = 1
    # Test-time flip averaging: in eval mode the network also registers the pair mirrored
    # left-right and the two velocities are averaged (HyperMorph.predict_flow). Needs an
    # ``orientation`` (it names the left-right axis). Not part of the architecture; a model
    # fine-tuned from one that averages keeps it, so its validation (eval mode) averages too.
    flip_average: bool = False

    def __post_init__(self) -> None:
        if self.ndim not in (2, 3):
            raise ValueError(f"ModelConfig(): 'ndim' must be 2 or 3, got {self.ndim}")
        if self.parametrization not in ("mip", "default"):
            raise ValueError(
                "ModelConfig(): 'parametrization' must be one of ('mip', 'default'), "
                f"got {self.parametrization!r}"
            )
        if self.int_downsize not in (1, 2):
            raise ValueError(
                f"ModelConfig(): 'int_downsize' must be 1 or 2, got {self.int_downsize}"
            )
        if self.hyper_rank < 0:
            raise ValueError(
                f"ModelConfig(): 'hyper_rank' must be >= 0 (0 = legacy head), got {self.hyper_rank}"
            )
        if self.int_steps < 0:
            raise ValueError(f"ModelConfig(): 'int_steps' must be >= 0, got {self.int_steps}")
        if not self.spacing >= 0:
            raise ValueError(f"ModelConfig(): 'spacing' must be >= 0 (mm), got {self.spacing}")
        if not 1 <= self.passes <= 4:
            raise ValueError(f"ModelConfig(): 'passes' must be 1 to 4, got {self.passes}")
        if self.flip_average and self.flip_axis() is None:
            raise ValueError(
                "ModelConfig(): 'flip_average' needs an 'orientation' with a left-right axis "
                f"(e.g. 'RAS'), got {self.orientation!r}"
            )

    def flip_axis(self) -> int | None:
        """The spatial axis that runs left-right in the network's grid (the index of ``R`` or
        ``L`` in ``orientation``), or None when the model records no orientation."""
        codes = self.orientation.upper()
        return next((i for i, c in enumerate(codes) if c in "RL"), None)

    def architecture(self) -> dict[str, Any]:
        """Every setting the weights depend on (all but ``spacing``, ``orientation``,
        ``passes`` and ``flip_average``), as a plain dict: what a resumed or fine-tuned run must
        share with its checkpoint."""
        inference = ("spacing", "orientation", "passes", "flip_average")
        return {k: v for k, v in to_dict(self).items() if k not in inference}


# Adam learning rates chosen from measurements (benchmarks/RESULTS_hypernet.md,
# RESULTS_method.md): 1e-3 is the MIP model's best in 2D; at 1e-3 a 3D run on brain volumes
# diverged at step 1283, 1e-4 is VoxelMorph's and HyperMorph's published 3D value.
DEFAULT_LR = {2: 1e-3, 3: 1e-4}


@dataclass(frozen=True)
class TrainConfig:
    """A training run: data, loss, optimiser and schedule."""

    # one or more sources (a str or a tuple of them): neurite-oasis folder, folder of scans or of
    # subject folders, CSV list; pairs are drawn within a source, the split is by person
    data: str | tuple[str, ...] = ""
    out: str = "runs/hypermorph"
    steps: int = 1500
    batch_size: int = 4
    lr: float = 0.0  # Adam learning rate; 0 = DEFAULT_LR for the model's ndim (train() resolves)
    sim: str = "ncc"  # "ncc" or "mse"
    ncc_window: int = 9
    mse_sigma: float = 0.05
    lam_endpoint_fraction: float = 0.2  # share of samples with λ exactly 0 or 1
    atlas: str = ""  # optional fixed atlas image; empty = subject-to-subject pairs
    slice_axis: int = 2  # for 2D training from 3D volumes: axis cut (2 = coronal in neurite-oasis)
    checkpoint_every: int = 500
    keep_checkpoints: int = 3  # training checkpoints kept (newest K); 0 keeps all
    seed: int = 0
    device: str = "auto"
    # validation: every val_every steps; 0 = at each checkpoint when held-out subjects with label
    # maps exist, else off. With too few subjects to hold any out, a positive val_every holds out
    # every holdout_every-th brain slice (2D) instead.
    val_every: int = 0
    val_lambdas: tuple[float, ...] = (0.1, 0.5, 0.9)
    val_fraction: float = 0.1  # share of subjects held out for validation (needs >= 3 subjects)
    test_fraction: float = 0.1  # share of subjects held out for testing (never trained on)
    val_max_pairs: int = 16  # cap on validation pairs (slices x subject pairs)
    holdout_every: int = 10
    atlas_seg: str = ""  # label map of the atlas, for validation Dice in atlas mode
    # speed
    amp: bool = False  # bf16 autocast on CUDA (losses in float32); ignored with a warning on CPU
    compile: bool = False  # torch.compile the model
    crop: tuple[int, ...] = ()  # random crop of each training pair, e.g. (128, 160, 192); () = none
    # draw the next batch and its λ in a background thread while a step runs (same batches,
    # same run; hyperreg.training.prefetch); False draws each batch at the start of its step
    prefetch: bool = True
    # sources and people
    holdout: tuple[str, ...] = ()  # person ids held out for validation (replaces val_fraction)
    shape: tuple[int, ...] = ()  # training grid (pad/crop centred); () = largest scan per axis
    spacing: float = 0.0  # resample scans to isotropic voxels of this size (mm); 0 = keep
    # synthesis (SynthMorph): share of synthetic pairs, 0 = real only, 1 = synthetic only
    synth: float = 0.0
    synth_labels: tuple[str, ...] = ()  # more label maps for synthesis (files or sources)
    init: str = ""  # pretrained model (.pt) to start from: fine-tuning, same architecture
    # optimiser steps the init model's weights had in all (its checkpoints' total_steps count
    # on from it); 0 for a new model
    init_steps: int = 0
    # anatomy-aware objective (hyperreg.method.objective): label overlap of the warped moving
    # label map with the fixed one, where a pair has both ("none" = image similarity only)
    label_loss: str = "none"  # "none", "dice" or "mse"
    label_weight: float = 1.0
    max_labels: int = 24  # labels per pair in the label term (a random subset when more)
    label_downsize: int = 1  # label term on a grid this many times coarser (2: 8x cheaper in 3D)
    # 3D: every scan resampled to RAS storage order (the model records it) and its foreground
    # centred in the training grid: for people each scanned in their own position
    conform: bool = False
    # every k-th step trains the network as the second pass of a recursive cascade (its input
    # is its own moved image, without gradient; the objective is on the composed field;
    # hyperreg.registration.passes): 0 = never
    cascade_every: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)

    def resolved(self) -> TrainConfig:
        """This run as :func:`hyperreg.training.train.train` runs it: ``lr`` 0 replaced by
        :data:`DEFAULT_LR` for the model's ndim, and the model working at the voxel size and
        in the storage orientation it is trained at (``model.spacing = spacing``;
        ``model.orientation = "RAS"`` with ``conform`` in 3D). Idempotent."""
        return dataclasses.replace(
            self,
            lr=self.lr or DEFAULT_LR[self.model.ndim],
            model=dataclasses.replace(
                self.model,
                spacing=float(self.spacing),
                orientation="RAS" if self.conform and self.model.ndim == 3 else "",
            ),
        )


def to_dict(config: Any) -> dict[str, Any]:
    """Plain, JSON-ready dict of a config dataclass (tuples become lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (tuple, list)):
            return [plain(item) for item in value]
        return value

    return plain(dataclasses.asdict(config))


def from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Build ``cls`` from a dict, rejecting unknown keys.

    Raises:
        ValueError: If ``values`` has keys that ``cls`` does not define (they are named).
    """
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{cls.__name__}.from_dict(): unknown keys {unknown}")
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name == "model" and isinstance(value, dict):
            value = from_dict(ModelConfig, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)
