"""Tests for hyperreg.method.layers (per-sample convolution) and hyperreg.method.unet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from hyperreg.method.layers import conv
from hyperreg.method.unet import FLOW_INIT_STD, FixedWeightUNet, UNet, halve_max

SMALL = {"enc_channels": (4, 8, 8, 8), "dec_channels": (8, 8, 8, 8, 8, 4, 4)}
UNET_SHAPES = {2: (32, 16), 3: (16, 16, 32)}


# ------------------------------------------------------------------------------------------
# layers.conv
# ------------------------------------------------------------------------------------------


def test_per_sample_conv_equals_separate_convs(shape) -> None:
    ndim = len(shape)
    op = F.conv2d if ndim == 2 else F.conv3d
    batch, cin, cout = 3, 2, 5
    x = torch.randn(batch, cin, *shape)
    weight = torch.randn(batch, cout, cin, *([3] * ndim))
    bias = torch.randn(batch, cout)
    out = conv(x, weight, bias)
    assert out.shape == (batch, cout, *shape)
    for b in range(batch):
        expected = op(x[b : b + 1], weight[b], bias[b], padding=1)
        assert_close(out[b : b + 1], expected, rtol=1e-5, atol=1e-5)
    # the weights really differ per sample, so mixing samples up would be detected
    assert (out[0] - op(x[0:1], weight[1], bias[1], padding=1)[0]).abs().max() > 1e-2


def test_shared_conv_equals_functional_conv(shape) -> None:
    ndim = len(shape)
    op = F.conv2d if ndim == 2 else F.conv3d
    x = torch.randn(2, 3, *shape)
    weight = torch.randn(4, 3, *([3] * ndim))
    bias = torch.randn(4)
    assert_close(conv(x, weight, bias), op(x, weight, bias, padding=1), rtol=1e-6, atol=1e-6)
    assert_close(conv(x, weight, None), op(x, weight, None, padding=1), rtol=1e-6, atol=1e-6)


def test_per_sample_conv_without_bias(shape) -> None:
    ndim = len(shape)
    op = F.conv2d if ndim == 2 else F.conv3d
    x = torch.randn(2, 1, *shape)
    weight = torch.randn(2, 3, 1, *([3] * ndim))
    out = conv(x, weight, None)
    assert_close(out[1:], op(x[1:], weight[1], None, padding=1), rtol=1e-5, atol=1e-5)


def test_per_sample_conv_rejects_wrong_batch(shape) -> None:
    ndim = len(shape)
    x = torch.randn(2, 1, *shape)
    weight = torch.randn(3, 4, 1, *([3] * ndim))
    with pytest.raises(ValueError, match=r"per-sample 'weight' must have batch size 2, got 3"):
        conv(x, weight, None)


# ------------------------------------------------------------------------------------------
# UNet
# ------------------------------------------------------------------------------------------


def _random_params(unet: UNet, batch: int | None = None) -> dict[str, torch.Tensor]:
    stds = unet.init_std()
    params = {}
    for name, shape in unet.param_shapes().items():
        full = shape if batch is None else (batch, *shape)
        # biases get a small non-zero std so they matter
        params[name] = torch.randn(full) * (stds[name] if stds[name] > 0 else 0.1)
    return params


@pytest.mark.parametrize("half_res", [False, True])
def test_unet_output_shape(ndim: int, half_res: bool) -> None:
    spatial = UNET_SHAPES[ndim]
    unet = UNet(ndim, in_channels=2, half_res=half_res, **SMALL)
    x = torch.rand(2, 2, *spatial)
    flow = unet(x, _random_params(unet))
    expected = tuple(s // 2 for s in spatial) if half_res else spatial
    assert flow.shape == (2, ndim, *expected)
    assert torch.isfinite(flow).all()


def test_unet_param_shapes_and_stds(ndim: int) -> None:
    unet = UNet(ndim)
    shapes, stds = unet.param_shapes(), unet.init_std()
    assert list(shapes) == list(stds)
    assert list(shapes)[-2:] == ["flow.weight", "flow.bias"]
    assert shapes["flow.weight"] == (ndim, 16, *([3] * ndim))
    assert stds["flow.weight"] == FLOW_INIT_STD
    assert all(stds[name] == 0.0 for name in shapes if name.endswith(".bias"))
    assert len(unet.state_dict()) == 0  # the U-Net owns no parameters
    assert unet.divisor == 16


def test_unet_per_sample_params_equal_separate_runs(ndim: int) -> None:
    spatial = UNET_SHAPES[ndim]
    unet = UNet(ndim, in_channels=2, half_res=True, **SMALL)
    x = torch.rand(2, 2, *spatial)
    params = _random_params(unet, batch=2)
    flow = unet(x, params)
    for b in range(2):
        single = unet(x[b : b + 1], {name: value[b] for name, value in params.items()})
        scale = float(single.abs().max())
        assert_close(flow[b : b + 1], single, rtol=1e-4, atol=1e-5 * scale)


def test_unet_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"'ndim' must be 2 or 3, got 4"):
        UNet(4)
    with pytest.raises(ValueError, match=r"'dec_channels' needs at least 4 widths"):
        UNet(2, dec_channels=(8, 8))


def test_fixed_weight_unet_runs_and_trains(ndim: int) -> None:
    spatial = UNET_SHAPES[ndim]
    model = FixedWeightUNet(ndim, in_channels=2, **SMALL)
    x = torch.rand(1, 2, *spatial)
    flow = model(x)
    assert flow.shape == (1, ndim, *spatial)
    assert flow.abs().max() < 1e-2  # near-zero flow initialisation
    flow.pow(2).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert model.weights["flow_weight"].grad.abs().max() > 0


@pytest.mark.parametrize("shape", [(2, 3, 8, 10), (1, 4, 6, 8, 10), (1, 2, 5, 6, 7), (1, 1, 3, 4)])
def test_halve_max_equals_max_pooling(shape):
    x = torch.randn(shape)
    pool = F.max_pool2d if len(shape) == 4 else F.max_pool3d
    assert torch.equal(halve_max(x), pool(x, 2))


def test_halve_max_gradient_reaches_each_window_maximum():
    x = torch.arange(64.0).reshape(1, 1, 4, 4, 4).requires_grad_(True)
    halve_max(x).sum().backward()
    # each 2x2x2 window's largest value is its last (odd, odd, odd) element: one per window
    assert x.grad.sum().item() == 8.0
    assert torch.equal(x.grad[0, 0, 1::2, 1::2, 1::2], torch.ones(2, 2, 2))
