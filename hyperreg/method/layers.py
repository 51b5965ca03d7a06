"""Convolution whose weight and bias are passed in at call time, shared or per sample.

A hypernetwork gives every sample its own λ and so its own weights. A per-sample convolution
folds the batch into the channel axis and runs one grouped convolution (``groups = B``), which
is exact and needs no Python loop. On the CPU, float32 3D convolutions go straight to oneDNN
(``aten::mkldnn_convolution``): PyTorch's dispatcher sends batch-1 3D convolutions with few
voxels × channels (``N·C·D·H`` ≤ 20480: the first layer at 80 × 96 × 112, the coarse levels) to
its reference ``slow_conv3d``, 2-3× slower forward (benchmarks/RESULTS_hypernet.md); with
shared weights they run in channels-last memory (outputs too: call ``.contiguous()`` before
viewing one as flat memory). 2D
convolutions keep the dispatcher's choice, which is faster there. Must not
import hyperreg modules other than ``_checks``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["conv"]

_CONV = {2: F.conv2d, 3: F.conv3d}


def _onednn(x: Tensor, weight: Tensor) -> bool:
    return (
        x.ndim == 5  # 3D only: in 2D the dispatcher's choice is as fast or faster (measured)
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
    )


def _convolve(x: Tensor, weight: Tensor, bias: Tensor | None, padding: int, groups: int) -> Tensor:
    ndim = x.ndim - 2
    if _onednn(x, weight):
        # Shared weights: channels-last 3D memory, which oneDNN convolves 1.2-1.8x faster on
        # the U-Net's shapes (benchmarks/RESULTS_register_speed.md); its output stays
        # channels-last, so a chain of convolutions converts once. Grouped (per-sample)
        # convolutions measured no faster that way and keep the default layout.
        layout = torch.channels_last_3d if groups == 1 else torch.contiguous_format
        return torch.ops.aten.mkldnn_convolution(
            x.contiguous(memory_format=layout),
            weight.contiguous(memory_format=layout),
            None if bias is None else bias.contiguous(),
            [padding] * ndim,
            [1] * ndim,
            [1] * ndim,
            groups,
        )
    return _CONV[ndim](x, weight, bias, padding=padding, groups=groups)


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
    padding = weight.shape[-1] // 2
    if weight.ndim == ndim + 2:
        return _convolve(x, weight, bias, padding, 1)
    batch = x.shape[0]
    if weight.shape[0] != batch:
        raise ValueError(
            f"conv(): per-sample 'weight' must have batch size {batch}, got {weight.shape[0]}"
        )
    out_channels = weight.shape[1]
    grouped = _convolve(
        x.reshape(1, batch * x.shape[1], *x.shape[2:]),
        weight.reshape(batch * out_channels, *weight.shape[2:]),
        None if bias is None else bias.reshape(batch * out_channels),
        padding,
        batch,
    )
    return grouped.reshape(batch, out_channels, *grouped.shape[2:])
