"""The VoxelMorph U-Net, run with weights supplied at call time.

:class:`UNet` holds no parameters of its own. It declares the shape and ordinary initialisation
of each of its convolution parameters (:meth:`UNet.param_shapes`, :meth:`UNet.init_std`) and
runs with any ``{name: tensor}`` set, shared by the batch or one per sample (see
:func:`hyperreg.method.layers.conv`). :class:`FixedWeightUNet` is the same network with ordinary
``nn.Parameter`` weights: the baseline for benchmarks and fixed-λ VoxelMorph models. Must not
import hyperreg modules other than ``layers``.

Architecture (Balakrishnan et al., VoxelMorph, IEEE TMI 2019; its PyTorch ``Unet``): encoder
convolutions at 1, 1/2, 1/4, 1/8 resolution (max-pooling between), decoder convolutions each
followed by ×2 nearest upsampling and concatenation with the matching encoder output, then the
remaining full-resolution convolutions and a final flow convolution with ``ndim`` outputs
initialised near zero (std 1e-5). 3×3(×3) kernels, LeakyReLU 0.2. With ``half_res`` the last
decoder level skips its upsampling, so the flow comes out at half resolution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperreg.method.layers import conv

__all__ = ["FixedWeightUNet", "UNet", "halve_max"]

FLOW_INIT_STD = 1e-5


class UNet(nn.Module):
    """VoxelMorph U-Net whose weights are an argument of ``forward``.

    Args:
        ndim: Spatial dimensions, 2 or 3.
        in_channels: Input channels (``2 ×`` channels per image: moving and fixed stacked).
        enc_channels: Encoder widths, one per level (VoxelMorph: 16, 32, 32, 32).
        dec_channels: Decoder widths; the first ``len(enc_channels)`` are the upsampling levels,
            the rest run at the output resolution (VoxelMorph: 32, 32, 32, 32, 32, 16, 16).
        half_res: Output the flow at half resolution (for integration at 1/2).
        kernel_size: Odd convolution size.

    Raises:
        ValueError: On an unsupported ``ndim`` or too few decoder widths.
    """

    def __init__(
        self,
        ndim: int,
        in_channels: int = 2,
        enc_channels: Sequence[int] = (16, 32, 32, 32),
        dec_channels: Sequence[int] = (32, 32, 32, 32, 32, 16, 16),
        half_res: bool = False,
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        if ndim not in (2, 3):
            raise ValueError(f"UNet(): 'ndim' must be 2 or 3, got {ndim}")
        if len(dec_channels) < len(enc_channels):
            raise ValueError(
                f"UNet(): 'dec_channels' needs at least {len(enc_channels)} widths, "
                f"got {tuple(dec_channels)}"
            )
        self.ndim = ndim
        self.half_res = half_res
        self.levels = len(enc_channels)
        self.divisor = 2**self.levels
        kernel = (kernel_size,) * ndim
        shapes: dict[str, tuple[int, ...]] = {}
        stds: dict[str, float] = {}

        def add(name: str, cin: int, cout: int, std: float | None = None) -> None:
            shapes[f"{name}.weight"] = (cout, cin, *kernel)
            shapes[f"{name}.bias"] = (cout,)
            fan_in = cin * math.prod(kernel)
            # Kaiming-normal fan-in for LeakyReLU(0.2) convolutions, zero biases.
            stds[f"{name}.weight"] = std if std is not None else math.sqrt(2 / (1.04 * fan_in))
            stds[f"{name}.bias"] = 0.0

        skips = [in_channels]
        prev = in_channels
        for level, width in enumerate(enc_channels):
            add(f"enc{level}", prev, width)
            skips.append(width)
            prev = width
        for level, width in enumerate(dec_channels[: self.levels]):
            add(f"dec{level}", prev, width)
            prev = width
            if not (half_res and level == self.levels - 1):
                prev += skips.pop()
        for index, width in enumerate(dec_channels[self.levels :]):
            add(f"out{index}", prev, width)
            prev = width
        add("flow", prev, ndim, std=FLOW_INIT_STD)
        self._shapes = shapes
        self._stds = stds
        self._names = [name[: -len(".weight")] for name in shapes if name.endswith(".weight")]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of every parameter, in forward order."""
        return dict(self._shapes)

    def init_std(self) -> dict[str, float]:
        """``{name: std}`` of each parameter's ordinary initialisation."""
        return dict(self._stds)

    def near_zero(self) -> list[str]:
        """Names of the parameters initialised near zero: the flow layer's weight and bias."""
        return ["flow.weight", "flow.bias"]

    def forward(self, x: Tensor, params: Mapping[str, Tensor]) -> Tensor:
        """Run the U-Net.

        Args:
            x: ``(B, in_channels, *S)`` with every spatial size a multiple of ``self.divisor``.
            params: ``{name: tensor}`` for every name in :meth:`param_shapes`, each either of
                that shape (shared) or with a leading batch axis ``B`` (per sample).

        Returns:
            Flow ``(B, ndim, *S)``, or ``(B, ndim, *S/2)`` with ``half_res``.
        """

        def block(name: str, h: Tensor, activate: bool = True) -> Tensor:
            h = conv(h, params[f"{name}.weight"], params[f"{name}.bias"])
            # in place: the convolution's output is needed by nothing else (its backward reads
            # its input), and a new activation-sized tensor per layer costs page faults
            return F.leaky_relu_(h, 0.2) if activate else h

        history = [x]
        h = x
        for level in range(self.levels):
            h = block(f"enc{level}", h)
            history.append(h)
            h = halve_max(h)
        for level in range(self.levels):
            h = block(f"dec{level}", h)
            if not (self.half_res and level == self.levels - 1):
                h = F.interpolate(h, scale_factor=2.0, mode="nearest")
                h = torch.cat([h, history.pop()], dim=1)
        for name in self._names:
            if name.startswith("out"):
                h = block(name, h)
        return block("flow", h, activate=False).contiguous()


