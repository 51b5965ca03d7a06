"""λ chosen per pair without labels: the smoothest field that reaches most of the achievable
image similarity.

HyperMorph registers a pair at every λ in one batched pass, so the trade-off curve between
image similarity and regularisation is cheap to see for each pair. The rule here is the
discrepancy / L-curve idea of classical regularisation (choose the strongest regularisation
whose data fit is within a tolerance of the best fit), read off that curve:

    s(λ)   the image similarity of the moved and fixed images at λ (higher is better)
    λ_auto = the largest λ of the grid with s(λ) ≥ s_low + gain · (s_high − s_low)
             and folding(λ) ≤ max_folding

where ``s_high`` / ``s_low`` are the best and worst similarity over the grid. Nothing here
needs a label map. The grid and ``gain`` were chosen on pairs of people the bundled models
trained on (2D: every ordered pair of the seven Mindboggle people the 2D model trained on; 3D:
24 pairs of the IXI people the 3D model trained on), as the setting whose mean Dice falls
least below the best single λ of those tuning pairs in the worse of 2D and 3D, then measured
once on people the models never saw (``benchmarks/bench_auto_lambda.py``,
``benchmarks/RESULTS_auto_lambda.md``). There it keeps within a few thousandths of a Dice
point of the best single λ chosen with their labels, but below it, in 2D and in 3D: the
per-pair signal in the similarity curve is about as large as the noise. Must not import apps
or cli.

References:
    Hansen, Analysis of discrete ill-posed problems by means of the L-curve, SIAM Review 1992;
    Morozov's discrepancy principle. Hoopes et al., HyperMorph (MELBA 2022) for the per-pair
    λ trade-off. HyperPredict (arXiv 2403.02069) learns the same choice from (pair, λ).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the pipeline is not needed to choose from a curve
    from hyperreg.method.model import HyperMorph
    from hyperreg.registration.pipeline import PreparedPair

__all__ = [
    "AUTO_GAIN",
    "AUTO_GRID",
    "AUTO_MAX_FOLDING",
    "AutoLambda",
    "auto_lambda",
    "choose_lambda",
]

AUTO_GRID = (0.01, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.7, 0.9)
"""λ values of the label-free sweep: the earlier nine-value grid with 0.07, 0.15 and 0.25 added,
where the bundled models' best λ lie (chosen on tuning pairs, see the module docstring).
Twelve values: ``auto`` costs twelve forward passes of the model."""
AUTO_GAIN = 0.94
"""Share of the similarity gain over :data:`AUTO_GRID` the chosen λ keeps (chosen on tuning
pairs, see the module docstring)."""
AUTO_MAX_FOLDING = 0.001  # share of voxels with J <= 0


@dataclass(frozen=True)
class AutoLambda:
    """The λ chosen for one pair and why.

    Attributes:
        lam: The chosen λ, in [0, 1].
        reason: One line saying why (printed by the CLI, written to ``summary.csv``).
        lambdas: The grid searched.
        similarity: Image similarity at each grid λ (higher is better).
        folding: Share of voxels with J ≤ 0 at each grid λ.
    """

    lam: float
    reason: str
    lambdas: tuple[float, ...]
    similarity: tuple[float, ...]
    folding: tuple[float, ...]


def choose_lambda(
    lambdas: Sequence[float],
    similarity: Sequence[float],
    folding: Sequence[float],
    *,
    gain: float = AUTO_GAIN,
    max_folding: float = AUTO_MAX_FOLDING,
) -> AutoLambda:
    """Choose λ for one pair from its similarity / folding curve over a grid (no labels).

    Args:
        lambdas: Grid of λ values in [0, 1] (any order, no duplicates).
        similarity: Image similarity of moved and fixed at each λ, higher is better (e.g. local
            NCC in [0, 1]).
        folding: Share (not %) of voxels with Jacobian determinant ≤ 0 at each λ.
        gain: Share of the similarity gain across the grid that the chosen λ must keep, in
            (0, 1].
        max_folding: Largest share of folded voxels allowed, in [0, 1].

    Returns:
        :class:`AutoLambda`: the largest λ whose similarity keeps ``gain`` of the gain and that
        folds at most ``max_folding``; if none keeps the gain, the most similar λ among those
        within the folding limit; if every λ folds more, the λ that folds least.

    Raises:
        ValueError: If the sequences differ in length or are empty, a value is not finite, a λ
            lies outside [0, 1] or appears twice, ``gain`` is outside (0, 1] or ``max_folding``
            outside [0, 1].
    """
    fn = "choose_lambda"
    if not len(lambdas) == len(similarity) == len(folding) or not lambdas:
        raise ValueError(
            f"{fn}(): 'lambdas', 'similarity' and 'folding' must be non-empty and of one length, "
            f"got {len(lambdas)}, {len(similarity)} and {len(folding)}"
        )
    values = [float(v) for v in (*lambdas, *similarity, *folding)]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{fn}(): every λ, similarity and folding value must be finite")
    if not all(0.0 <= float(v) <= 1.0 for v in lambdas):
        raise ValueError(f"{fn}(): 'lambdas' must lie in [0, 1], got {list(lambdas)}")
    if len(set(values[: len(lambdas)])) != len(lambdas):
        raise ValueError(f"{fn}(): 'lambdas' must not repeat a value, got {list(lambdas)}")
    if not 0.0 < gain <= 1.0:
        raise ValueError(f"{fn}(): 'gain' must lie in (0, 1], got {gain}")
    if not 0.0 <= max_folding <= 1.0:
        raise ValueError(f"{fn}(): 'max_folding' must lie in [0, 1], got {max_folding}")
    order = sorted(range(len(lambdas)), key=lambda i: float(lambdas[i]))
    lam = tuple(float(lambdas[i]) for i in order)
    sim = tuple(float(similarity[i]) for i in order)
    fold = tuple(float(folding[i]) for i in order)
    high, low = max(sim), min(sim)
    target = low + gain * (high - low)
    allowed = [i for i in range(len(lam)) if fold[i] <= max_folding]
    if not allowed:
        best = min(range(len(lam)), key=lambda i: (fold[i], -lam[i]))
        reason = (
            f"every λ of the grid folds more than {100 * max_folding:g} % of voxels; λ "
            f"{lam[best]:g} folds least ({100 * fold[best]:.3f} %)"
        )
        return AutoLambda(lam[best], reason, lam, sim, fold)
    reaching = [i for i in allowed if sim[i] >= target - 1e-12]
    if reaching:
        pick = max(reaching, key=lambda i: lam[i])
        share = 1.0 if high == low else (sim[pick] - low) / (high - low)
        reason = (
            f"largest λ keeping {100 * gain:g} % of the similarity gain over the grid "
            f"({100 * share:.0f} %: similarity {sim[pick]:.4f}, best {high:.4f} at λ "
            f"{lam[sim.index(high)]:g}), folding {100 * fold[pick]:.3f} %"
        )
    else:
        pick = max(allowed, key=lambda i: sim[i])
        reason = (
            f"the λ of best similarity among those folding at most {100 * max_folding:g} % "
            f"(similarity {sim[pick]:.4f})"
        )
    return AutoLambda(lam[pick], reason, lam, sim, fold)


def auto_lambda(
    prepared: PreparedPair, model: HyperMorph, grid: Sequence[float] = AUTO_GRID
) -> AutoLambda:
    """Choose λ for a prepared pair without its labels: one batched sweep over ``grid``
    (:meth:`~hyperreg.registration.pipeline.PreparedPair.register` with NCC), then
    :func:`choose_lambda` on the NCC / folding curve.

    Args:
        prepared: The pair (:func:`~hyperreg.registration.pipeline.load_pair`).
        model: The model that will register it.
        grid: λ values to search, in [0, 1].

    Returns:
        :class:`AutoLambda`; register the pair at ``.lam`` afterwards (the sweep's results are
        not kept, so a refined registration still optimises at the chosen λ only).

    Raises:
        ValueError: As :meth:`~hyperreg.registration.pipeline.PreparedPair.register`.
    """
    # the model's raw curve; the verdict is the registration's at the λ chosen, not the grid's
    results = prepared.register(model, list(grid), ncc=True, judged=False)
    similarity = [float(r.ncc) if r.ncc is not None else math.nan for r in results]
    return choose_lambda(list(grid), similarity, [r.folding_fraction for r in results])
