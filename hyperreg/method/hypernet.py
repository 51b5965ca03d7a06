"""The hypernetwork: maps λ to the weights of another network (MIP or default parametrisation).

This module knows nothing about registration. Its inputs are a λ tensor and a dict of target
parameter shapes; its output is ``{name: tensor}`` with one weight set per λ row. Must not import
any hyperreg module other than ``_checks``.

MIP (magnitude-invariant parametrisation; Gonzalez Ortiz, Guttag, Dalca, ICLR 2024) in this code:

* input encoding :func:`encode_lambda`: each hyperparameter ``λ`` becomes
  ``[cos(πλ/2), sin(πλ/2)]``, a code of constant norm, so the trunk's activations do not scale
  with λ;
* output encoding: ``θ(λ) = θ0 + Δθ(E(λ))`` with independent ``base_weights`` θ0 initialised
  like the primary network and a ``weight_delta`` head Δθ.

The default parametrisation is the paper's baseline: raw λ in, a Kaiming-normal (fan-in) trunk
with zero biases, ``θ = h(λ)`` out and no θ0. LeakyReLU is positively homogeneous, so at
initialisation ``h(λ) = λ · h(1)``: the generated weights scale with λ and are all zero at λ = 0,
the magnitude pathology MIP removes.

Compact head (``rank > 0``): the trunk ends in a linear bottleneck of width ``rank`` and the head
is ``Δθ = m · U · [n(V · h), √2 · E(λ)]`` with ``U`` of shape ``(targets, rank + 2H)``, so the
head costs ``(rank + 2H) × targets`` parameters instead of ``hidden[-1] × targets``. In MIP mode
the λ code ``E(λ)`` itself reaches the head beside the trunk's features (a skip connection):
without it the deep trunk maps λ = 0 and λ = 1 to nearly parallel features and the generated
weights learn to depend on λ far too slowly (measured: after 80 steps the λ = 1 field was larger
than the λ = 0 one). λ is one number, so
``Δθ(λ)`` traces a curve in weight space and a small rank loses little (measured in
``benchmarks/RESULTS_hypernet.md``).

Step size (MIP, ``rank > 0``). Adam moves every parameter by about ``lr`` per step whatever its
scale, so a generated weight that sums ``rank`` head terms would move ``rank`` times as far as an
ordinary weight. Two fixed reparametrisations keep a generated weight's Adam step close to an
ordinary weight's (a muP-style output multiplier with compensated initialisation, Yang et al.,
Tensor Programs V, 2022):

* the head input is RMS-normalised, ``n(z) = z / rms(z)``, and the λ code is scaled to RMS 1
  too, so the head input ``x`` of width ``d = rank + 2H`` has ``‖x‖₁ ≤ d``;
* the head output is multiplied by the constant ``m = HEAD_STEP / d`` and ``U`` is drawn
  ``1/m`` larger, so the initial Δθ is unchanged while one Adam step moves Δθ by at most
  ``HEAD_STEP · lr`` through ``U``;
* trunk layers carry the multiplier ``1/fan_in`` (weights drawn ``fan_in`` times larger), so
  one Adam step changes each hidden feature by about ``lr`` rather than ``fan_in · lr``.

θ0 itself moves by ``lr`` like any ordinary weight, so a generated weight moves by about
``(1 + HEAD_STEP) · lr`` on the first step (bounded by ``2 · lr`` in the tests). Heads of targets
initialised near zero (the flow layer) start at exactly zero: their Δθ is 0 at every λ and θ0
keeps the target's own near-zero init.

``rank = 0`` is the legacy layout of hyperreg ≤ 0.1.0 checkpoints (head reading the last hidden
layer directly, no multipliers, no normalisation); it is kept so old checkpoints load and give
identical outputs.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperreg._checks import check_option

__all__ = ["DELTA_INIT", "HEAD_STEP", "PARAMETRIZATIONS", "HyperNetwork", "encode_lambda"]

PARAMETRIZATIONS = ("mip", "default")
HEAD_STEP = 0.5  # bound on the head's share of one Adam step of a generated weight, in units of lr
DELTA_INIT = 0.5  # std of the initial Δθ relative to θ0's (MIP, rank > 0)
TRUNK_STEP = 0.1  # trunk multiplier TRUNK_STEP / fan_in: its Adam step in lr (MIP, rank > 0)
_LEAKY = 0.2
_RMS_EPS = 1e-12


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


def _kaiming_std(fan: int) -> float:
    """Kaiming-normal std for LeakyReLU(0.2) with the given fan."""
    return math.sqrt(2.0 / ((1 + _LEAKY**2) * fan))


class HyperNetwork(nn.Module):
    """MLP from λ to a full set of target weights, one set per row of λ.

    Args:
        target_shapes: ``{name: shape}`` of every parameter to generate.
        init_std: ``{name: std}`` of each target's ordinary initialisation (e.g. Kaiming fan-in
            for convolution weights, 0 for biases, 1e-5 for a near-zero flow layer). θ0 is drawn
            from it and the delta head of that target is scaled by it, so every λ starts with
            weights of the target's std.
        num_inputs: Number of hyperparameters ``H`` (1 for HyperMorph).
        hidden: Widths of the MLP trunk (LeakyReLU 0.2 after each layer).
        parametrization: ``"mip"`` (encoded input, θ0 + Δθ) or ``"default"`` (raw λ in, θ = h(λ)
            out, no θ0; the baseline MIP is measured against).
        rank: Width of the linear bottleneck feeding the head (the rank of Δθ's output layer);
            0 = legacy layout (no bottleneck, no step scaling; hyperreg ≤ 0.1.0 checkpoints).
        zero_delta: Targets whose head rows start at exactly zero (MIP, ``rank > 0``): their Δθ
            is 0 at every λ at initialisation, so θ = θ0 keeps its near-zero init.

    Raises:
        ValueError: On an unknown parametrisation, empty ``hidden``, a negative ``rank``, a
            target without std or a ``zero_delta`` name that is not a target.
    """

    def __init__(
        self,
        target_shapes: Mapping[str, Sequence[int]],
        init_std: Mapping[str, float],
        num_inputs: int = 1,
        hidden: Sequence[int] = (64, 64, 64, 64),
        parametrization: str = "mip",
        rank: int = 4,
        zero_delta: Collection[str] = (),
    ) -> None:
        super().__init__()
        check_option("HyperNetwork", "parametrization", parametrization, PARAMETRIZATIONS)
        if len(hidden) == 0:
            raise ValueError("HyperNetwork(): 'hidden' must list at least one width, got ()")
        if rank < 0:
            raise ValueError(f"HyperNetwork(): 'rank' must be >= 0 (0 = legacy), got {rank}")
        missing = sorted(set(target_shapes) - set(init_std))
        if missing:
            raise ValueError(f"HyperNetwork(): 'init_std' lacks entries for {missing}")
        unknown = sorted(set(zero_delta) - set(target_shapes))
        if unknown:
            raise ValueError(f"HyperNetwork(): 'zero_delta' names unknown targets {unknown}")
        self.parametrization = parametrization
        self.num_inputs = num_inputs
        self.rank = rank
        self.target_shapes = {
            name: tuple(int(s) for s in shape) for name, shape in target_shapes.items()
        }
        sizes = [math.prod(shape) for shape in self.target_shapes.values()]
        self._sizes = sizes
        total = sum(sizes)
        mip = parametrization == "mip"
        # Fixed multipliers (MIP with a compact head only): 1/fan_in per trunk layer, and
        # HEAD_STEP / (head width) on the head output. 1.0 everywhere else (legacy and default).
        self._scaled = mip and rank > 0

        in_features = 2 * num_inputs if mip else num_inputs
        layers: list[nn.Module] = []
        self._trunk_mult: list[float] = []
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.LeakyReLU(_LEAKY)]
            self._trunk_mult.append(TRUNK_STEP / in_features if self._scaled else 1.0)
            in_features = width
        self.trunk = nn.Sequential(*layers)
        if rank > 0:
            self.head_in: nn.Linear | None = nn.Linear(in_features, rank, bias=False)
            self._head_in_mult = TRUNK_STEP / in_features if self._scaled else 1.0
            in_features = rank
        else:
            self.register_module("head_in", None)
            self._head_in_mult = 1.0
        if self._scaled:
            in_features = rank + 2 * num_inputs  # n(z) and the λ code itself, see _features
        self._head_mult = HEAD_STEP / in_features if self._scaled else 1.0
        self.weight_delta = nn.Linear(in_features, total, bias=not mip)
        stds = torch.cat(
            [torch.full((n,), float(init_std[name])) for name, n in zip(self.target_shapes, sizes)]
        )
        zero = torch.cat(
            [torch.full((n,), name in zero_delta) for name, n in zip(self.target_shapes, sizes)]
        )
        if mip:
            self.base_weights = nn.Parameter(torch.zeros(total))
        else:
            self.register_parameter("base_weights", None)
        if rank == 0:
            self._init_legacy(stds)
        else:
            self._init_weights(stds, zero)

    @torch.no_grad()
    def _init_weights(self, stds: Tensor, zero: Tensor) -> None:
        mip = self.parametrization == "mip"
        # Trunk: Kaiming normal fan-in, zero bias, so every hidden feature is O(1) and one Adam
        # step changes it by O(lr). (The MIP paper's fan-out differs only in the first layer,
        # whose two inputs would give features of std ~0.2 and relative steps of ~5 lr.) A
        # multiplier s on a layer is compensated by drawing its weight 1/s larger.
        linears = [m for m in self.trunk if isinstance(m, nn.Linear)]
        for layer, mult in zip(linears, self._trunk_mult):
            layer.weight.normal_(0.0, _kaiming_std(layer.in_features) / mult)
            nn.init.zeros_(layer.bias)
        assert self.head_in is not None
        # Bottleneck: linear (no activation), std 1/sqrt(fan_in) before its multiplier.
        fan_in = self.head_in.in_features
        self.head_in.weight.normal_(0.0, 1.0 / (math.sqrt(fan_in) * self._head_in_mult))
        rank = self.rank
        head = self.weight_delta
        if mip:
            # Δθ = m · U · x with rms(x) = 1: std(Δθ_t) = m · sqrt(width) · std(U_t). θ0 and
            # Δθ share the target's variance, 1 : DELTA_INIT², so θ(λ) starts at the target std.
            share = 1.0 / math.sqrt(1.0 + DELTA_INIT**2)
            delta_std = torch.where(zero, 0.0, stds * DELTA_INIT * share)
            base_std = torch.where(zero, stds, stds * share)
            head.weight.copy_(
                torch.randn_like(head.weight)
                * (delta_std / (self._head_mult * math.sqrt(head.in_features)))[:, None]
            )
            self.base_weights.copy_(torch.randn_like(self.base_weights) * base_std)
            return
        # Default: head calibrated so that the generated weights have each target's std in RMS
        # over λ ∈ [0, 1] (h(λ) = λ·h(1) at init, so the std at λ is λ·sqrt(3) times that).
        probe = self._features(torch.linspace(0, 1, 65).reshape(-1, 1).repeat(1, self.num_inputs))
        rms = float(probe.pow(2).mean().sqrt().clamp_min(1e-6))
        head.weight.copy_(torch.randn_like(head.weight) * stds[:, None] / (math.sqrt(rank) * rms))
        nn.init.zeros_(head.bias)

    @torch.no_grad()
    def _init_legacy(self, stds: Tensor) -> None:
        # The initialisation of hyperreg ≤ 0.1.0 (rank = 0), kept so that layout reproduces it.
        width = self.weight_delta.in_features
        if self.parametrization == "mip":
            self.base_weights.copy_(torch.randn_like(self.base_weights) * stds)
            for layer in self.trunk:
                if isinstance(layer, nn.Linear):
                    nn.init.kaiming_normal_(
                        layer.weight, a=_LEAKY, mode="fan_out", nonlinearity="leaky_relu"
                    )
                    nn.init.zeros_(layer.bias)
            self.weight_delta.weight.copy_(
                torch.randn_like(self.weight_delta.weight) * stds[:, None] / math.sqrt(width)
            )
            return
        probe = self.trunk(torch.rand(256, self.num_inputs))
        rms = float(probe.pow(2).mean().sqrt().clamp_min(1e-6))
        self.weight_delta.weight.copy_(
            torch.randn_like(self.weight_delta.weight) * stds[:, None] / (math.sqrt(width) * rms)
        )
        nn.init.zeros_(self.weight_delta.bias)

    def encode(self, lam: Tensor) -> Tensor:
        """Trunk input for ``lam`` of shape ``(L, H)``: the MIP code, or raw λ by default."""
        return encode_lambda(lam) if self.parametrization == "mip" else lam

    def _features(self, code: Tensor) -> Tensor:
        """Head input ``(L, rank)`` (or ``(L, hidden[-1])`` with the legacy layout)."""
        h = code
        linears = [m for m in self.trunk if isinstance(m, nn.Linear)]
        for layer, mult in zip(linears, self._trunk_mult):
            if self._scaled:
                bias = layer.bias * (TRUNK_STEP / math.sqrt(layer.out_features))
                h = F.leaky_relu(F.linear(h * mult, layer.weight, bias), _LEAKY)
            else:
                h = F.leaky_relu(layer(h), _LEAKY)
        if self.head_in is None:
            return h
        z = self.head_in(h * self._head_in_mult if self._scaled else h)
        if self._scaled:
            z = z * torch.rsqrt(z.pow(2).mean(dim=1, keepdim=True) + _RMS_EPS)
            # The λ code goes to the head beside the trunk's features (a skip connection), scaled
            # to RMS 1 like them (each cos/sin pair has norm 1). Deep ReLU trunks map distant λ
            # to nearly parallel features, so without it Δθ(0) ≈ Δθ(1) and the weights learn to
            # depend on λ only slowly; with it Δθ(λ) = m·(U·n(z) + U'·E(λ)) separates the ends
            # from the first step ([1, 0] at λ = 0, [0, 1] at λ = 1).
            z = torch.cat([z, code * math.sqrt(2.0)], dim=1)
        return z

    def forward(self, lam: Tensor) -> dict[str, Tensor]:
        """Generate one weight set per row of ``lam``.

        Args:
            lam: ``(L, H)`` hyperparameters in [0, 1]; the weights follow its dtype.

        Returns:
            ``{name: tensor of shape (L, *shape)}`` for every target.

        Raises:
            ValueError: If ``lam`` is not ``(L, H)`` with ``H = num_inputs``, or holds values
                outside [0, 1] (MIP).
        """
        if lam.ndim != 2 or lam.shape[1] != self.num_inputs:
            raise ValueError(
                f"HyperNetwork.forward(): 'lam' must have shape (L, {self.num_inputs}), "
                f"got {tuple(lam.shape)}"
            )
        flat = self.weight_delta(self._features(self.encode(lam)))
        if self._head_mult != 1.0:
            flat = flat * self._head_mult
        if self.base_weights is not None:
            flat = flat + self.base_weights
        chunks = flat.split(self._sizes, dim=1)
        return {
            name: chunk.reshape(lam.shape[0], *shape)
            for (name, shape), chunk in zip(self.target_shapes.items(), chunks)
        }
