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
    with pytest.raises(ValueError, match=r"'levels' must be one of \(1, 2\)"):
        refine_flow(model, moving, fixed, 0.3, Refinement(levels=3))
