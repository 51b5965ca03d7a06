"""The label-free λ rule: a λ in [0, 1] from the grid, the smoothest that keeps most of the
similarity gain, folding respected, bad input refused."""

from __future__ import annotations

import pytest

from hyperreg.registration.autolambda import AUTO_GAIN, AUTO_GRID, choose_lambda


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


def test_default_grid_and_gain() -> None:
    assert list(AUTO_GRID) == sorted(set(AUTO_GRID))
    assert all(0.0 <= lam <= 1.0 for lam in AUTO_GRID)
    assert 0.0 < AUTO_GAIN <= 1.0


@pytest.mark.parametrize("knee", AUTO_GRID[:-1])
def test_finds_the_lambda_that_is_best_by_construction(knee: float) -> None:
    # similarity flat up to the knee, then falling steeply: the knee keeps the whole gain and
    # every larger λ loses more than half of it, so the default rule must pick the knee
    similarity = [0.8 if lam <= knee else 0.3 - 0.1 * lam for lam in AUTO_GRID]
    pick = choose_lambda(AUTO_GRID, similarity, [0.0] * len(AUTO_GRID))
    assert pick.lam == knee
    # a knee that folds too much is passed over for the next smaller λ that does not
    folding = [0.01 if lam == knee else 0.0 for lam in AUTO_GRID]
    if knee != AUTO_GRID[0]:
        below = AUTO_GRID[AUTO_GRID.index(knee) - 1]
        assert choose_lambda(AUTO_GRID, similarity, folding).lam == below


def test_random_curves_give_a_grid_lambda_and_a_one_line_reason() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(200):
        similarity = rng.uniform(0.0, 1.0, len(AUTO_GRID)).tolist()
        folding = rng.choice([0.0, 0.0005, 0.01], len(AUTO_GRID)).tolist()
        pick = choose_lambda(AUTO_GRID, similarity, folding)
        assert pick.lam in AUTO_GRID and 0.0 <= pick.lam <= 1.0
        assert pick.reason and "\n" not in pick.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gain": 0.0}, r"'gain' must lie in \(0, 1\]"),
        ({"gain": 1.5}, r"'gain' must lie in \(0, 1\]"),
        ({"gain": float("nan")}, r"'gain' must lie in \(0, 1\]"),
        ({"max_folding": -0.1}, r"'max_folding' must lie in \[0, 1\]"),
        ({"max_folding": float("nan")}, r"'max_folding' must lie in \[0, 1\]"),
    ],
)
def test_bad_settings(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        choose_lambda([0.1, 0.2], [0.5, 0.4], [0.0, 0.0], **kwargs)


@pytest.mark.parametrize(
    ("lambdas", "similarity", "folding", "message"),
    [
        ([0.1, 0.2], [0.5], [0.0, 0.0], "one length"),
        ([0.1, 1.5], [0.5, 0.4], [0.0, 0.0], r"lie in \[0, 1\]"),
        ([0.1, 0.2], [float("nan"), 0.4], [0.0, 0.0], "finite"),
        ([], [], [], "non-empty"),
        ([0.1, 0.1], [0.5, 0.4], [0.0, 0.0], "repeat"),
    ],
)
def test_bad_input(lambdas, similarity, folding, message) -> None:
    with pytest.raises(ValueError, match=message):
        choose_lambda(lambdas, similarity, folding)


def test_auto_lambda_on_a_pair_returns_a_grid_value(tmp_path) -> None:

    from lambda_helpers import write_blob_pair
    from hyperreg import load_pretrained
    from hyperreg.registration.autolambda import auto_lambda
    from hyperreg.registration.pipeline import load_pair

    pair = write_blob_pair(tmp_path)
    pick = auto_lambda(
        load_pair(pair["moving"], pair["fixed"], init="none"), load_pretrained(ndim=2)
    )
    assert pick.lam in AUTO_GRID
    assert len(pick.similarity) == len(AUTO_GRID) and pick.reason
