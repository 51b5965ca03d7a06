"""Tests for hyperreg.method.mind: the MIND-SSC descriptor and its similarity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from hyperreg.method.mind import mind_loss, mind_ssc, ssc_offsets
from hyperreg.method.objective import Objective
from hyperreg.registration.refine import Refinement, check_refinement


def _image(ndim: int, seed: int = 0) -> torch.Tensor:
    """A smooth random image ``(1, 1, *S)`` (sums of shifted noise), float32."""
    generator = torch.Generator().manual_seed(seed)
    shape = (10, 12, 9)[:ndim] if ndim == 3 else (14, 11)
    noise = torch.rand(1, 1, *shape, generator=generator)
    pool = torch.nn.functional.avg_pool3d if ndim == 3 else torch.nn.functional.avg_pool2d
    return pool(noise, 3, 1, 1)


def _reference_ssc(image: np.ndarray, radius: int, dilation: int) -> np.ndarray:
    """The definition written out voxel by voxel (2D, float64): for each pair of points of
    ``ssc_offsets`` the mean of squared differences over the box's voxels inside the image,
    the shifted points beyond the border taking the nearest voxel."""
    height, width = image.shape
    pairs = ssc_offsets(2, dilation)

    def at(i: int, j: int) -> float:
        return image[min(max(i, 0), height - 1), min(max(j, 0), width - 1)]

    def squared(p: tuple[int, ...], q: tuple[int, ...], i: int, j: int) -> float:
        return (at(i + p[0], j + p[1]) - at(i + q[0], j + q[1])) ** 2

    distance = np.zeros((len(pairs), height, width))
    for c, (p, q) in enumerate(pairs):
        for i, j in itertools.product(range(height), range(width)):
            box = [
                squared(p, q, i + a, j + b)
                for a in range(-radius, radius + 1)
                for b in range(-radius, radius + 1)
                if 0 <= i + a < height and 0 <= j + b < width  # the box's voxels inside
            ]
            distance[c, i, j] = np.mean(box)
    distance -= distance.min(0, keepdims=True)
    variance = distance.mean(0, keepdims=True)
    level = variance.mean()
    variance = np.clip(variance, 0.001 * level, 1000 * level)
    descriptor = np.exp(-distance / variance)
    return descriptor / descriptor.max(0, keepdims=True)


@pytest.mark.parametrize(("ndim", "count"), [(2, 4), (3, 12)])
def test_ssc_offsets_pairs_on_two_axes(ndim: int, count: int) -> None:
    pairs = ssc_offsets(ndim, dilation=2)
    assert len(pairs) == count
    for p, q in pairs:
        assert sum(abs(v) for v in p) == sum(abs(v) for v in q) == 2  # one axis, 2 voxels out
        assert [v != 0 for v in p] != [v != 0 for v in q]  # different axes
    assert len({frozenset(pair) for pair in pairs}) == count  # no pair twice


@pytest.mark.parametrize(("radius", "dilation"), [(0, 1), (1, 2)])
def test_descriptor_matches_the_definition(radius: int, dilation: int) -> None:
    image = _image(2, seed=3)
    found = mind_ssc(image.double(), radius=radius, dilation=dilation)[0].numpy()
    expected = _reference_ssc(image[0, 0].double().numpy(), radius, dilation)
    np.testing.assert_allclose(found, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("ndim", "channels"), [(2, 4), (3, 12)])
def test_descriptor_shape_and_range(ndim: int, channels: int) -> None:
    image = _image(ndim)
    descriptor = mind_ssc(image)
    assert descriptor.shape == (1, channels, *image.shape[2:])
    assert descriptor.dtype == torch.float32
    assert float(descriptor.min()) > 0
    assert_close(descriptor.amax(1), torch.ones_like(descriptor[:, 0]))


@pytest.mark.parametrize("ndim", [2, 3])
def test_loss_ignores_intensity_scale_shift_and_inversion(ndim: int) -> None:
    image = _image(ndim).double()
    other = _image(ndim, seed=1).double()
    assert float(mind_loss(image, image)) == 0.0
    for changed in (3.0 * image + 2.0, 1.0 - image):  # a T2's inverted edges look alike
        assert float(mind_loss(changed, image)) < 1e-12
    assert float(mind_loss(other, image)) > 0.01


def test_loss_grows_with_misalignment() -> None:
    image = _image(3, seed=2)
    losses = [float(mind_loss(torch.roll(image, s, dims=2), image)) for s in (0, 1, 2)]
    assert losses[0] < losses[1] < losses[2]


def test_loss_reduction_and_given_fixed_descriptor() -> None:
    moved = torch.cat([_image(3, seed=4), _image(3, seed=5)])
    fixed = torch.cat([_image(3, seed=6)] * 2)
    per_sample = mind_loss(moved, fixed, reduction="none")
    assert per_sample.shape == (2,)
    assert_close(mind_loss(moved, fixed), per_sample.mean())
    given = mind_loss(moved, fixed, reduction="none", fixed_descriptor=mind_ssc(fixed))
    assert_close(given, per_sample)


def test_loss_gradient() -> None:
    moved = _image(3, seed=7)[..., :6, :6, :6].double().requires_grad_()
    fixed = _image(3, seed=8)[..., :6, :6, :6].double()
    assert torch.autograd.gradcheck(lambda m: mind_loss(m, fixed, radius=1, dilation=1), (moved,))


def test_objective_and_refinement_take_mind() -> None:
    moved, fixed = _image(3, seed=9), _image(3, seed=10)
    objective = Objective(similarity="mind")
    assert_close(objective.image_term(moved, fixed), mind_loss(moved, fixed, reduction="none"))
    check_refinement("test", Refinement(sim="mind"))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x: mind_ssc(x.expand(1, 2, *x.shape[2:])), "'image' must have one channel"),
        (lambda x: mind_ssc(x, radius=-1), "'radius' must be an integer >= 0"),
        (lambda x: mind_ssc(x, dilation=0), "'dilation' must be an integer >= 1"),
        (lambda x: mind_ssc(x[0, 0]), "'image' must have shape"),
        (lambda x: mind_loss(x, x[..., :-1]), "'moved' and 'fixed'"),
        (lambda x: mind_loss(x, x, reduction="sum"), "'reduction' must be one of"),
        (lambda x: ssc_offsets(4), "'ndim' must be 2 or 3"),
    ],
)
def test_bad_input(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(_image(3))


def test_integer_image_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="'image'"):
        mind_ssc(torch.zeros(1, 1, 5, 5, 5, dtype=torch.int64))


def test_cli_refine_sim_mind_registers_as_other_contrasts(tmp_path, capsys) -> None:
    from lambda_helpers import write_nifti
    from test_contrast import T1, T2, phantom

    from hyperreg.cli import main

    moving = write_nifti(tmp_path / "t2.nii.gz", phantom(T2, 1.5, seed=1))
    fixed = write_nifti(tmp_path / "t1.nii.gz", phantom(T1))
    command = ["register", "--moving", str(moving), "--fixed", str(fixed), "--init", "none"]
    command += ["--moved", str(tmp_path / "moved.nii.gz"), "--device", "cpu", "-v"]
    assert main([*command, "--refine", "2", "--refine-sim", "mind"]) == 0
    said = capsys.readouterr()
    assert "-MIND distance" in said.out  # the refinement's line names its similarity
    assert "other contrasts (as asked)" in said.err  # said, though no check ran
    assert "raised to 0.2 for other contrasts" in said.out + said.err  # the model's 0.05
