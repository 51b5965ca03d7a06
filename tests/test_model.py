"""Tests for hyperreg.method.model: HyperMorph forward pass, λ semantics and checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from hyperreg.config import ModelConfig
from hyperreg.method.losses import gradient_loss, ncc_loss
from hyperreg.method.model import (
    FORMAT_VERSION,
    HyperMorph,
    RegistrationOutput,
    load_checkpoint,
    save_checkpoint,
)
from hyperreg.method.spatial import integrate_velocity, resize_field

# Multiples of 16 (no padding) for the plain shape checks.
MODEL_SHAPES = {2: (32, 48), 3: (16, 16, 32)}
SMALL = {
    "enc_channels": (4, 8, 8, 8),
    "dec_channels": (8, 8, 8, 8, 8, 4, 4),
    "hyper_hidden": (16, 16),
}


def _small(ndim: int, **kwargs: object) -> HyperMorph:
    return HyperMorph(ModelConfig(ndim=ndim, **{**SMALL, **kwargs}))  # type: ignore[arg-type]


def _pair(
    spatial: tuple[int, ...], make_blobs, batch: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    return make_blobs(spatial, batch=batch), make_blobs(spatial, batch=batch)


# ------------------------------------------------------------------------------------------
# output shapes
# ------------------------------------------------------------------------------------------


def test_registration_output_fields_are_stable() -> None:
    assert RegistrationOutput._fields == ("moved", "disp", "velocity")


@pytest.mark.parametrize("int_steps", [7, 0])
def test_forward_output_shapes(ndim: int, int_steps: int, make_blobs) -> None:
    spatial = MODEL_SHAPES[ndim]
    model = HyperMorph(ModelConfig(ndim=ndim, int_steps=int_steps))
    moving, fixed = _pair(spatial, make_blobs, batch=2)
    out = model(moving, fixed, 0.5)
    assert isinstance(out, RegistrationOutput)
    assert out.moved.shape == (2, 1, *spatial)
    assert out.disp.shape == (2, ndim, *spatial)
    if int_steps > 0:
        assert out.velocity is not None
        assert out.velocity.shape == (2, ndim, *[s // 2 for s in spatial])
    else:
        assert out.velocity is None
    for tensor in (out.moved, out.disp):
        assert tensor.dtype == torch.float32
        assert torch.isfinite(tensor).all()


def test_full_resolution_integration(make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = _small(2, int_downsize=1)
    out = model(*_pair(spatial, make_blobs), 0.3)
    assert out.velocity is not None
    assert out.velocity.shape == (1, 2, *spatial)


def test_size_not_divisible_by_16_keeps_shape(make_blobs) -> None:
    spatial = (150, 181)
    model = _small(2)
    out = model(*_pair(spatial, make_blobs), 0.5)
    assert out.moved.shape == (1, 1, *spatial)
    assert out.disp.shape == (1, 2, *spatial)
    assert torch.isfinite(out.disp).all()


@pytest.mark.parametrize("spatial", [(30, 17, 33), (32, 16, 48), (31, 20, 47)])
def test_flow_to_output_upsamples_only_the_planes_the_crop_reads(spatial, make_blobs) -> None:
    # The half-resolution field is upsampled over the planes the crop to the image reads, not
    # the whole padded grid: bitwise the field of upsampling it all and cropping after, for
    # even, odd and multiple-of-16 sizes, on a velocity of a few voxels.
    model = _small(3)
    padded = tuple(math.ceil(s / 16) * 16 for s in spatial)
    torch.manual_seed(0)
    flow = 3 * torch.randn(1, 3, *[p // 2 for p in padded])
    moving = make_blobs(spatial)
    out = model.flow_to_output(flow, moving)
    whole = resize_field(integrate_velocity(flow, model.config.int_steps), 2.0, padded)
    expected = whole[(slice(None), slice(None), *[slice(0, s) for s in spatial])]
    assert out.disp.shape == (1, 3, *spatial)
    assert torch.equal(out.disp, expected)


def test_velocity_shape_for_size_not_divisible_by_16(ndim: int, make_blobs) -> None:
    # RegistrationOutput documents velocity as (B, N, *S') with S' = S / int_downsize; the
    # padding to a multiple of 16 is an internal detail and must not leak into the velocity.
    spatial = {2: (16, 20), 3: (8, 10, 12)}[ndim]
    out = _small(ndim)(*_pair(spatial, make_blobs), 0.5)
    assert out.velocity is not None
    assert out.velocity.shape == (1, ndim, *[math.ceil(s / 2) for s in spatial])


def test_initial_displacement_is_near_zero(make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = HyperMorph(ModelConfig(ndim=2))
    moving, fixed = _pair(spatial, make_blobs)
    for lam in (0.0, 0.5, 1.0):
        out = model(moving, fixed, lam)
        assert out.disp.abs().max() < 1e-2, lam
        assert out.disp.abs().max() > 0, lam


# ------------------------------------------------------------------------------------------
# λ semantics
# ------------------------------------------------------------------------------------------


def test_per_sample_lambda_gives_different_fields(ndim: int, make_blobs) -> None:
    spatial = MODEL_SHAPES[ndim]
    model = _small(ndim)
    moving, fixed = _pair(spatial, make_blobs)
    with torch.no_grad():
        out = model(
            moving.expand(2, -1, *spatial), fixed.expand(2, -1, *spatial), torch.tensor([0.0, 1.0])
        )
    scale = float(out.disp.abs().max())
    assert scale > 0
    assert (out.disp[0] - out.disp[1]).abs().max() > 1e-2 * scale


@pytest.mark.parametrize("lam_shape", [(2,), (2, 1)])
def test_batched_lambda_equals_single_calls(ndim: int, make_blobs, lam_shape) -> None:
    spatial = MODEL_SHAPES[ndim]
    model = _small(ndim)
    moving, fixed = _pair(spatial, make_blobs, batch=2)
    lams = torch.tensor([0.2, 0.9])
    with torch.no_grad():
        batched = model(moving, fixed, lams.view(lam_shape))
    for i in range(2):
        with torch.no_grad():
            single = model(moving[i : i + 1], fixed[i : i + 1], float(lams[i]))
        for name in ("moved", "disp", "velocity"):
            expected = getattr(single, name)
            scale = float(expected.abs().max())
            actual = getattr(batched, name)[i : i + 1]
            # the displacement is tiny at initialisation: compare relative to its own size
            assert_close(actual, expected, rtol=1e-4, atol=max(1e-5 * scale, 1e-9), msg=name)


@torch.no_grad()
def test_one_lambda_for_the_batch_forms_agree(make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = _small(2)
    moving, fixed = _pair(spatial, make_blobs, batch=2)
    reference = model(moving, fixed, 0.4).disp
    scale = float(reference.abs().max())
    for lam in (
        torch.tensor(0.4),
        torch.tensor([0.4]),
        torch.tensor([[0.4]]),
        torch.tensor([0.4, 0.4]),
    ):
        assert_close(model(moving, fixed, lam).disp, reference, rtol=1e-4, atol=1e-5 * scale)


def test_lambda_count_must_be_one_or_batch(make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = _small(2)
    moving, fixed = _pair(spatial, make_blobs, batch=2)
    with pytest.raises(ValueError, match=r"'lam' must hold 1 value or one per sample \(2\), got 3"):
        model(moving, fixed, torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match=r"'lam' must have shape"):
        model(moving, fixed, torch.full((2, 2), 0.5))


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan")])
def test_lambda_out_of_range_raises(value: float, make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = _small(2)
    moving, fixed = _pair(spatial, make_blobs, batch=2)
    with pytest.raises(ValueError, match=r"'lam' must lie in \[0, 1\]"):
        model(moving, fixed, value)
    with pytest.raises(ValueError, match=r"'lam' must lie in \[0, 1\]"):
        model(moving, fixed, torch.tensor([0.5, value]))


def test_lambda_of_wrong_type_raises(make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = _small(2)
    moving, fixed = _pair(spatial, make_blobs)
    with pytest.raises(TypeError, match=r"'lam' must be a float or a tensor, got bool"):
        model(moving, fixed, True)
    with pytest.raises(TypeError, match=r"'lam' must be a float or a tensor, got str"):
        model(moving, fixed, "0.5")  # type: ignore[arg-type]


def test_each_sample_loss_uses_its_own_lambda(make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = _small(2)
    moving, fixed = _pair(spatial, make_blobs, batch=2)
    lam = torch.tensor([0.0, 1.0])
    out = model(moving, fixed, lam)
    assert out.velocity is not None
    sim = ncc_loss(out.moved, fixed, window=5, reduction="none")
    reg = gradient_loss(out.velocity, reduction="none")
    loss = (1 - lam) * sim + lam * reg
    assert loss.shape == (2,)
    # per-sample terms equal the terms computed on each sample alone
    for i in range(2):
        alone_sim = ncc_loss(out.moved[i : i + 1], fixed[i : i + 1], window=5)
        alone_reg = gradient_loss(out.velocity[i : i + 1])
        assert_close(sim[i], alone_sim, rtol=1e-6, atol=1e-7)
        assert_close(reg[i], alone_reg, rtol=1e-6, atol=0)
    assert_close(loss[0], sim[0], rtol=0, atol=0)
    assert_close(loss[1], reg[1], rtol=0, atol=0)
    # autograd: sample 0's loss reaches only sample 0's velocity, and only through similarity
    (grad_loss0,) = torch.autograd.grad(loss[0], out.velocity, retain_graph=True)
    (grad_sim0,) = torch.autograd.grad(sim[0], out.velocity, retain_graph=True)
    (grad_reg0,) = torch.autograd.grad(reg[0], out.velocity, retain_graph=True)
    assert torch.equal(grad_loss0[1], torch.zeros_like(grad_loss0[1]))
    assert grad_loss0[0].abs().max() > 0
    assert_close(grad_loss0, grad_sim0, rtol=1e-6, atol=0)
    assert grad_reg0[0].abs().max() > 0  # the regulariser would have contributed


def test_forward_rejects_bad_images(make_blobs) -> None:
    spatial = MODEL_SHAPES[2]
    model = _small(2)
    moving, fixed = _pair(spatial, make_blobs)
    with pytest.raises(ValueError, match=r"'moving' and 'fixed' must have the same shape"):
        model(moving, fixed[..., :-1], 0.5)
    with pytest.raises(ValueError, match=r"'moving' must have 1 channel\(s\) and 2 spatial dims"):
        model(moving.expand(1, 2, *spatial), fixed.expand(1, 2, *spatial), 0.5)
    with pytest.raises(ValueError, match=r"'moving' must have 1 channel\(s\) and 2 spatial dims"):
        model(moving.unsqueeze(2), fixed.unsqueeze(2), 0.5)
    with pytest.raises(TypeError, match=r"'moving' must be a floating-point tensor"):
        model(moving.long(), fixed, 0.5)


# ------------------------------------------------------------------------------------------
# checkpoints
# ------------------------------------------------------------------------------------------


def test_checkpoint_round_trip(ndim: int, make_blobs, tmp_path) -> None:
    spatial = MODEL_SHAPES[ndim]
    model = _small(ndim, parametrization="default" if ndim == 3 else "mip").eval()
    moving, fixed = _pair(spatial, make_blobs, batch=2)
    lam = torch.tensor([0.1, 0.8])
    with torch.no_grad():
        before = model(moving, fixed, lam)
    path = save_checkpoint(model, tmp_path / "sub" / "model.pt", step=12)
    assert path == tmp_path / "sub" / "model.pt"
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.pt"]  # no temporary left
    loaded, payload = load_checkpoint(path, map_location="cpu")
    assert not loaded.training
    assert loaded.config == model.config
    assert payload["format_version"] == FORMAT_VERSION
    assert payload["step"] == 12
    with torch.no_grad():
        after = loaded(moving, fixed, lam)
    for name in ("moved", "disp", "velocity"):
        assert torch.equal(getattr(after, name), getattr(before, name)), name


def test_inference_reuses_weights_until_lambda_or_parameters_change(make_blobs) -> None:
    """Eval-mode no-grad calls reuse the last λ's generated weights; any change regenerates."""
    model = _small(2).eval()
    moving, fixed = _pair(MODEL_SHAPES[2], make_blobs)
    calls: list[float] = []
    generate = model.generate_weights

    def counted(lam: torch.Tensor) -> dict[str, torch.Tensor]:
        calls.extend(lam.flatten().tolist())
        return generate(lam)

    model.generate_weights = counted  # type: ignore[method-assign]
    with torch.no_grad():
        first = model(moving, fixed, 0.3).disp
        again = model(moving, fixed, 0.3).disp
        assert len(calls) == 1
        assert torch.equal(first, again)
        model(moving, fixed, 0.7)
        assert len(calls) == 2
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.enable_grad():  # grad enabled: never cached
        model(moving, fixed, 0.7).disp.abs().mean().backward()
    assert len(calls) == 3
    optimizer.step()  # in place: the version counters move
    with torch.no_grad():
        stepped = model(moving, fixed, 0.7).disp
        assert len(calls) == 4
        model.load_state_dict(_small(2).state_dict())
        reloaded = model(moving, fixed, 0.7).disp
        assert len(calls) == 5
    assert not torch.equal(stepped, reloaded)
    model.train()
    model(moving, fixed, 0.7)
    assert len(calls) == 6  # training mode: generated every call


