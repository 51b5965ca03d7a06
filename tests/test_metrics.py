"""Tests for hyperreg.method.metrics: Dice per label, folding fraction, log-Jacobian spread."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from hyperreg.method.metrics import (
    dice_per_label,
    field_summary,
    folding_fraction,
    log_jacobian_std,
    mean_dice,
)

# ------------------------------------------------------------------------------------------
# Dice
# ------------------------------------------------------------------------------------------


def test_dice_of_identical_maps_is_one(shape) -> None:
    seg = torch.randint(0, 5, shape)
    scores = dice_per_label(seg, seg)
    assert list(scores) == [1, 2, 3, 4]  # background 0 excluded, ascending order
    assert all(v == 1.0 for v in scores.values())
    assert mean_dice(seg.numpy(), seg.numpy()) == 1.0


def test_dice_known_overlap_by_hand() -> None:
    a = np.array([[1, 1, 0], [2, 2, 0]])
    b = np.array([[1, 0, 0], [2, 2, 2]])
    scores = dice_per_label(a, b)
    # label 1: |A| = 2, |B| = 1, |A∩B| = 1 -> 2/3;  label 2: |A| = 2, |B| = 3, |A∩B| = 2 -> 4/5
    assert scores == pytest.approx({1: 2 / 3, 2: 4 / 5}, rel=1e-12)
    assert mean_dice(a, b) == pytest.approx((2 / 3 + 4 / 5) / 2, rel=1e-12)
    # a label present in only one map is not scored by default, and scores 0 when requested
    c = np.array([[1, 1, 0], [3, 3, 0]])
    assert list(dice_per_label(c, b)) == [1]
    assert dice_per_label(c, b, labels=[3])[3] == 0.0


def test_dice_agrees_with_monai(shape) -> None:
    from monai.metrics import compute_dice

    num = 4
    fixed = torch.randint(0, num, (2, *shape))
    moved = fixed.clone()
    noise = torch.rand(fixed.shape) < 0.3
    moved[noise] = torch.randint(0, num, (int(noise.sum()),))

    def one_hot(x: torch.Tensor) -> torch.Tensor:
        return F.one_hot(x, num).movedim(-1, 1).float()

    expected = compute_dice(one_hot(moved), one_hot(fixed), include_background=False)
    for b in range(2):
        scores = dice_per_label(moved[b], fixed[b], labels=range(1, num))
        actual = torch.tensor([scores[label] for label in range(1, num)], dtype=torch.float32)
        assert_close(actual, expected[b].float(), rtol=1e-6, atol=1e-6)


def test_dice_of_label_absent_from_both_is_nan() -> None:
    a = np.array([[1, 1], [0, 2]])
    scores = dice_per_label(a, a, labels=[1, 7])
    assert scores[1] == 1.0
    assert math.isnan(scores[7])
    assert mean_dice(a, a, labels=[1, 7]) == 1.0  # NaN entries are ignored
    assert math.isnan(mean_dice(a, a, labels=[7]))


def test_dice_accepts_integer_valued_floats() -> None:
    a = torch.tensor([[1.0, 2.0], [2.0, 0.0]])
    assert dice_per_label(a, a.long()) == {1: 1.0, 2: 1.0}


def test_dice_rejects_bad_input() -> None:
    a = np.array([[1, 2], [2, 0]])
    with pytest.raises(ValueError, match=r"'moved_seg' must hold integer label ids"):
        dice_per_label(a + 0.5, a)
    with pytest.raises(ValueError, match=r"'fixed_seg' must hold integer label ids"):
        dice_per_label(a, np.where(a > 0, np.nan, 0.0))
    with pytest.raises(TypeError, match=r"'moved_seg' must be an integer label map"):
        dice_per_label(a.astype(np.complex64), a)
    with pytest.raises(ValueError, match=r"'moved_seg' and 'fixed_seg' must have the same shape"):
        dice_per_label(a, a[:1])


# ------------------------------------------------------------------------------------------
# Jacobian-based field metrics
# ------------------------------------------------------------------------------------------


def test_folding_fraction_of_zero_is_zero(shape) -> None:
    assert folding_fraction(torch.zeros(2, len(shape), *shape)) == 0.0


def test_folding_fraction_of_planted_fold(shape, make_fold) -> None:
    c = shape[0] // 2
    fraction = folding_fraction(make_fold(shape, c))
    # J <= 0 on rows c .. H-1 (J = 0 at row c, -1 beyond), everything else unfolded
    assert fraction == pytest.approx((shape[0] - c) / shape[0], abs=1e-6)
    assert fraction > 0


def test_log_jacobian_std_of_translation_is_zero(shape, make_constant_field) -> None:
    disp = make_constant_field(shape, [1.5, -0.5, 2.0][: len(shape)], batch=2)
    assert log_jacobian_std(disp) == pytest.approx(0.0, abs=1e-6)


def test_log_jacobian_std_of_non_uniform_field_is_positive(shape) -> None:
    disp = 0.5 * torch.randn(1, len(shape), *shape)
    assert log_jacobian_std(disp) > 0.05


def test_field_summary(shape, make_constant_field) -> None:
    values = [3.0, 4.0, 0.0][: len(shape)]
    summary = field_summary(make_constant_field(shape, values))
    assert set(summary) == {"folding_fraction", "log_jacobian_std", "max_displacement"}
    assert summary["folding_fraction"] == 0.0
    assert summary["max_displacement"] == pytest.approx(5.0, rel=1e-6)


def test_field_metrics_reject_bad_input(shape) -> None:
    with pytest.raises(ValueError, match=r"'disp' must have"):
        folding_fraction(torch.zeros(1, len(shape) + 1, *shape))
    with pytest.raises(TypeError, match=r"'disp' must be a floating-point"):
        log_jacobian_std(torch.zeros(1, len(shape), *shape, dtype=torch.int64))


def test_hd95_per_label_on_hand_computed_squares() -> None:
    """A 5x5 square shifted by 2 voxels along axis 1: every boundary distance is 0 or 2,
    so the 95th percentile is 2 voxels, 4 mm at 2 mm spacing along that axis; a label in one
    map only is NaN; identical maps give 0."""
    from hyperreg.method.metrics import hd95_per_label

    a = np.zeros((20, 20), np.int32)
    b = a.copy()
    a[5:10, 5:10] = 1
    b[5:10, 7:12] = 1
    a[12:15, 12:15] = 2
    assert hd95_per_label(a, b) == {1: 2.0}
    assert hd95_per_label(a, b, spacing=(1.0, 2.0)) == {1: 4.0}
    scores = hd95_per_label(a, b, labels=[1, 2])
    assert scores[1] == 2.0 and math.isnan(scores[2])
    assert hd95_per_label(a, a) == {1: 0.0, 2: 0.0}
    with pytest.raises(ValueError, match="same shape"):
        hd95_per_label(a, b[:10])
