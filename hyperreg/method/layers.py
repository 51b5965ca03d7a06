"""Convolution whose weight and bias are passed in at call time, shared or per sample.

A hypernetwork gives every sample its own λ and so its own weights. A per-sample convolution
folds the batch into the channel axis and runs one grouped convolution (``groups = B``), which
is exact and needs no Python loop. Must not import hyperreg modules other than ``_checks``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["conv"]

_CONV = {2: F.conv2d, 3: F.conv3d}


def conv(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """'Same'-padded, stride-1 convolution with shared or per-sample weights.

    Args:
        x: Input, shape ``(B, C_in, *S)``, ``len(S)`` in {2, 3}.
        weight: ``(C_out, C_in, *K)`` shared by the batch, or ``(B, C_out, C_in, *K)`` with one
            weight set per sample (``K`` odd).
        bias: ``(C_out,)``, ``(B, C_out)`` or None, matching ``weight``.

    Returns:
        ``(B, C_out, *S)``.

    Raises:
        ValueError: If a per-sample ``weight`` has a batch size other than ``B``.
    """
    ndim = x.ndim - 2
    op = _CONV[ndim]
    padding = weight.shape[-1] // 2
    if weight.ndim == ndim + 2:
        return op(x, weight, bias, padding=padding)
    batch = x.shape[0]
    if weight.shape[0] != batch:
        raise ValueError(
            f"conv(): per-sample 'weight' must have batch size {batch}, got {weight.shape[0]}"
        )
    out_channels = weight.shape[1]
    grouped = op(
        x.reshape(1, batch * x.shape[1], *x.shape[2:]),
        weight.reshape(batch * out_channels, *weight.shape[2:]),
        None if bias is None else bias.reshape(batch * out_channels),
        padding=padding,
        groups=batch,
    )
    return grouped.reshape(batch, out_channels, *grouped.shape[2:])
