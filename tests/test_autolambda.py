"""The label-free λ rule: a λ in [0, 1] from the grid, the smoothest that keeps most of the
similarity gain, folding respected, bad input refused."""

from __future__ import annotations

import pytest

from hyperreg.registration.autolambda import AUTO_GRID, choose_lambda


def test_picks_the_knee_of_a_known_curve() -> None:
    lambdas = [0.05, 0.1, 0.3, 0.5, 0.9]
    # similarity saturates below λ 0.3: 0.3 is the largest λ within 90 % of the gain
    similarity = [0.80, 0.799, 0.795, 0.70, 0.40]
    pick = choose_lambda(lambdas, similarity, [0.0] * 5, gain=0.9)
    assert pick.lam == 0.3
    assert "largest λ" in pick.reason
    # in any order
    shuffled = choose_lambda(lambdas[::-1], similarity[::-1], [0.0] * 5, gain=0.9)
    assert shuffled.lam == 0.3


def test_folding_limit_and_fallbacks() -> None:
    lambdas = [0.01, 0.1, 0.5]
    pick = choose_lambda(lambdas, [0.9, 0.5, 0.1], [0.01, 0.0, 0.0], gain=0.95)
    assert pick.lam == 0.1  # λ 0.01 reaches the gain but folds 1 % of voxels
    worst = choose_lambda(lambdas, [0.9, 0.5, 0.1], [0.05, 0.02, 0.03])
    assert worst.lam == 0.1 and "folds least" in worst.reason
    flat = choose_lambda(AUTO_GRID, [0.5] * len(AUTO_GRID), [0.0] * len(AUTO_GRID))
    assert flat.lam == max(AUTO_GRID)
    assert all(0.0 <= value <= 1.0 for value in (pick.lam, worst.lam, flat.lam))


@pytest.mark.parametrize(
    ("lambdas", "similarity", "folding", "message"),
    [
        ([0.1, 0.2], [0.5], [0.0, 0.0], "one length"),
        ([0.1, 1.5], [0.5, 0.4], [0.0, 0.0], r"lie in \[0, 1\]"),
        ([0.1, 0.2], [float("nan"), 0.4], [0.0, 0.0], "finite"),
        ([], [], [], "non-empty"),
    ],
)
def test_bad_input(lambdas, similarity, folding, message) -> None:
    with pytest.raises(ValueError, match=message):
        choose_lambda(lambdas, similarity, folding)


def test_auto_lambda_on_a_pair_returns_a_grid_value(tmp_path) -> None:
    import numpy as np

    from lambda_helpers import blob, write_nifti
    from hyperreg import load_pretrained
    from hyperreg.registration.autolambda import auto_lambda
    from hyperreg.registration.pipeline import load_pair

    shape = (64, 64)
    moving = write_nifti(tmp_path / "m.nii.gz", blob(shape, (30, 34), 8.0).astype(np.float32))
    fixed = write_nifti(tmp_path / "f.nii.gz", blob(shape, (33, 31), 9.0).astype(np.float32))
    pick = auto_lambda(load_pair(moving, fixed, init="none"), load_pretrained(ndim=2))
    assert pick.lam in AUTO_GRID
    assert len(pick.similarity) == len(AUTO_GRID) and pick.reason
