"""The hypernetwork: maps λ to the weights of another network (MIP or default parametrisation).

This module knows nothing about registration. Its inputs are a λ tensor and a dict of target
parameter shapes; its output is ``{name: tensor}`` with one weight set per λ row. Must not import
any hyperreg module other than ``_checks``.

MIP (magnitude-invariant parametrisation; Gonzalez Ortiz, Guttag, Dalca, ICLR 2024) in this code:

* input encoding :func:`encode_lambda`: each hyperparameter ``λ`` becomes
  ``[cos(πλ/2), sin(πλ/2)]``, a code of constant norm, so the trunk's activations do not scale
  with λ (with the default, raw-λ input and no biases, λ = 0 would give all-zero weights);
* output encoding: ``θ(λ) = θ0 + Δθ(E(λ))`` with independent ``base_weights`` θ0 initialised
  like the primary network and a ``weight_delta`` head Δθ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from hyperreg._checks import check_option

__all__ = ["PARAMETRIZATIONS", "HyperNetwork", "encode_lambda"]

PARAMETRIZATIONS = ("mip", "default")


def encode_lambda(lam: Tensor) -> Tensor:
    """Map λ to a constant-norm code, the MIP input encoding.

    The code is ``[cos(π·λ/2), sin(π·λ/2)]`` per hyperparameter, whose L2 norm is 1 for every
    λ, so the magnitude of the hypernetwork output does not scale with λ.

    Args:
        lam: Hyperparameters, shape ``(B, H)`` (``H = 1`` for HyperMorph's λ), values in [0, 1].

    Returns:
        Encoded λ, shape ``(B, 2H)`` (cos terms first, then sin terms), same dtype and device.

    Raises:
        ValueError: If ``lam`` is not 2D or any value lies outside ``[0, 1]`` (NaN included).

    References:
        Gonzalez Ortiz, Guttag, Dalca. Magnitude Invariant Parametrizations Improve
        Hypernetwork Learning. ICLR 2024 (arXiv:2304.07645).
    """
    if lam.ndim != 2:
        raise ValueError(f"encode_lambda(): 'lam' must have shape (B, H), got {tuple(lam.shape)}")
    if not bool(((lam >= 0) & (lam <= 1)).all()):
        raise ValueError("encode_lambda(): 'lam' must lie in [0, 1]")
    angle = lam * (math.pi / 2)
    return torch.cat([torch.cos(angle), torch.sin(angle)], dim=1)


class HyperNetwork(nn.Module):
    """MLP from λ to a full set of target weights, one set per row of λ.

    Args:
        target_shapes: ``{name: shape}`` of every parameter to generate.
        init_std: ``{name: std}`` of each target's ordinary initialisation (e.g. Kaiming fan-in
            for convolution weights, 0 for biases, 1e-5 for a near-zero flow layer). θ0 is drawn
            from it, and the delta head of that target is scaled by it, so a target that starts
            near zero stays near zero at every λ.
        num_inputs: Number of hyperparameters ``H`` (1 for HyperMorph).
        hidden: Widths of the MLP trunk (LeakyReLU 0.2 after each layer).
        parametrization: ``"mip"`` (encoded input, θ0 + Δθ) or ``"default"`` (raw λ in, θ = h(λ)
            out, no θ0; the baseline MIP is measured against).

    Raises:
        ValueError: On an unknown parametrisation, empty ``hidden`` or a target without std.
    """

    def __init__(
        self,
        target_shapes: Mapping[str, Sequence[int]],
        init_std: Mapping[str, float],
        num_inputs: int = 1,
        hidden: Sequence[int] = (64, 64, 64, 64),
        parametrization: str = "mip",
    ) -> None:
        super().__init__()
        check_option("HyperNetwork", "parametrization", parametrization, PARAMETRIZATIONS)
        if len(hidden) == 0:
            raise ValueError("HyperNetwork(): 'hidden' must list at least one width, got ()")
        missing = sorted(set(target_shapes) - set(init_std))
        if missing:
            raise ValueError(f"HyperNetwork(): 'init_std' lacks entries for {missing}")
        self.parametrization = parametrization
        self.num_inputs = num_inputs
        self.target_shapes = {
            name: tuple(int(s) for s in shape) for name, shape in target_shapes.items()
        }
        sizes = [math.prod(shape) for shape in self.target_shapes.values()]
        self._sizes = sizes
        total = sum(sizes)

        in_features = 2 * num_inputs if parametrization == "mip" else num_inputs
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.LeakyReLU(0.2)]
            in_features = width
        self.trunk = nn.Sequential(*layers)
        self.weight_delta = nn.Linear(in_features, total, bias=parametrization == "default")
        stds = torch.cat(
            [torch.full((n,), float(init_std[name])) for name, n in zip(self.target_shapes, sizes)]
        )
        if parametrization == "mip":
            self.base_weights = nn.Parameter(torch.randn(total) * stds)
        else:
            self.register_parameter("base_weights", None)
        self._init_weights(stds)

    @torch.no_grad()
    def _init_weights(self, stds: Tensor) -> None:
        width = self.weight_delta.in_features
        if self.parametrization == "mip":
            # Trunk: Kaiming-normal fan-out, zero bias (MIP paper). Head: each target's rows
            # scaled by that target's own std, so Δθ starts small relative to θ0.
            for layer in self.trunk:
                if isinstance(layer, nn.Linear):
                    nn.init.kaiming_normal_(
                        layer.weight, a=0.2, mode="fan_out", nonlinearity="leaky_relu"
                    )
                    nn.init.zeros_(layer.bias)
            self.weight_delta.weight.copy_(
                torch.randn_like(self.weight_delta.weight) * stds[:, None] / math.sqrt(width)
            )
            return
        # Default parametrisation: PyTorch's ordinary Linear init in the trunk (with biases); the
        # head is calibrated so that the generated weights have each target's std at λ ~ U(0, 1).
        probe = self.trunk(torch.rand(256, self.num_inputs))
        rms = float(probe.pow(2).mean().sqrt().clamp_min(1e-6))
        self.weight_delta.weight.copy_(
            torch.randn_like(self.weight_delta.weight) * stds[:, None] / (math.sqrt(width) * rms)
        )
        nn.init.zeros_(self.weight_delta.bias)

    def encode(self, lam: Tensor) -> Tensor:
        """Trunk input for ``lam`` of shape ``(L, H)``: the MIP code, or raw λ by default."""
        return encode_lambda(lam) if self.parametrization == "mip" else lam

    def forward(self, lam: Tensor) -> dict[str, Tensor]:
        """Generate one weight set per row of ``lam``.

        Args:
            lam: ``(L, H)`` hyperparameters in [0, 1].

        Returns:
            ``{name: tensor of shape (L, *shape)}`` for every target.

        Raises:
            ValueError: If ``lam`` is not ``(L, H)`` with ``H = num_inputs``.
        """
        if lam.ndim != 2 or lam.shape[1] != self.num_inputs:
            raise ValueError(
                f"HyperNetwork.forward(): 'lam' must have shape (L, {self.num_inputs}), "
                f"got {tuple(lam.shape)}"
            )
        flat = self.weight_delta(self.trunk(self.encode(lam)))
        if self.base_weights is not None:
            flat = flat + self.base_weights
        chunks = flat.split(self._sizes, dim=1)
        return {
            name: chunk.reshape(lam.shape[0], *shape)
            for (name, shape), chunk in zip(self.target_shapes.items(), chunks)
        }
