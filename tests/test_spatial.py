"""Tests for hyperreg.method.spatial: warping, integration, resizing, Jacobians."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from hyperreg.method.spatial import (
    SpatialTransformer,
    VelocityIntegrator,
    _to_grid_sample_coords,
    identity_grid,
    integrate_velocity,
    jacobian_determinant,
    resize_field,
    warp,
)

# ------------------------------------------------------------------------------------------
# identity grid and grid_sample coordinates
# ------------------------------------------------------------------------------------------


def test_identity_grid_holds_array_indices(shape: tuple[int, ...]) -> None:
    grid = identity_grid(shape)
    assert grid.shape == (1, len(shape), *shape)
    assert grid.dtype == torch.float32
    for n, size in enumerate(shape):
        view = [1] * len(shape)
        view[n] = size
        expected = torch.arange(size, dtype=torch.float32).view(view).expand(shape)
        assert torch.equal(grid[0, n], expected)


def test_to_grid_sample_coords_corners_and_channel_order(shape: tuple[int, ...]) -> None:
    ndim = len(shape)
    out = _to_grid_sample_coords(identity_grid(shape, dtype=torch.float64))
    assert out.shape == (1, *shape, ndim)
    first = (0,) * ndim
    last = tuple(s - 1 for s in shape)
    assert_close(
        out[(0, *first)], torch.full((ndim,), -1.0, dtype=torch.float64), rtol=0, atol=1e-12
    )
    assert_close(out[(0, *last)], torch.full((ndim,), 1.0, dtype=torch.float64), rtol=0, atol=1e-12)
    # Voxel at the end of the LAST array axis only: grid_sample's first channel (x) is that axis.
    corner = (0,) * (ndim - 1) + (shape[-1] - 1,)
    expected = torch.tensor([1.0] + [-1.0] * (ndim - 1), dtype=torch.float64)
    assert_close(out[(0, *corner)], expected, rtol=0, atol=1e-12)
    # Voxel at the end of the FIRST array axis only: the last grid_sample channel.
    corner = (shape[0] - 1,) + (0,) * (ndim - 1)
    expected = torch.tensor([-1.0] * (ndim - 1) + [1.0], dtype=torch.float64)
    assert_close(out[(0, *corner)], expected, rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------
# warp: known answers
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_warp_zero_displacement_is_exact_identity(shape, make_texture, mode: str) -> None:
    moving = make_texture(shape, batch=2)
    disp = torch.zeros(2, len(shape), *shape)
    moved = warp(moving, disp, mode=mode)
    assert moved.dtype == moving.dtype
    assert torch.equal(moved, moving), f"max error {(moved - moving).abs().max().item():.3g}"


@pytest.mark.parametrize("shift", [1, -2])
def test_warp_integer_shift_matches_roll_on_interior(shape, make_texture, shift: int) -> None:
    ndim = len(shape)
    moving = make_texture(shape)
    for axis in range(ndim):
        disp = torch.zeros(1, ndim, *shape)
        disp[:, axis] = float(shift)
        moved = warp(moving, disp)
        # moved[i] = moving[i + shift]  <=>  roll by -shift
        expected = torch.roll(moving, shifts=-shift, dims=2 + axis)
        interior = [slice(None)] * (2 + ndim)
        interior[2 + axis] = slice(abs(shift), shape[axis] - abs(shift))
        assert_close(moved[tuple(interior)], expected[tuple(interior)], rtol=0, atol=1e-5)


def test_warp_nearest_keeps_only_input_labels(shape) -> None:
    ids = torch.tensor([0.0, 3.0, 7.0, 12.0])
    labels = ids[torch.randint(0, len(ids), (2, 1, *shape))]
    disp = (torch.rand(2, len(shape), *shape) - 0.5) * 5.0
    moved = warp(labels, disp, mode="nearest")
    assert set(torch.unique(moved).tolist()) <= set(ids.tolist())
    # bilinear on the same input does create new values, so the check above is meaningful
    assert not set(torch.unique(warp(labels, disp)).tolist()) <= set(ids.tolist())


def test_warp_batch_one_displacement_applies_to_every_sample(shape, make_texture) -> None:
    moving = make_texture(shape, batch=3)
    disp = torch.randn(1, len(shape), *shape)
    moved = warp(moving, disp)
    for b in range(3):
        assert_close(moved[b : b + 1], warp(moving[b : b + 1], disp), rtol=0, atol=1e-6)


def test_spatial_transformer_matches_warp(shape, make_texture) -> None:
    moving = make_texture(shape)
    disp = torch.randn(1, len(shape), *shape)
    module = SpatialTransformer(mode="nearest", padding="zeros")
    assert torch.equal(module(moving, disp), warp(moving, disp, mode="nearest", padding="zeros"))


# ------------------------------------------------------------------------------------------
# warp: gradients
# ------------------------------------------------------------------------------------------


def test_warp_gradcheck_image_and_displacement(ndim: int) -> None:
    shape = (6,) * ndim
    moving = torch.rand(1, 1, *shape, dtype=torch.float64, requires_grad=True)
    # 0.3..0.4 voxel shifts: every sample point lies strictly inside a cell, away from knots
    disp = 0.3 + 0.1 * torch.rand(1, ndim, *shape, dtype=torch.float64)
    disp[:, 0] *= -1.0
    disp.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda m, d: warp(m, d, padding="zeros"), (moving, disp), eps=1e-6, atol=1e-6
    )


# ------------------------------------------------------------------------------------------
# warp: bad input
# ------------------------------------------------------------------------------------------


def test_warp_rejects_unknown_mode(shape) -> None:
    moving = torch.rand(1, 1, *shape)
    disp = torch.zeros(1, len(shape), *shape)
    with pytest.raises(
        ValueError, match=r"warp\(\): 'mode' must be one of \('bilinear', 'nearest'\)"
    ):
        warp(moving, disp, mode="linear")


def test_warp_rejects_unknown_padding(shape) -> None:
    moving = torch.rand(1, 1, *shape)
    disp = torch.zeros(1, len(shape), *shape)
    with pytest.raises(ValueError, match=r"'padding' must be one of"):
        warp(moving, disp, padding="reflection")


def test_warp_rejects_wrong_channel_count(shape) -> None:
    ndim = len(shape)
    moving = torch.rand(1, 1, *shape)
    disp = torch.zeros(1, ndim + 1, *shape)
    with pytest.raises(ValueError, match=rf"'disp' must have {ndim} channels"):
        warp(moving, disp)


def test_warp_rejects_mismatched_spatial_shape(shape) -> None:
    moving = torch.rand(1, 1, *shape)
    other = tuple(s + 1 for s in shape)
    disp = torch.zeros(1, len(shape), *other)
    with pytest.raises(ValueError, match=r"'disp' must have spatial shape"):
        warp(moving, disp)


def test_warp_rejects_mismatched_batch(shape) -> None:
    moving = torch.rand(3, 1, *shape)
    disp = torch.zeros(2, len(shape), *shape)
    with pytest.raises(ValueError, match=r"'disp' must have batch size 1 or 3"):
        warp(moving, disp)


def test_warp_rejects_integer_moving(shape) -> None:
    moving = torch.randint(0, 5, (1, 1, *shape))
    disp = torch.zeros(1, len(shape), *shape)
    with pytest.raises(TypeError, match=r"'moving' must be a floating-point tensor"):
        warp(moving, disp)


def test_warp_rejects_integer_disp(shape) -> None:
    moving = torch.rand(1, 1, *shape)
    disp = torch.zeros(1, len(shape), *shape, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"'disp' must be a floating-point tensor"):
        warp(moving, disp)


def test_warp_rejects_non_tensor_and_bad_rank() -> None:
    with pytest.raises(TypeError, match=r"'moving' must be a torch.Tensor"):
        warp([[1.0]], torch.zeros(1, 2, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'moving' must have shape \(B, C, H, W\)"):
        warp(torch.rand(1, 1, 5), torch.zeros(1, 1, 5))


def test_spatial_transformer_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match=r"'mode' must be one of"):
        SpatialTransformer(mode="cubic")


# ------------------------------------------------------------------------------------------
# resize_field
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("factor", "expected"), [(0.5, 1.0), (2.0, 4.0)])
def test_resize_field_rescales_vectors(
    shape, make_constant_field, factor: float, expected: float
) -> None:
    field = make_constant_field(shape, [2.0] * len(shape), batch=2)
    out = resize_field(field, factor)
    assert out.shape == (2, len(shape), *[round(s * factor) for s in shape])
    assert_close(out, torch.full_like(out, expected), rtol=0, atol=1e-6)


def test_resize_field_exact_size_and_identity(shape) -> None:
    field = torch.randn(1, len(shape), *shape)
    assert resize_field(field, 1.0) is field
    size = [s + 3 for s in shape]
    assert resize_field(field, 2.0, size=size).shape[2:] == tuple(size)


@pytest.mark.parametrize(
    ("spatial", "size", "crop"),
    [((24, 32, 32), None, (45, 60, 60)), ((23, 31, 11), (45, 61, 22), (44, 61, 21)),
     ((23, 30), (45, 60), (40, 60))],
)  # fmt: skip
def test_resize_field_crop_is_the_resized_field_sliced_bitwise(spatial, size, crop) -> None:
    # The model's upsampling to the image's voxels: the crop of the resized grid computed on
    # its own, values and gradient bitwise those of resizing the whole grid and slicing it
    # (also for a size that is not twice the field's, where the scales are not 2).
    torch.manual_seed(0)
    field = torch.randn(1, len(spatial), *spatial, requires_grad=True)
    whole = resize_field(field, 2.0, size)
    sliced = whole[(slice(None), slice(None), *[slice(0, c) for c in crop])]
    cropped = resize_field(field, 2.0, size, crop=crop)
    assert cropped.shape == (1, len(spatial), *crop)
    assert torch.equal(cropped, sliced)
    weights = torch.randn_like(sliced)
    (expected,) = torch.autograd.grad((sliced * weights).sum(), field)
    (actual,) = torch.autograd.grad((cropped * weights).sum(), field)
    assert torch.equal(actual, expected)


def test_resize_field_rejects_bad_input(shape) -> None:
    field = torch.zeros(1, len(shape), *shape)
    with pytest.raises(ValueError, match=r"'factor' must be > 0"):
        resize_field(field, 0.0)
    with pytest.raises(ValueError, match=r"'field' must have"):
        resize_field(torch.zeros(1, 1, *shape), 0.5)
    with pytest.raises(TypeError, match=r"'field' must be a floating-point"):
        resize_field(field.long(), 0.5)
    too_big = [2 * s + 1 for s in shape]
    for crop in (too_big, [1] * (len(shape) + 1), [0] * len(shape)):
        with pytest.raises(ValueError, match=r"'crop' must hold"):
            resize_field(field, 2.0, crop=crop)


# ------------------------------------------------------------------------------------------
# integrate_velocity
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, 7])
def test_integrate_zero_velocity_is_zero(shape, steps: int) -> None:
    velocity = torch.zeros(2, len(shape), *shape)
    disp = integrate_velocity(velocity, steps)
    assert disp.shape == velocity.shape
    assert torch.equal(disp, torch.zeros_like(disp))


@pytest.mark.parametrize("steps", [0, 1, 7])
def test_integrate_constant_velocity_is_translation(shape, make_constant_field, steps: int) -> None:
    values = [0.7, -0.4, 0.25][: len(shape)]
    velocity = make_constant_field(shape, values)
    disp = integrate_velocity(velocity, steps)
    assert_close(disp, velocity, rtol=0, atol=1e-5)


def test_integrate_smooth_velocity_matches_module_and_is_not_identity(shape) -> None:
    ndim = len(shape)
    grid = identity_grid(shape)
    velocity = 1.5 * torch.sin(grid / 3.0)
    disp = integrate_velocity(velocity, 7)
    assert torch.equal(VelocityIntegrator(7)(velocity), disp)
    # A non-constant velocity is not its own exponential: integration must do something.
    assert (disp - velocity).abs().max() > 1e-2
    assert disp.shape == (1, ndim, *shape)


@pytest.mark.parametrize(
    ("mode", "padding", "exact"),
    [("bilinear", "border", False), ("bilinear", "itk", True), ("nearest", "zeros", True)],
)
def test_large_3d_cpu_warp_split_across_threads_is_bitwise_the_plain_one(
    monkeypatch, mode, padding, exact
) -> None:
    # A 3D volume of >= _SPLIT_POINTS output points is sampled as several batch items of a
    # few planes each (PyTorch runs one batch item per thread): with 2 threads an even depth is
    # split in 2 and an odd one is not; values and the field's gradient are bitwise those of
    # one thread (one grid_sample call).
    batches = _recording_grid_sample(monkeypatch)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    try:
        for spatial, split in [((64, 64, 66), 2), ((65, 64, 64), 1)]:
            moving = torch.rand(1, 1, *spatial)
            disp = 3 * torch.randn(1, 3, *spatial)
            results = []
            for count in (1, 2):
                torch.set_num_threads(count)
                batches.clear()
                leaf = disp.clone().requires_grad_()
                moved = warp(moving, leaf, mode, padding, exact=exact)
                (grad,) = torch.autograd.grad(moved.square().sum(), leaf)
                results.append((moved, grad))
                assert batches == [1 if count == 1 else split]
            assert torch.equal(results[0][0], results[1][0])
            assert torch.equal(results[0][1], results[1][1])
    finally:
        torch.set_num_threads(threads)


def _recording_grid_sample(monkeypatch) -> list[int]:
    """Record the batch size of every ``grid_sample`` call of hyperreg.method.spatial."""
    import hyperreg.method.spatial as spatial_module

    batches: list[int] = []
    sample = spatial_module.F.grid_sample

    def recording(image, grid, **kwargs):
        batches.append(image.shape[0])
        return sample(image, grid, **kwargs)

    monkeypatch.setattr(spatial_module.F, "grid_sample", recording)
    return batches


@pytest.mark.parametrize(("spatial", "split"), [((36, 32, 32), 4), ((33, 32, 32), 3)])
def test_integrate_with_gradient_splits_by_shape_and_is_the_same_at_any_thread_count(
    monkeypatch, spatial, split
) -> None:
    # Scaling and squaring samples the 3-channel field with itself, gradients for both: it is
    # split into batch items whose number comes from the depth alone (4 for 36, 3 for 33)
    # whatever the thread count, so the field and the velocity's gradient (the items' gradients
    # of the shared input summed) are bitwise the same at 1, 2 and 3 threads, and equal to the
    # unsplit computation up to rounding (the forward pass bitwise).
    import hyperreg.method.spatial as spatial_module

    batches = _recording_grid_sample(monkeypatch)
    grid = identity_grid(spatial)
    velocity = 3.0 * torch.sin(grid / 5.0 + 1) + 2.0 * torch.cos(grid.flip(1) / 4.0)
    weights = torch.rand(1, 3, *spatial)

    def run() -> tuple[Tensor, Tensor]:
        leaf = velocity.clone().requires_grad_()
        disp = integrate_velocity(leaf, 7)
        (grad,) = torch.autograd.grad((disp * weights).sum(), leaf)
        return disp, grad

    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            batches.clear()
            results.append(run())
            assert batches == [split] * 7
        torch.set_num_threads(1)
        monkeypatch.setattr(spatial_module, "_SPLIT_POINTS", 1 << 40)  # no split
        batches.clear()
        plain = run()
        assert batches == [1] * 7
    finally:
        torch.set_num_threads(threads)
    for disp, grad in results[1:]:
        assert torch.equal(disp, results[0][0]) and torch.equal(grad, results[0][1])
    assert torch.equal(plain[0], results[0][0])
    assert_close(results[0][1], plain[1], rtol=1e-5, atol=1e-5)
    assert not torch.equal(plain[1], torch.zeros_like(plain[1]))


def test_multichannel_3d_sampling_without_gradient_splits_by_threads_bitwise(monkeypatch) -> None:
    # Without a gradient for the input (inference), a several-channel sampling is split as a
    # one-channel one: into as many items as threads that divide the depth, the values bitwise
    # those of one call.
    batches = _recording_grid_sample(monkeypatch)
    torch.manual_seed(0)
    spatial = (34, 32, 32)
    velocity = 2 * torch.randn(1, 3, *spatial)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            batches.clear()
            with torch.no_grad():
                results.append(integrate_velocity(velocity, 3))
            assert batches == [count] * 3
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("steps", [1, 7])
def test_integrate_equals_the_voxel_unit_squaring_loop(shape, steps: int) -> None:
    # The compositions run in grid_sample's normalised layout; against the plain loop in voxels
    # (u <- u + warp(u, u), float64, border padding), on a smooth field of up to 4 voxels that
    # reaches outside the grid at the border, with its gradient (offsets keep the positions off
    # whole voxels, where the interpolation has a kink).
    grid = identity_grid(shape, dtype=torch.float64)
    velocity = torch.cat([4.0 * torch.sin(grid / 3.0 + 1), 2.0 * torch.cos(grid / 4.0 + 0.3)], 0)
    expected = velocity / 2**steps
    for _ in range(steps):
        expected = expected + warp(expected, expected, padding="border")
    leaf = velocity.float().requires_grad_()
    actual = integrate_velocity(leaf, steps)
    assert actual.dtype == torch.float32 and actual.is_contiguous()
    assert_close(actual.double(), expected, rtol=0, atol=2e-5)
    weights = torch.rand_like(actual)
    (grad,) = torch.autograd.grad((actual * weights).sum(), leaf)
    reference = velocity.clone().requires_grad_()
    expected = reference / 2**steps
    for _ in range(steps):
        expected = expected + warp(expected, expected, padding="border")
    (expected_grad,) = torch.autograd.grad((expected * weights.double()).sum(), reference)
    assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-4)


def test_integrate_rejects_bad_input(shape) -> None:
    velocity = torch.zeros(1, len(shape), *shape)
    with pytest.raises(ValueError, match=r"'steps' must be >= 0"):
        integrate_velocity(velocity, -1)
    with pytest.raises(ValueError, match=r"'velocity' must have"):
        integrate_velocity(torch.zeros(1, len(shape) + 1, *shape))
    with pytest.raises(TypeError, match=r"'velocity' must be a floating-point"):
        integrate_velocity(velocity.int())
    with pytest.raises(ValueError, match=r"'steps' must be >= 0"):
        VelocityIntegrator(-2)


# ------------------------------------------------------------------------------------------
# jacobian_determinant
# ------------------------------------------------------------------------------------------


def test_jacobian_of_zero_is_one(shape) -> None:
    disp = torch.zeros(2, len(shape), *shape)
    det = jacobian_determinant(disp)
    assert det.shape == (2, 1, *shape)
    assert torch.equal(det, torch.ones_like(det))


@pytest.mark.parametrize("scale", [0.8, 1.5])
def test_jacobian_of_uniform_scaling(shape, make_linear_field, scale: float) -> None:
    ndim = len(shape)
    disp = make_linear_field(scale * torch.eye(ndim), shape)
    det = jacobian_determinant(disp)
    interior = (slice(None), slice(None), *[slice(1, s - 1) for s in shape])
    assert_close(det[interior], torch.full_like(det[interior], scale**ndim), rtol=1e-5, atol=1e-5)


def test_jacobian_of_general_linear_map_is_its_determinant(shape, make_linear_field) -> None:
    ndim = len(shape)
    matrix = torch.eye(ndim, dtype=torch.float64) + 0.3 * torch.randn(
        ndim, ndim, dtype=torch.float64
    )
    det = jacobian_determinant(make_linear_field(matrix, shape))
    expected = torch.linalg.det(matrix)
    assert_close(det, torch.full_like(det, float(expected)), rtol=1e-9, atol=1e-9)


def test_jacobian_of_planted_fold_is_negative_where_expected(shape, make_fold) -> None:
    c = shape[0] // 2
    det = jacobian_determinant(make_fold(shape, c))
    assert_close(det[:, :, :c], torch.ones_like(det[:, :, :c]), rtol=0, atol=1e-6)
    assert_close(det[:, :, c], torch.zeros_like(det[:, :, c]), rtol=0, atol=1e-6)
    assert_close(det[:, :, c + 1 :], -torch.ones_like(det[:, :, c + 1 :]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("size", [33, 34, 47, 80])
@pytest.mark.parametrize("ndim", [2, 3])
def test_jacobian_in_slabs_equals_the_whole_field_determinant(size: int, ndim: int) -> None:
    # Long first axes are processed in slabs with one neighbour plane each: the result must be
    # the determinant of the whole field with torch.gradient's differences (central inside,
    # one-sided at both ends), including the planes at slab edges and a last slab of 1-2 planes.
    torch.manual_seed(size)
    shape = (size, 9, 7)[:ndim]
    disp = 0.4 * torch.randn(2, ndim, *shape, dtype=torch.float64)
    grads = torch.gradient(disp, dim=list(range(2, 2 + ndim)))
    jac = torch.stack(
        [
            torch.stack([grads[a][:, c] + float(a == c) for a in range(ndim)], -1)
            for c in range(ndim)
        ],
        -2,
    )
    expected = torch.linalg.det(jac).unsqueeze(1)
    assert_close(jacobian_determinant(disp), expected, rtol=1e-12, atol=1e-12)


def test_jacobian_rejects_bad_input(shape) -> None:
    ndim = len(shape)
    with pytest.raises(ValueError, match=r"every spatial size of 'disp' must be >= 2"):
        jacobian_determinant(torch.zeros(1, ndim, *shape[:-1], 1))
    with pytest.raises(ValueError, match=r"'disp' must have"):
        jacobian_determinant(torch.zeros(1, 1, *shape))
    with pytest.raises(TypeError, match=r"'disp' must be a floating-point"):
        jacobian_determinant(torch.zeros(1, ndim, *shape, dtype=torch.int32))


@pytest.mark.parametrize("shape", [(12, 10), (8, 9, 10)])
def test_fast_warp_matches_the_exact_one(shape: tuple[int, ...]) -> None:
    """warp(exact=False) (the model's own warp: input dtype, cached identity) samples where the
    float64 warp does, to float32 rounding; float64 inputs stay float64."""
    torch.manual_seed(0)
    moving = torch.rand(2, 1, *shape)
    disp = torch.randn(2, len(shape), *shape) * 2.0
    exact = warp(moving, disp)
    fast = warp(moving, disp, exact=False)
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast, exact, rtol=0, atol=1e-5)
    again = warp(moving, disp, exact=False)  # the cached grid is not changed by use
    torch.testing.assert_close(again, fast, rtol=0, atol=0)
    double = warp(moving.double(), disp.double(), exact=False)
    assert double.dtype == torch.float64
    torch.testing.assert_close(double, exact.double(), rtol=0, atol=1e-5)
    assert float((warp(moving, torch.zeros_like(disp), exact=False) - moving).abs().max()) < 1e-6


def test_2d_cpu_warp_refuses_non_finite_positions_instead_of_crashing() -> None:
    """PyTorch's 2D CPU sampler crashes on NaN positions (pytorch#24823): warp raises first."""
    moving = torch.rand(1, 1, 16, 16)
    for bad in (float("nan"), float("inf")):
        disp = torch.zeros(1, 2, 16, 16)
        disp[0, 0, 3, 4] = bad
        for exact in (True, False):
            with pytest.raises(RuntimeError, match="non-finite"):
                warp(moving, disp, exact=exact)
    assert torch.isfinite(warp(moving, torch.zeros(1, 2, 16, 16), exact=False)).all()


@pytest.mark.parametrize("exact", [True, False])
def test_itk_padding_is_the_edge_value_to_half_a_voxel_out_then_zero(exact: bool) -> None:
    """``padding="itk"``: ITK's resampler rule (the written outputs'); "zeros" falls linearly."""
    image = torch.full((1, 1, 4, 5), 2.0)
    disp = torch.zeros(1, 2, 4, 5)
    disp[:, 1, :, 0] = -0.3  # column 0 samples at j = -0.3: inside ITK's half-voxel band
    disp[:, 1, :, 4] = 0.7  # column 4 samples at j = 4.7: more than half a voxel out
    itk = warp(image, disp, padding="itk", exact=exact)[0, 0]
    zeros = warp(image, disp, padding="zeros", exact=exact)[0, 0]
    assert torch.allclose(itk[:, 0], torch.tensor(2.0)) and torch.all(itk[:, 4] == 0)
    assert torch.allclose(itk[:, 1:4], torch.tensor(2.0))
    assert torch.allclose(zeros[:, 0], torch.tensor(1.4)) and torch.allclose(
        zeros[:, 4], torch.tensor(0.6)
    )