def test_state_dict_has_no_grid_buffers() -> None:
    model = _small(3)
    keys = list(model.state_dict())
    assert keys
    assert not [k for k in keys if "grid" in k.lower()]
    assert len(list(model.buffers())) == 0


def test_checkpoint_wrong_format_version_raises(tmp_path) -> None:
    path = save_checkpoint(_small(2), tmp_path / "model.pt")
    payload = torch.load(path, weights_only=True)
    payload["format_version"] = 99
    torch.save(payload, path)
    with pytest.raises(RuntimeError, match=rf"format_version 99.*format_version {FORMAT_VERSION}"):
        load_checkpoint(path)


def test_checkpoint_config_mismatch_raises(tmp_path) -> None:
    path = save_checkpoint(_small(2), tmp_path / "model.pt")
    payload = torch.load(path, weights_only=True)
    payload["model_config"]["enc_channels"] = [4, 8, 8, 16]
    torch.save(payload, path)
    with pytest.raises(RuntimeError):
        load_checkpoint(path)


def test_checkpoint_missing_file_raises(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no such file"):
        load_checkpoint(tmp_path / "absent.pt")


def test_checkpoint_garbage_file_raises(tmp_path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a checkpoint\x00\x01\x02")
    with pytest.raises(ValueError, match=r"cannot read"):
        load_checkpoint(garbage)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match=r"no format_version"):
        load_checkpoint(other)


# ------------------------------------------------------------------------------------------
# GPU (skipped where CUDA is absent; never needed in CI)
# ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_and_checkpoint_from_gpu_loads_on_cpu(make_blobs, tmp_path) -> None:
    model = _small(2).eval()
    moving, fixed = _pair(MODEL_SHAPES[2], make_blobs, batch=2)
    lam = torch.tensor([0.2, 0.9])
    with torch.no_grad():
        on_cpu = model(moving, fixed, lam)
        gpu_model = model.to("cuda")
        on_gpu = gpu_model(moving.cuda(), fixed.cuda(), lam.cuda())
    assert on_gpu.disp.device.type == "cuda"
    assert_close(on_gpu.moved.cpu(), on_cpu.moved, rtol=1e-3, atol=1e-4)
    path = save_checkpoint(gpu_model, tmp_path / "gpu.pt")
    loaded, _ = load_checkpoint(path, map_location="cpu")
    assert all(p.device.type == "cpu" for p in loaded.parameters())
