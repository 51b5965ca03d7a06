"""Tests for hyperreg.method.losses: local NCC, scaled MSE, diffusion regulariser, soft Dice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.testing import assert_close

from hyperreg.method.losses import (
    NCC,
    dice_loss,
    gradient_loss,
    mi_loss,
    mse_loss,
    ncc_loss,
    ncc_reference,
)
from hyperreg.method.spatial import identity_grid

# Window used by property tests: fits every axis of the tiny 3D test volume (8 x 10 x 12).
WINDOW = 5


def _voxelmorph_ncc(moved: Tensor, fixed: Tensor, window: int = 9) -> Tensor:
    """Reference: VoxelMorph's sum-based local NCC (``losses.NCC.loss``), float64, per sample."""
    ndim = moved.ndim - 2
    conv = F.conv2d if ndim == 2 else F.conv3d
    weight = torch.ones(1, 1, *([window] * ndim), dtype=moved.dtype)
    win_size = window**ndim
    i, j = moved, fixed
    i_sum, j_sum = conv(i, weight, padding=window // 2), conv(j, weight, padding=window // 2)
    i2_sum = conv(i * i, weight, padding=window // 2)
    j2_sum = conv(j * j, weight, padding=window // 2)
    ij_sum = conv(i * j, weight, padding=window // 2)
    u_i, u_j = i_sum / win_size, j_sum / win_size
    cross = ij_sum - u_j * i_sum - u_i * j_sum + u_i * u_j * win_size
    i_var = i2_sum - 2 * u_i * i_sum + u_i * u_i * win_size
    j_var = j2_sum - 2 * u_j * j_sum + u_j * u_j * win_size
    cc = cross * cross / (i_var * j_var + 1e-5)
    return -cc.flatten(1).mean(1)


# ------------------------------------------------------------------------------------------
# ncc_loss
# ------------------------------------------------------------------------------------------


def test_ncc_of_identical_textured_images_is_minimal(shape, make_texture) -> None:
    x = make_texture(shape, batch=2)
    same = ncc_loss(x, x, window=WINDOW)
    assert same.shape == ()
    assert same.dtype == torch.float32
    assert_close(same, torch.tensor(-1.0), rtol=0, atol=1e-3)
    shifted = torch.roll(x, shifts=2, dims=2)
    noisy = x + 0.2 * torch.randn_like(x)
    assert same < ncc_loss(shifted, x, window=WINDOW) - 0.05
    assert same < ncc_loss(noisy, x, window=WINDOW) - 0.05
    # local NCC is invariant to a positive intensity scaling (zero padding keeps 0 at 0)
    assert_close(ncc_loss(0.5 * x, x, window=WINDOW), same, rtol=0, atol=5e-3)


@pytest.mark.parametrize("window", [3, 5])
def test_ncc_matches_voxelmorph_sum_form(shape, window: int) -> None:
    # Dim, low-contrast images (intensities in [0, 0.13], local variance ~1e-4): here the
    # epsilon in the denominator matters, so this checks the documented equivalence with
    # VoxelMorph's sum-based form (epsilon 1e-5 on window-sums, i.e. 1e-5 / window**(2N) on
    # window-means).
    moved = 0.1 * torch.rand(2, 1, *shape, dtype=torch.float64)
    fixed = moved + 0.03 * torch.rand(2, 1, *shape, dtype=torch.float64)
    expected = _voxelmorph_ncc(moved, fixed, window).float()
    actual = ncc_loss(moved.float(), fixed.float(), window=window, reduction="none")
    assert_close(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [1, 7, 9, 11])
@pytest.mark.parametrize("shape", [(30, 26), (20, 22, 18)], ids=["2d", "3d"])
def test_ncc_box_sums_match_a_convolution_for_every_window(shape, window: int) -> None:
    # The box filter sums shifted copies by doubling (widths 1, 2, 4, 8 combined along the
    # binary digits of the window); against VoxelMorph's ones-kernel convolution for windows of
    # one to four binary digits, on textured images with a flat region at a non-zero level
    # (where a running-total filter leaves spurious variance), and its gradient.
    torch.manual_seed(window)
    moved = torch.rand(2, 1, *shape, dtype=torch.float64)
    fixed = 0.5 * moved + 0.5 * torch.rand(2, 1, *shape, dtype=torch.float64)
    moved[:, :, : shape[0] // 2], fixed[:, :, : shape[0] // 2] = 0.7, 0.4
    expected = _voxelmorph_ncc(moved, fixed, window).float()
    actual = ncc_loss(moved.float(), fixed.float(), window=window, reduction="none")
    assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    ours, theirs = moved.clone().requires_grad_(), moved.clone().requires_grad_()
    ncc_loss(ours, fixed, window=window).backward()
    _voxelmorph_ncc(theirs, fixed, window).mean().backward()
    assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("window", [3, 5, 9])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_ncc_with_a_reference_equals_ncc_without(shape, make_texture, window, weighted) -> None:
    # The fixed image's statistics computed once (test-time refinement) give the loss and the
    # gradient of the plain form, on textured images with a flat region at a non-zero level (where
    # cc is clamped or the variance clamped at 0), above [0, 1] (unit scaling), with cost weights.
    torch.manual_seed(window)
    fixed = 3.0 * make_texture(shape, batch=2)
    moved = 0.6 * fixed.roll(1, -1) + 0.4 * make_texture(shape, batch=2)
    moved[:, :, : shape[0] // 2], fixed[:, :, : shape[0] // 2] = 0.7, 0.4
    weight = (torch.rand(2, 1, *shape) > 0.3).float() if weighted else None
    plain, cached = moved.clone().requires_grad_(), moved.clone().requires_grad_()
    expected = ncc_loss(plain, fixed, window=window, reduction="none", weight=weight)
    reference = ncc_reference(fixed, window)
    actual = ncc_loss(cached, fixed, window=window, reduction="none", weight=weight,
                      reference=reference)  # fmt: skip
    assert_close(actual, expected, rtol=0, atol=1e-5)
    expected.sum().backward()
    actual.sum().backward()
    assert plain.grad.abs().max() > 0
    assert_close(cached.grad, plain.grad, rtol=1e-4, atol=1e-5 * float(plain.grad.abs().max()))


@pytest.mark.parametrize("window", [3, 9])
def test_box_sum_of_a_padded_buffer_is_the_box_sum_of_its_interior(shape, window) -> None:
    # The cached NCC writes its terms into the interior of a buffer whose margins are zero
    # (no concatenation, no padded copy): the box sum of that buffer is the one of the image,
    # bitwise, and the margins are zero whatever the memory held.
    from hyperreg.method.losses import _box_sum, _padded

    torch.manual_seed(window)
    image = torch.rand(2, 3, *shape)
    buffer, inside = _padded(image, 3, window // 2)
    assert inside.shape == image.shape
    inside.copy_(image)
    assert float(buffer.abs().sum()) == pytest.approx(float(image.abs().sum()), rel=1e-6)
    assert torch.equal(_box_sum(buffer, window, padded=True), _box_sum(image, window))


def test_ncc_refuses_a_reference_of_another_window_or_shape(shape, make_texture) -> None:
    fixed = make_texture(shape)
    with pytest.raises(ValueError, match="'reference' was computed for window 5"):
        ncc_loss(fixed, fixed, window=7, reference=ncc_reference(fixed, 5))
    with pytest.raises(ValueError, match="'reference' was computed for window 5 and shape"):
        ncc_loss(fixed, fixed, window=5, reference=ncc_reference(fixed[..., 1:], 5))
    with pytest.raises(ValueError, match="'window' must be a positive odd integer"):
        ncc_reference(fixed, 4)


def test_ncc_default_window_larger_than_an_axis(shape, make_texture) -> None:
    # The default 9-voxel window on a volume with an axis shorter than 9 (3D: 8 x 10 x 12) must
    # still work, as VoxelMorph's zero-padded convolution does.
    moved, fixed = make_texture(shape, batch=2), make_texture(shape, batch=2)
    actual = ncc_loss(moved, fixed, reduction="none")
    expected = _voxelmorph_ncc(moved.double(), fixed.double(), 9).float()
    assert torch.isfinite(actual).all()
    assert_close(actual, expected, rtol=1e-3, atol=1e-4)


def test_ncc_of_constant_images_is_finite_and_bounded(shape, make_texture) -> None:
    const = torch.full((1, 1, *shape), 0.5)
    for a, b in [(const, const), (const, make_texture(shape)), (make_texture(shape), const)]:
        value = ncc_loss(a, b, window=WINDOW)
        assert torch.isfinite(value)
        assert -1.0 <= float(value) <= 0.0
        # the gradient is finite too (no 0/0 in flat regions)
        a = a.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(ncc_loss(a, b, window=WINDOW), a)
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ncc_low_precision_input_is_finite_and_close_to_float32(shape, make_texture, dtype) -> None:
    moved, fixed = make_texture(shape, batch=2), make_texture(shape, batch=2)
    reference = ncc_loss(moved, fixed, window=WINDOW, reduction="none")
    low = ncc_loss(moved.to(dtype), fixed.to(dtype), window=WINDOW, reduction="none")
    assert low.dtype == torch.float32
    assert torch.isfinite(low).all()
    # Only the input quantisation differs (bfloat16: 8-bit mantissa, ~0.4% per value).
    assert_close(low, reference, rtol=0, atol=2e-2)


def test_ncc_gradcheck_float64() -> None:
    moved = torch.rand(1, 1, 5, 6, dtype=torch.float64, requires_grad=True)
    fixed = torch.rand(1, 1, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: ncc_loss(a, b, window=3), (moved, fixed), eps=1e-6, atol=1e-6
    )


def test_ncc_reduction_none_is_per_sample(shape, make_texture) -> None:
    moved, fixed = make_texture(shape, batch=3), make_texture(shape, batch=3)
    per_sample = ncc_loss(moved, fixed, window=WINDOW, reduction="none")
    assert per_sample.shape == (3,)
    assert_close(per_sample.mean(), ncc_loss(moved, fixed, window=WINDOW), rtol=1e-6, atol=1e-7)
    # no mixing across the batch: sample 1 alone gives the same value
    alone = ncc_loss(moved[1:2], fixed[1:2], window=WINDOW, reduction="none")
    assert_close(per_sample[1:2], alone, rtol=1e-6, atol=1e-7)
    assert torch.equal(NCC(window=5)(moved, fixed), ncc_loss(moved, fixed, window=5))


def test_ncc_rejects_bad_input(shape) -> None:
    a = torch.rand(1, 1, *shape)
    with pytest.raises(ValueError, match=r"'moved' and 'fixed' must have the same shape"):
        ncc_loss(a, torch.rand(2, 1, *shape))
    with pytest.raises(ValueError, match=r"'window' must be a positive odd integer"):
        ncc_loss(a, a, window=4)
    with pytest.raises(ValueError, match=r"'window' must be a positive odd integer"):
        ncc_loss(a, a, window=0)
    with pytest.raises(ValueError, match=r"'reduction' must be one of \('mean', 'none'\)"):
        ncc_loss(a, a, reduction="sum")
    with pytest.raises(TypeError, match=r"'fixed' must be a floating-point"):
        ncc_loss(a, a.long())
    with pytest.raises(ValueError, match=r"'moved' must have shape"):
        ncc_loss(a[0, 0], a[0, 0])


# ------------------------------------------------------------------------------------------
# mse_loss
# ------------------------------------------------------------------------------------------


def test_mse_is_scaled_by_inverse_sigma_squared(shape, make_texture) -> None:
    moved, fixed = make_texture(shape, batch=2), make_texture(shape, batch=2)
    plain = (moved - fixed).pow(2).mean()
    assert_close(mse_loss(moved, fixed, sigma=1.0), plain, rtol=1e-6, atol=0)
    assert_close(mse_loss(moved, fixed, sigma=0.05), plain / 0.05**2, rtol=1e-5, atol=0)
    assert_close(mse_loss(moved, moved), torch.tensor(0.0), rtol=0, atol=0)
    per_sample = mse_loss(moved, fixed, reduction="none")
    assert per_sample.shape == (2,)
    assert_close(per_sample.mean(), mse_loss(moved, fixed), rtol=1e-6, atol=0)


def test_mse_rejects_bad_input(shape) -> None:
    a = torch.rand(1, 1, *shape)
    with pytest.raises(ValueError, match=r"'sigma' must be > 0"):
        mse_loss(a, a, sigma=0.0)
    with pytest.raises(ValueError, match=r"'moved' and 'fixed' must have the same shape"):
        mse_loss(a, torch.rand(1, 2, *shape))
    with pytest.raises(ValueError, match=r"'reduction' must be one of"):
        mse_loss(a, a, reduction="max")


# ------------------------------------------------------------------------------------------
# gradient_loss
# ------------------------------------------------------------------------------------------


def test_gradient_loss_of_constant_field_is_zero(shape, make_constant_field) -> None:
    field = make_constant_field(shape, [1.5, -2.0, 0.5][: len(shape)], batch=2)
    assert_close(gradient_loss(field), torch.tensor(0.0), rtol=0, atol=0)


def test_gradient_loss_of_linear_ramp(shape) -> None:
    ndim = len(shape)
    grid = identity_grid(shape)
    # Every channel ramps along axis 0 with slope a: only axis 0 has differences, all equal to a,
    # so L = (1/N) * a**2.
    a = 0.7
    ramp = (a * grid[:, 0:1]).expand(1, ndim, *shape)
    assert_close(gradient_loss(ramp), torch.tensor(a**2 / ndim), rtol=1e-6, atol=0)
    # Channel c ramps along axis c with slope s_c: the axis-c term is s_c**2 / N (one channel
    # of N), so L = sum_c s_c**2 / N**2.
    slopes = torch.tensor([0.5, -1.0, 2.0][:ndim])
    diag = slopes.view(1, ndim, *([1] * ndim)) * grid
    assert_close(gradient_loss(diag), (slopes**2).sum() / ndim**2, rtol=1e-6, atol=0)


def test_gradient_loss_reduction_none(shape) -> None:
    field = torch.randn(3, len(shape), *shape)
    per_sample = gradient_loss(field, reduction="none")
    assert per_sample.shape == (3,)
    assert_close(per_sample.mean(), gradient_loss(field), rtol=1e-6, atol=0)
    assert_close(per_sample[2], gradient_loss(field[2:3]), rtol=1e-6, atol=0)


def test_gradient_loss_rejects_bad_input(shape) -> None:
    with pytest.raises(ValueError, match=r"'field' must have"):
        gradient_loss(torch.zeros(1, len(shape) + 1, *shape))
    with pytest.raises(ValueError, match=r"'reduction' must be one of"):
        gradient_loss(torch.zeros(1, len(shape), *shape), reduction="sum")
    with pytest.raises(TypeError, match=r"'field' must be a floating-point"):
        gradient_loss(torch.zeros(1, len(shape), *shape, dtype=torch.int64))


# ------------------------------------------------------------------------------------------
# dice_loss
# ------------------------------------------------------------------------------------------


def _one_hot(labels: Tensor, num: int) -> Tensor:
    return F.one_hot(labels, num).movedim(-1, 1).float()


def test_dice_loss_known_values(shape) -> None:
    labels = torch.randint(0, 4, (2, *shape))
    onehot = _one_hot(labels, 4)
    assert_close(dice_loss(onehot, onehot), torch.tensor(0.0), rtol=0, atol=1e-6)
    # disjoint maps: Dice 0 for every label, loss 1
    shifted = _one_hot((labels + 1) % 4, 4)
    assert_close(dice_loss(onehot, shifted), torch.tensor(1.0), rtol=0, atol=1e-6)
    per_sample = dice_loss(onehot, shifted, reduction="none")
    assert per_sample.shape == (2,)


def test_dice_loss_rejects_bad_input(shape) -> None:
    a = torch.rand(1, 3, *shape)
    with pytest.raises(ValueError, match=r"'moved_seg' and 'fixed_seg' must have the same shape"):
        dice_loss(a, torch.rand(1, 4, *shape))
    with pytest.raises(TypeError, match=r"'moved_seg' must be a floating-point"):
        dice_loss(a.long(), a)
    with pytest.raises(ValueError, match=r"'reduction' must be one of"):
        dice_loss(a, a, reduction="sum")


# --- mutual information ----------------------------------------------------------------------


@pytest.mark.parametrize("ndim", [2, 3])
def test_mi_loss_equals_monai(ndim: int) -> None:
    from monai.losses import GlobalMutualInformationLoss

    shape = (2, 1, *([9] * ndim))
    moved = torch.rand(shape)
    fixed = (moved**2 + 0.1 * torch.rand(shape)).clamp(0, 1)
    expected = GlobalMutualInformationLoss(num_bins=23, reduction="none")(moved, fixed)
    assert_close(mi_loss(moved, fixed, bins=23, reduction="none"), expected, rtol=1e-5, atol=1e-6)


def test_mi_loss_prefers_any_functional_relation() -> None:
    fixed = torch.rand(1, 1, 24, 24)
    inverted = 1 - fixed  # another "contrast": NCC-like losses see anticorrelation
    unrelated = torch.rand(1, 1, 24, 24)
    assert float(mi_loss(inverted, fixed)) < float(mi_loss(unrelated, fixed)) - 1.0
    assert float(mi_loss(fixed, fixed)) == pytest.approx(float(mi_loss(inverted, fixed)), abs=1e-4)


def test_mi_loss_gradient_is_finite() -> None:
    moved = torch.rand(1, 1, 8, 8, dtype=torch.float64, requires_grad=True)
    fixed = torch.rand(1, 1, 8, 8, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda m: mi_loss(m.clamp(0.01, 0.99), fixed, bins=8), moved)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bins": 1}, "'bins' must be an integer >= 2"),
        ({"sigma_ratio": 0}, "'sigma_ratio'"),
        ({"reduction": "sum"}, "'reduction' must be one of"),
    ],
)
def test_mi_loss_rejects(kwargs: dict, match: str) -> None:
    a = torch.rand(1, 1, 6, 6)
    with pytest.raises(ValueError, match=match):
        mi_loss(a, a, **kwargs)
    with pytest.raises(TypeError, match="'moved' must be a floating-point tensor"):
        mi_loss(a.long(), a)


@pytest.mark.parametrize("scale", [4095.0, 100.0, 2.5])
@pytest.mark.parametrize("shape", [(24, 20), (14, 12, 16)], ids=["2d", "3d"])
def test_ncc_flat_windows_stay_uncorrelated_above_unit_range(shape, make_texture, scale) -> None:
    # Half textured, half flat at a non-zero level with a faint shared ripple (1e-4, far below
    # the epsilon for [0, 1] images, so those windows count as flat). In raw scanner units an
    # absolute epsilon let the ripple's variance through and counted the flat half as a perfect
    # match; the loss must equal that of the [0, 1] images, whatever each image's scale. (The
    # grids are large enough for windows that neither reach the texture nor the zero padding.)
    moved, fixed = make_texture(shape, batch=2), make_texture(shape, batch=2)
    half = shape[0] // 2
    ripple = 1e-4 * torch.rand_like(moved[:, :, half:])
    moved[:, :, half:] = 0.6 + ripple
    fixed[:, :, half:] = 0.3 + ripple
    moved[:, :, 0], fixed[:, :, 0] = 1.0, 1.0  # max |x| is 1 in every sample
    expected = ncc_loss(moved, fixed, window=WINDOW, reduction="none")
    actual = ncc_loss(scale * moved, scale * fixed, window=WINDOW, reduction="none")
    assert_close(actual, expected, rtol=0, atol=1e-4)
    mixed = ncc_loss(scale * moved, fixed, window=WINDOW, reduction="none")  # own scale each
    assert_close(mixed, expected, rtol=0, atol=1e-4)