def halve_max(x: Tensor) -> Tensor:
    """2 × 2(× 2) max pooling with stride 2, as ``max_pool{2,3}d(x, 2)``.

    Even sizes (the U-Net's, multiples of its divisor) take one element-wise maximum per axis
    over the even and odd slices: the same values as max pooling, about 10× faster than
    PyTorch's CPU ``max_pool3d`` at the U-Net's sizes. Where two inputs tie, the gradient is
    shared between them (max pooling gives it to one); both are subgradients of the maximum.
    Odd sizes fall back to max pooling (which drops the last element).

    Args:
        x: ``(B, C, *S)``, ``len(S)`` in {2, 3}.

    Returns:
        ``(B, C, *S // 2)``.
    """
    if any(size % 2 for size in x.shape[2:]):
        return (F.max_pool2d if x.ndim == 4 else F.max_pool3d)(x, 2)
    for dim in range(2, x.ndim):
        x = torch.maximum(x[_every_other(x.ndim, dim, 0)], x[_every_other(x.ndim, dim, 1)])
    return x


def _every_other(ndim: int, dim: int, start: int) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    index[dim] = slice(start, None, 2)
    return tuple(index)


class FixedWeightUNet(nn.Module):
    """:class:`UNet` with ordinary trainable weights (no hypernetwork).

    Same arguments as :class:`UNet`; weights initialised from :meth:`UNet.init_std`.
    """

    def __init__(self, ndim: int, **kwargs: object) -> None:
        super().__init__()
        self.unet = UNet(ndim, **kwargs)  # type: ignore[arg-type]
        stds = self.unet.init_std()
        self.weights = nn.ParameterDict(
            {
                name.replace(".", "_"): nn.Parameter(torch.randn(shape) * stds[name])
                for name, shape in self.unet.param_shapes().items()
            }
        )

    def forward(self, x: Tensor) -> Tensor:
        """Flow for ``x`` of shape ``(B, in_channels, *S)``; see :meth:`UNet.forward`."""
        params = {name: self.weights[name.replace(".", "_")] for name in self.unet.param_shapes()}
        return self.unet(x, params)
