"""Tests for hyperreg.method.hypernet: MIP encoding and the hypernetwork."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from hyperreg.method.hypernet import HyperNetwork, encode_lambda

SHAPES = {"conv.weight": (4, 2, 3, 3), "conv.bias": (4,), "flow.weight": (2, 4, 3, 3)}
STDS = {"conv.weight": math.sqrt(2 / 18), "conv.bias": 0.0, "flow.weight": 1e-5}
LAMBDAS = [0.0, 0.3, 0.7, 1.0]


def _make(parametrization: str = "mip", rank: int = 4) -> HyperNetwork:
    return HyperNetwork(SHAPES, STDS, hidden=(16, 16), parametrization=parametrization, rank=rank)


# ------------------------------------------------------------------------------------------
# encode_lambda
# ------------------------------------------------------------------------------------------


def test_encode_lambda_has_unit_norm() -> None:
    lam = torch.tensor([[0.0], [0.3], [1.0]])
    code = encode_lambda(lam)
    assert code.shape == (3, 2)
    assert_close(code.norm(dim=1), torch.ones(3), rtol=0, atol=1e-6)
    assert_close(code[0], torch.tensor([1.0, 0.0]), rtol=0, atol=1e-7)
    assert_close(code[2], torch.tensor([0.0, 1.0]), rtol=0, atol=1e-7)


def test_encode_lambda_several_hyperparameters() -> None:
    lam = torch.tensor([[0.0, 0.3], [1.0, 0.5]], dtype=torch.float64)
    code = encode_lambda(lam)
    assert code.shape == (2, 4)
    assert code.dtype == torch.float64
    # cos terms first, then sin terms: each (cos, sin) pair has unit norm
    pairs = torch.stack([code[:, :2], code[:, 2:]], dim=-1)
    assert_close(pairs.norm(dim=-1), torch.ones(2, 2, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan")])
def test_encode_lambda_rejects_out_of_range(value: float) -> None:
    with pytest.raises(ValueError, match=r"'lam' must lie in \[0, 1\]"):
        encode_lambda(torch.tensor([[0.5], [value]]))


def test_encode_lambda_rejects_wrong_rank() -> None:
    with pytest.raises(ValueError, match=r"'lam' must have shape \(B, H\)"):
        encode_lambda(torch.tensor([0.5]))


# ------------------------------------------------------------------------------------------
# HyperNetwork
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 4])
@pytest.mark.parametrize("parametrization", ["mip", "default"])
def test_generated_shapes_have_leading_lambda_axis(parametrization: str, rank: int) -> None:
    net = _make(parametrization, rank)
    out = net(torch.tensor(LAMBDAS).view(-1, 1))
    assert set(out) == set(SHAPES)
    for name, shape in SHAPES.items():
        assert out[name].shape == (len(LAMBDAS), *shape)
        assert torch.isfinite(out[name]).all()


@pytest.mark.parametrize("rank", [0, 4])
def test_zero_delta_gives_base_weights_at_every_lambda(rank: int) -> None:
    net = _make("mip", rank)
    with torch.no_grad():
        net.weight_delta.weight.zero_()
    out = net(torch.tensor(LAMBDAS).view(-1, 1))
    base = dict(zip(SHAPES, net.base_weights.split([math.prod(s) for s in SHAPES.values()])))
    for name, shape in SHAPES.items():
        expected = base[name].reshape(shape).expand(len(LAMBDAS), *shape)
        assert_close(out[name], expected, rtol=0, atol=0)


@pytest.mark.parametrize("rank", [0, 4])
def test_weights_for_lambda_0_and_1_differ_after_one_step(rank: int) -> None:
    net = _make("mip", rank)
    with torch.no_grad():
        net.weight_delta.weight.zero_()
    lam = torch.tensor([[0.0], [1.0]])
    before = net(lam)
    for name in SHAPES:
        assert torch.equal(before[name][0], before[name][1])
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-2)
    out = net(lam)
    loss = sum(out[n][0].pow(2).sum() + (out[n][1] - 1).pow(2).sum() for n in SHAPES)
    loss.backward()
    optimiser.step()
    after = net(lam)
    for name in SHAPES:
        assert (after[name][0] - after[name][1]).abs().max() > 1e-4, name


def test_default_parametrisation_has_no_base_weights() -> None:
    net = _make("default")
    assert net.base_weights is None
    assert "base_weights" not in dict(net.named_parameters())
    out = net(torch.tensor([[0.5]]))
    weight = out["conv.weight"]
    assert torch.isfinite(weight).all()
    assert weight.abs().max() > 0


@pytest.mark.parametrize("rank", [0, 4])
@pytest.mark.parametrize("parametrization", ["mip", "default"])
def test_near_zero_target_stays_near_zero_at_every_lambda(parametrization: str, rank: int) -> None:
    net = _make(parametrization, rank)
    lam = torch.linspace(0, 1, 11).view(-1, 1)
    flow = net(lam)["flow.weight"]
    assert flow.abs().max() < 1e-3
    # an ordinarily initialised target is not near zero, so the check above is meaningful
    assert net(lam)["conv.weight"].abs().max() > 1e-2


@pytest.mark.parametrize("rank", [0, 4])
def test_mip_init_is_close_to_target_std(rank: int) -> None:
    net = HyperNetwork(
        {"w": (64, 64, 3, 3)}, {"w": 0.05}, hidden=(32, 32), parametrization="mip", rank=rank
    )
    with torch.no_grad():
        weights = net(torch.tensor([[0.0], [0.5], [1.0]]))["w"]
    for row in weights:
        assert 0.025 < float(row.std()) < 0.1


def test_forward_rejects_wrong_lambda_shape() -> None:
    net = _make()
    with pytest.raises(ValueError, match=r"'lam' must have shape \(L, 1\)"):
        net(torch.tensor([0.5]))
    with pytest.raises(ValueError, match=r"'lam' must have shape \(L, 1\)"):
        net(torch.tensor([[0.5, 0.5]]))
    with pytest.raises(ValueError, match=r"'lam' must lie in \[0, 1\]"):
        net(torch.tensor([[1.5]]))


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"'parametrization' must be one of \('mip', 'default'\)"):
        HyperNetwork(SHAPES, STDS, parametrization="raw")
    with pytest.raises(ValueError, match=r"'hidden' must list at least one width"):
        HyperNetwork(SHAPES, STDS, hidden=())
    with pytest.raises(ValueError, match=r"'init_std' lacks entries for \['conv.bias'\]"):
        HyperNetwork(SHAPES, {k: v for k, v in STDS.items() if k != "conv.bias"})
