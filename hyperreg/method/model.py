"""HyperMorph: a MIP hypernetwork, the U-Net it feeds, and the spatial transformer.

``HyperMorph(moving, fixed, lam)`` generates U-Net weights for each λ, predicts a velocity (or
displacement), integrates it and warps ``moving``. Checkpoints hold a format version, the full
model config and the weights, and load strictly. Must not import io, data, train or cli.

λ batch semantics (a documented decision): ``lam`` is either one value for the whole batch
(a float, or a tensor with one element) or one value per sample (shape ``(B,)`` or ``(B, 1)``).
Per-sample λ gives every sample its own generated weights (grouped convolutions). Any other
count raises ``ValueError``; nothing is broadcast or dropped silently.

References:
    Hoopes, Hoffmann, Fischl, Guttag, Dalca. HyperMorph: Amortized Hyperparameter Learning for
    Image Registration. IPMI 2021; MELBA 2022.
    Gonzalez Ortiz, Guttag, Dalca. Magnitude Invariant Parametrizations Improve Hypernetwork
    Learning. ICLR 2024.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperreg import __version__
from hyperreg._checks import as_lambda_tensor, check_image, check_same_shape
from hyperreg._files import atomic_write
from hyperreg.config import ModelConfig, from_dict, to_dict
from hyperreg.method.hypernet import HyperNetwork
from hyperreg.method.objective import Objective
from hyperreg.method.spatial import integrate_velocity, resize_field, warp
from hyperreg.method.unet import UNet

__all__ = [
    "FORMAT_VERSION",
    "HyperMorph",
    "RegistrationOutput",
    "checkpoint_config",
    "checkpoint_objective",
    "load_checkpoint",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Model-config values implied by a checkpoint that lacks the key (written before it existed).
LEGACY_MODEL_DEFAULTS: dict[str, Any] = {"hyper_rank": 0}


class RegistrationOutput(NamedTuple):
    """Result of one registration forward pass.

    Attributes:
        moved: Warped moving image ``(B, C, *S)``.
        disp: Displacement ``(B, N, *S)`` in voxels of the fixed grid (``moved[x] = moving(x +
            disp(x))``).
        velocity: Stationary velocity ``(B, N, *S')`` that ``disp`` integrates (``S'`` = ``S`` /
            ``int_downsize``), or None when the model predicts displacements directly.
    """

    moved: Tensor
    disp: Tensor
    velocity: Tensor | None


class HyperMorph(nn.Module):
    """One model for every λ: hypernetwork + U-Net + integration + warp.

    Args:
        config: Architecture (:class:`hyperreg.config.ModelConfig`).
    """

    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else ModelConfig()
        cfg = self.config
        self.half_res = cfg.int_steps > 0 and cfg.int_downsize == 2
        self.unet = UNet(
            cfg.ndim,
            in_channels=2 * cfg.in_channels,
            enc_channels=cfg.enc_channels,
            dec_channels=cfg.dec_channels,
            half_res=self.half_res,
        )
        self.hypernet = HyperNetwork(
            self.unet.param_shapes(),
            self.unet.init_std(),
            num_inputs=1,
            hidden=cfg.hyper_hidden,
            parametrization=cfg.parametrization,
            rank=cfg.hyper_rank,
            zero_delta=self.unet.near_zero(),
        )
        self._weight_cache: tuple[tuple, dict[str, Tensor]] | None = None
        # what the model was trained on (stored in checkpoints; refinement optimises the same)
        self.objective = Objective(int_downsize=cfg.int_downsize if cfg.int_steps > 0 else 1)

    def generate_weights(self, lam: Tensor) -> dict[str, Tensor]:
        """U-Net weights for each row of ``lam`` (``(L, 1)``): ``{name: (L, *shape)}``."""
        return self.hypernet(lam)

    def train(self, mode: bool = True) -> HyperMorph:
        """As :meth:`torch.nn.Module.train`; also drops the inference weight cache."""
        self._weight_cache = None
        return super().train(mode)

    def _inference_weights(self, lam: Tensor) -> dict[str, Tensor]:
        """:meth:`generate_weights` in eval mode without autograd, reused while nothing changed.

        Inference registers many pairs at one λ (``batch``, repeated ``register`` calls): the
        weights of the last λ are kept, keyed by the λ values, dtype and device and by every
        parameter's storage and in-place version counter, so an optimiser step,
        ``load_state_dict`` or ``.to()`` regenerates them (writes through ``.data`` are not
        seen: call :meth:`train` or ``eval()`` after such a change).
        """
        # Tensor._version: autograd's counter of in-place writes (bumped by optimisers, copy_)
        state = tuple((p.data_ptr(), p._version) for p in self.parameters())
        key = (lam.device, lam.dtype, tuple(lam.flatten().tolist()), state)
        if self._weight_cache is not None and self._weight_cache[0] == key:
            return self._weight_cache[1]
        params = self.generate_weights(lam)
        self._weight_cache = (key, params)
        return params

    def forward(self, moving: Tensor, fixed: Tensor, lam: float | Tensor) -> RegistrationOutput:
        """Register ``moving`` to ``fixed`` at regularisation weight ``lam``.

        Any spatial size works: images are zero-padded to a multiple of 16 (2**levels) and the
        field is cropped back, so outputs have the input's spatial shape.

        In eval mode, a model whose config sets ``flip_average`` predicts its flow twice, for
        the pair as given and mirrored along the left-right axis of ``config.orientation``,
        and averages the two velocities (the mirrored one mirrored back): test-time
        augmentation with the brain's left-right symmetry; twice the U-Net's cost. In training
        mode it never does.

        Args:
            moving: ``(B, C, *S)`` float image, intensities in [0, 1], ``C = in_channels``.
            fixed: Same shape as ``moving``.
            lam: λ in [0, 1]: a float or one-element tensor (one λ for the batch), or a tensor
                of shape ``(B,)`` / ``(B, 1)`` (one λ, and so one weight set, per sample).

        Returns:
            :class:`RegistrationOutput` ``(moved, disp, velocity)``.

        Raises:
            TypeError: If an image is not a float tensor or ``lam`` has the wrong type.
            ValueError: If shapes differ or do not match the config, or ``lam`` has a count
                other than 1 or B, or a value outside [0, 1] (NaN included).
        """
        params = self._weights("HyperMorph.forward", moving, fixed, lam)
        return self._register(moving, fixed, params)

    def predict_flow(self, moving: Tensor, fixed: Tensor, lam: float | Tensor) -> Tensor:
        """The U-Net's raw output for a pair: what :meth:`flow_to_output` turns into a result.

        ``model(moving, fixed, lam)`` equals ``model.flow_to_output(model.predict_flow(moving,
        fixed, lam), moving)``. Test-time refinement (:mod:`hyperreg.registration.refine`)
        optimises this tensor directly, so the refined field goes through exactly the model's
        integration, resizing and cropping.

        Args:
            moving, fixed, lam: As :meth:`forward`.

        Returns:
            ``(B, N, *P')``: the velocity (``int_steps > 0``; voxels of its own grid, at half
            resolution when ``int_downsize == 2``) or the displacement (``int_steps == 0``), on
            the padded grid ``P`` (each size rounded up to a multiple of 16), ``P' = P / 2`` at
            half resolution.

        Raises:
            TypeError, ValueError: As :meth:`forward`.
        """
        params = self._weights("HyperMorph.predict_flow", moving, fixed, lam)
        return self._flow(moving, fixed, params)

    def flow_to_output(self, flow: Tensor, moving: Tensor) -> RegistrationOutput:
        """Integrate (and upsample) a raw flow from :meth:`predict_flow`, crop, warp ``moving``.

        Differentiable in ``flow``. The inverse transform of a diffeomorphic model is
        ``flow_to_output(-flow, ...)``: ``exp(-v)`` undoes ``exp(v)``.

        Args:
            flow: ``(B, N, *P')`` raw flow, as :meth:`predict_flow` returns it.
            moving: ``(B, C, *S)`` image to warp; ``S`` sets the crop.

        Returns:
            :class:`RegistrationOutput` ``(moved, disp, velocity)`` as :meth:`forward` returns.

        Raises:
            ValueError: If ``flow``'s shape does not match the padded grid of ``moving``.
        """
        spatial = tuple(moving.shape[2:])
        padded = self._padded_shape(spatial)
        expected = tuple(p // 2 for p in padded) if self.half_res else padded
        if flow.ndim != moving.ndim or tuple(flow.shape[2:]) != expected:
            raise ValueError(
                f"HyperMorph.flow_to_output(): 'flow' must have spatial shape {expected} for "
                f"images of shape {spatial}, got {tuple(flow.shape)}"
            )
        return self._finish(flow, moving, spatial, padded)

    def _weights(
        self, fn: str, moving: Tensor, fixed: Tensor, lam: float | Tensor
    ) -> dict[str, Tensor]:
        check_image(fn, "moving", moving)
        check_image(fn, "fixed", fixed)
        check_same_shape(fn, ("moving", "fixed"), moving, fixed)
        cfg = self.config
        if moving.ndim - 2 != cfg.ndim or moving.shape[1] != cfg.in_channels:
            raise ValueError(
                f"{fn}(): 'moving' must have {cfg.in_channels} channel(s) and "
                f"{cfg.ndim} spatial dims for this model, got shape {tuple(moving.shape)}"
            )
        lam_t = as_lambda_tensor(fn, lam, moving.shape[0], moving.device, moving.dtype)
        if self.training or torch.is_grad_enabled():
            params = self.generate_weights(lam_t)
        else:
            params = self._inference_weights(lam_t)
        if lam_t.shape[0] == 1:
            params = {name: value[0] for name, value in params.items()}
        return params

    def _padded_shape(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(math.ceil(s / self.unet.divisor) * self.unet.divisor for s in spatial)

    def _pad(self, x: Tensor) -> Tensor:
        spatial = tuple(x.shape[2:])
        pad: list[int] = []
        for size, target in reversed(list(zip(spatial, self._padded_shape(spatial)))):
            pad += [0, target - size]
        return F.pad(x, pad) if any(pad) else x

    def _register(
        self, moving: Tensor, fixed: Tensor, params: dict[str, Tensor]
    ) -> RegistrationOutput:
        spatial = tuple(moving.shape[2:])
        flow = self._flow(moving, fixed, params)
        return self._finish(flow, moving, spatial, self._padded_shape(spatial))

    def _flow(self, moving: Tensor, fixed: Tensor, params: dict[str, Tensor]) -> Tensor:
        """The U-Net's flow on the padded pair; in eval mode with ``config.flip_average``, the
        mean of it and of the flow of the pair mirrored left-right, mirrored back."""
        pair = self._pad(torch.cat([moving, fixed], dim=1))
        flow = self.unet(pair, params)
        axis = self.config.flip_axis() if self.config.flip_average else None
        if self.training or axis is None:
            return flow
        dim = 2 + axis  # the mirrored flow's component along the axis changes sign
        sign = torch.ones(flow.shape[1], device=flow.device, dtype=flow.dtype)
        sign[axis] = -1
        mirrored = self.unet(pair.flip(dim), params).flip(dim)
        return (flow + mirrored * sign.view(1, -1, *[1] * (flow.ndim - 2))) / 2

    def _finish(
        self, flow: Tensor, moving: Tensor, spatial: tuple[int, ...], padded: tuple[int, ...]
    ) -> RegistrationOutput:
        cfg = self.config
        velocity: Tensor | None = None
        if cfg.int_steps > 0:
            velocity = flow
            disp = integrate_velocity(velocity, cfg.int_steps)
            if self.half_res:
                # upsampled on the image's voxels alone (not the padded grid's, then cropped):
                # the same values, bitwise, and no zero-filled copies in the backward pass
                disp = resize_field(disp, 2.0, crop=spatial)
        else:
            disp = flow
        if padded != spatial:
            if tuple(disp.shape[2:]) != spatial:
                disp = disp[(slice(None), slice(None), *[slice(0, s) for s in spatial])]
            if velocity is not None:
                factor = 2 if self.half_res else 1
                crop = [slice(0, math.ceil(s / factor)) for s in spatial]
                velocity = velocity[(slice(None), slice(None), *crop)]
        moved = warp(moving, disp, exact=False)
        return RegistrationOutput(moved, disp, velocity)


def save_checkpoint(
    model: HyperMorph,
    path: str | os.PathLike[str],
    *,
    weights_dtype: torch.dtype | None = None,
    **extra: Any,
) -> Path:
    """Write ``{format_version, hyperreg_version, model_config, state_dict, **extra}`` atomically.

    The file is written to a temporary name in the same folder and renamed, so an interrupted
    save never leaves a truncated checkpoint. Tensors are moved to the CPU first, so a checkpoint
    saved on a GPU loads anywhere.

    Args:
        model: The model.
        path: Output file.
        weights_dtype: Store floating-point weights in this dtype (e.g. ``torch.float16`` for
            the bundled models: half the file, weights within 2^-11 relative); they are cast
            back to the model's dtype on loading. Default: as they are.
        **extra: More top-level entries (step, training config, ...).

    Returns:
        The checkpoint path.
    """
    path = Path(path)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if weights_dtype is not None:
        state = {k: v.to(weights_dtype) if v.is_floating_point() else v for k, v in state.items()}
    payload = {
        "format_version": FORMAT_VERSION,
        "hyperreg_version": __version__,
        "model_config": to_dict(model.config),
        "state_dict": state,
        "objective": model.objective.to_dict(),
        **extra,
    }
    atomic_write(path, lambda tmp: torch.save(payload, tmp))
    return path


def checkpoint_config(payload: dict[str, Any]) -> ModelConfig:
    """The :class:`~hyperreg.config.ModelConfig` a checkpoint payload describes.

    Files written before a field existed were written by the architecture its legacy value
    describes (no ``hyper_rank``: the full-width head of hyperreg 0.1.0); one without
    ``spacing`` works at the voxel size its training recorded (``train_config.spacing``).

    Raises:
        ValueError: If the stored config has unknown keys or invalid values.
    """
    values = {**LEGACY_MODEL_DEFAULTS, **payload["model_config"]}
    if "spacing" not in values:
        values["spacing"] = float(payload.get("train_config", {}).get("spacing", 0.0) or 0.0)
    return from_dict(ModelConfig, values)


def checkpoint_objective(payload: dict[str, Any], default: Objective) -> Objective:
    """The :class:`~hyperreg.method.objective.Objective` a checkpoint payload was trained on.

    Files written before the objective was stored give it from their training config
    (``sim``, ``ncc_window``, ``mse_sigma``: a model trained with MSE is refined with MSE), else
    ``default``.

    Raises:
        ValueError: If the stored objective has unknown keys or invalid values.
    """
    if "objective" in payload:
        return Objective.from_dict(payload["objective"])
    train = payload.get("train_config") or {}
    if not train:
        return default
    return dataclasses.replace(
        default,
        similarity=train.get("sim", default.similarity),
        ncc_window=int(train.get("ncc_window", default.ncc_window)),
        mse_sigma=float(train.get("mse_sigma", default.mse_sigma)),
    )


def load_checkpoint(
    path: str | os.PathLike[str], map_location: str | torch.device = "cpu"
) -> tuple[HyperMorph, dict[str, Any]]:
    """Rebuild a model from a checkpoint and load its weights strictly.

    Args:
        path: File written by :func:`save_checkpoint`.
        map_location: Device for the weights (default CPU, whatever device saved it).

    Returns:
        ``(model, payload)``: the model in eval mode and the whole checkpoint dict (for extra
        entries such as the training config).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file is not a readable hyperreg checkpoint.
        RuntimeError: If its ``format_version`` is unknown or its weights do not match its config.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_checkpoint(): no such file: '{path}'")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for a bad file
        raise ValueError(
            f"load_checkpoint(): cannot read '{path}': not a hyperreg checkpoint ({err})"
        ) from err
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise ValueError(
            f"load_checkpoint(): '{path}' is not a hyperreg checkpoint (no format_version)"
        )
    if payload["format_version"] != FORMAT_VERSION:
        raise RuntimeError(
            f"load_checkpoint(): '{path}' has format_version {payload['format_version']}, "
            f"this hyperreg ({__version__}) reads format_version {FORMAT_VERSION}"
        )
    model = HyperMorph(checkpoint_config(payload))
    model.load_state_dict(payload["state_dict"], strict=True)
    model.objective = checkpoint_objective(payload, model.objective)
    model.to(map_location)
    model.eval()
    return model, payload
