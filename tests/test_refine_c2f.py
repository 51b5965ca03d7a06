"""Coarse-to-fine test-time refinement (issue 22): it lowers the model's objective, stays
diffeomorphic, stops early, falls back to the network's field when its loss becomes NaN, and
refine_pair names refine_flow when given tensors (issue 23 item 5)."""

from __future__ import annotations


import pytest
import torch

import hyperreg.registration.refine_levels as levels_module
from lambda_helpers import blob, tiny_model
from hyperreg.method.spatial import jacobian_determinant
from hyperreg.registration.refine import Refinement, refine_flow, refine_pair
from hyperreg.registration.refine_levels import QuarterLevel, RefineLevel, level_steps


def _pair(ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two blobs 3 voxels apart in the middle of a grid with a background margin."""
    shape = (40, 36) if ndim == 2 else (24, 20, 28)
    moving = blob(shape, tuple(s / 2 - 1.5 for s in shape), sigma=3.0)
    fixed = blob(shape, tuple(s / 2 + 1.5 for s in shape), sigma=3.5)
    return torch.from_numpy(moving)[None, None], torch.from_numpy(fixed)[None, None]


@pytest.mark.parametrize("ndim", [2, 3])
def test_coarse_to_fine_lowers_the_objective_and_keeps_the_jacobian_positive(ndim: int) -> None:
    model = tiny_model(ndim)
    moving, fixed = _pair(ndim)
    refined = refine_flow(model, moving, fixed, 0.3, Refinement(steps=40, lr=0.2, levels=2))
    assert refined.steps[0] > 0 and refined.steps[1] > 0  # both levels ran
    assert refined.loss_after < refined.loss_before and not refined.fell_back
    assert refined.similarity_after > refined.similarity_before
    det = jacobian_determinant(refined.output.disp)
    assert float(det.min()) > 0
    # the returned flow is what the output integrates (exactly the model's path)
    again = model.flow_to_output(refined.flow, moving)
    torch.testing.assert_close(again.disp, refined.output.disp, rtol=0, atol=1e-6)


def test_one_level_is_the_fine_level_only() -> None:
    model = tiny_model(2)
    moving, fixed = _pair(2)
    refined = refine_flow(model, moving, fixed, 0.3, Refinement(steps=15, lr=0.2, levels=1))
    assert refined.steps[0] == 0 and 0 < refined.steps[1] <= 15
    assert refined.loss_after < refined.loss_before


def test_refinement_stops_early_when_the_loss_stops_improving() -> None:
    model = tiny_model(2)
    moving, _ = _pair(2)
    refinement = Refinement(steps=500, lr=0.05, levels=2)
    refined = refine_flow(model, moving, moving.clone(), 0.9, refinement)
    assert refined.steps[0] < 500 and refined.steps[1] < 500  # nothing to gain: stopped


def test_a_nan_loss_is_an_error_not_a_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(2)
    moving, fixed = _pair(2)
    terms = levels_module._terms
    calls = {"n": 0}

    def diverging(*args, **kwargs):  # type: ignore[no-untyped-def]
        loss, image = terms(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan"), image) if calls["n"] > 4 else (loss, image)

    monkeypatch.setattr(levels_module, "_terms", diverging)
    with pytest.raises(RuntimeError, match=r"the refinement's loss became NaN"):
        refine_flow(model, moving, fixed, 0.3, Refinement(steps=20, levels=2))
    assert calls["n"] > 4  # the NaN came from the optimisation, not from the start


def test_refine_pair_on_tensors_names_refine_flow() -> None:
    model = tiny_model(2)
    moving, fixed = _pair(2)
    with pytest.raises(TypeError, match=r"refine_pair\(\): 'moving' must be a Volume.*refine_flow"):
        refine_pair(model, moving, fixed, 0.3, Refinement(steps=5))  # type: ignore[arg-type]


def test_bad_levels_are_rejected() -> None:
    model = tiny_model(2)
    moving, fixed = _pair(2)
    with pytest.raises(ValueError, match=r"'levels' must be one of \(1, 2, 3\)"):
        refine_flow(model, moving, fixed, 0.3, Refinement(levels=4))


def test_level_steps_split_the_steps_per_level() -> None:
    model_3d, model_2d = tiny_model(3), tiny_model(2)
    assert level_steps(model_3d, 30, 3) == (30, 15, 15)
    assert level_steps(model_3d, 5, 3) == (5, 3, 3)
    assert level_steps(model_2d, 30, 3) == (30, 15, 15)
    assert level_steps(model_3d, 30, 2) == (0, 30, 30)
    assert level_steps(model_3d, 30, 1) == (0, 0, 30)
    assert level_steps(model_3d, 0, 3) == (0, 0, 0)
    assert level_steps(model_3d, 30, Refinement().levels) == (0, 0, 30)  # the default
    model_3d.half_res = False  # no half-resolution velocity: the fine level only
    assert level_steps(model_3d, 30, 3) == (0, 0, 30)


@pytest.mark.parametrize("ndim", [2, 3])
def test_three_levels_lower_the_objective_and_stay_diffeomorphic(ndim: int) -> None:
    model = tiny_model(ndim)
    moving, fixed = _pair(ndim)
    refinement = Refinement(steps=20, lr=0.2, levels=3)
    refined = refine_flow(model, moving, fixed, 0.3, refinement)
    assert refined.quarter_steps > 0 and refined.steps[0] > 0 and refined.steps[1] > 0
    assert refined.loss_after < refined.loss_before and not refined.fell_back
    assert refined.stats(refinement).quarter_steps == refined.quarter_steps
    assert float(jacobian_determinant(refined.output.disp).min()) > 0
    again = model.flow_to_output(refined.flow, moving)
    torch.testing.assert_close(again.disp, refined.output.disp, rtol=0, atol=1e-6)


def test_the_quarter_level_corrects_the_velocity_it_starts_from() -> None:
    model = tiny_model(3)
    moving, fixed = _pair(3)
    with torch.no_grad():
        start = model.predict_flow(moving, fixed, 0.3)
    objective = model.objective
    coarse = RefineLevel(model, objective, moving, fixed, 0.3, True)
    quarter = QuarterLevel(coarse, start)
    zero = quarter.zeros()
    assert tuple(zero.shape[2:]) == tuple(-(-n // 2) for n in start.shape[2:])
    torch.testing.assert_close(quarter.velocity(zero), start, rtol=0, atol=0)
    # a constant correction c on the quarter grid is 2c on the velocity's grid
    shifted = quarter.velocity(torch.full_like(zero, 0.25))
    torch.testing.assert_close(shifted - start, torch.full_like(start, 0.5))
    correction = zero.clone().requires_grad_(True)
    loss, image = quarter(correction)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(image)
    assert correction.grad is not None and float(correction.grad.abs().sum()) > 0
