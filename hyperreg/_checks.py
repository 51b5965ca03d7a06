"""Shared input validation for the public boundaries (private).

Messages follow one format: ``"<function>(): '<arg>' must be <expectation>, got <actual>"``.
An error about one argument is an :class:`~hyperreg._errors.InputError`, which keeps that format
for Python callers and carries its parts as data.
Must not import anything from hyperreg except nothing; torch only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from hyperreg._errors import InputError


OPTIONS_MSG = "{0} must be one of {choices}, got {value!r}"


def check_option(fn: str, arg: str, value: object, choices: Sequence[object]) -> None:
    """Raise InputError (a ValueError) if ``value`` is not one of ``choices``."""
    if value not in choices:
        raise InputError(fn, OPTIONS_MSG, arg, choices=tuple(choices), value=value)


def check_float_tensor(fn: str, arg: str, x: object) -> None:
    """Raise TypeError unless ``x`` is a floating-point tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): '{arg}' must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{fn}(): '{arg}' must be a floating-point tensor, got {x.dtype}")


def check_image(fn: str, arg: str, x: Tensor) -> None:
    """Raise unless ``x`` is a float tensor of shape (B, C, H, W) or (B, C, D, H, W)."""
    check_float_tensor(fn, arg, x)
    if x.ndim not in (4, 5):
        raise ValueError(
            f"{fn}(): '{arg}' must have shape (B, C, H, W) or (B, C, D, H, W), got {tuple(x.shape)}"
        )


def check_field(
    fn: str, arg: str, field: Tensor, spatial_shape: Sequence[int] | None = None
) -> None:
    """Raise unless ``field`` is a float tensor ``(B, N, *S)`` with ``N = len(S)``."""
    check_image(fn, arg, field)
    ndim = field.ndim - 2
    if field.shape[1] != ndim:
        raise ValueError(
            f"{fn}(): '{arg}' must have {ndim} channels (one per spatial axis), "
            f"got shape {tuple(field.shape)}"
        )
    if spatial_shape is not None and tuple(field.shape[2:]) != tuple(spatial_shape):
        raise ValueError(
            f"{fn}(): '{arg}' must have spatial shape {tuple(spatial_shape)}, "
            f"got {tuple(field.shape[2:])}"
        )


def check_same_shape(fn: str, names: tuple[str, str], a: Tensor, b: Tensor) -> None:
    """Raise ValueError unless two image tensors share batch, channel and spatial shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{fn}(): '{names[0]}' and '{names[1]}' must have the same shape, got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )


def as_lambda_tensor(
    fn: str,
    lam: object,
    batch: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Validate λ and return it as a tensor of shape ``(L, 1)`` with ``L`` in {1, batch}.

    Accepted: a Python float, or a tensor of shape ``()``, ``(L,)`` or ``(L, 1)``. ``L == 1`` means
    one λ for the whole batch (documented, not a silent broadcast); ``L == batch`` means one λ per
    sample. Values must be finite and in [0, 1]; they are never clamped. The result has the given
    ``device`` and floating ``dtype`` (pass the images' dtype, so a float64 model gets float64 λ).
    """
    if isinstance(lam, bool):
        raise TypeError(f"{fn}(): 'lam' must be a float or a tensor, got bool")
    if isinstance(lam, (int, float)):
        lam_t = torch.tensor([[float(lam)]], dtype=dtype, device=device)
    elif isinstance(lam, Tensor):
        if lam.ndim > 2 or (lam.ndim == 2 and lam.shape[1] != 1):
            raise ValueError(
                f"{fn}(): 'lam' must have shape (), (L,) or (L, 1), got {tuple(lam.shape)}"
            )
        lam_t = lam.reshape(-1, 1).to(device=device, dtype=dtype)
    else:
        raise TypeError(f"{fn}(): 'lam' must be a float or a tensor, got {type(lam).__name__}")
    if lam_t.shape[0] not in (1, batch):
        raise ValueError(
            f"{fn}(): 'lam' must hold 1 value or one per sample ({batch}), "
            f"got {lam_t.shape[0]} values"
        )
    bad = ~torch.isfinite(lam_t) | (lam_t < 0) | (lam_t > 1)
    if bool(bad.any()):
        values = [v for v in lam_t.flatten().tolist() if not (0.0 <= v <= 1.0) or math.isnan(v)]
        raise InputError(fn, "{0} must lie in [0, 1], got {values}", "lam", values=values[:4])
    return lam_t


DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
_DEVICE_MSG = "{0} must be " + DEVICE_CHOICES + ", got {device!r}"


def resolve_device(fn: str, device: str | torch.device) -> torch.device:
    """Turn ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` into a usable ``torch.device``.

    ``"auto"`` picks CUDA when available at call time (never at import).

    Raises:
        ValueError: On an unknown device string, or CUDA asked for where none is available.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise InputError(fn, _DEVICE_MSG, "device", device=device) from err
    if resolved.type not in ("cpu", "cuda"):
        raise InputError(fn, _DEVICE_MSG, "device", device=device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise InputError(
            fn, "{0} is {device!r} but CUDA is not available here; use cpu", "device", device=device
        )
    return resolved
