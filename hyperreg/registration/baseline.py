"""What a pair's registration needs that its affine stage does not change, made beside it.

The affine stage (:func:`hyperreg.geometry.affine.register_affine`) runs on one ITK thread so
that its transforms repeat exactly; on a CPU with more torch threads than one the other core
would idle for its seconds. :func:`pair_baseline` is work that does not depend on the affine
result: the label ids the pair is scored on and its Dice as it came (the moving label map
through the headers); :func:`beside` runs it on a second thread while the affine stage runs.
Each value is the one the same computation gives one step after the other (integer counts,
nearest-neighbour resampling: nothing whose result depends on threads). The fixed image's
network-grid tensor is not made here: held from the affine stage to the verdict, it raised the
peak memory of a 256³ register by about 11 MiB. Must not import training, apps or cli.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from hyperreg.geometry.io import Volume, same_grid
from hyperreg.geometry.resample import resample_to
from hyperreg.method.metrics import label_sets, mean_registration_dice
from hyperreg.registration.lambdas import one_thread_workers

__all__ = ["PairBaseline", "beside", "pair_baseline"]

_A = TypeVar("_A")
_B = TypeVar("_B")


@dataclass
class PairBaseline:
    """The part of a prepared pair that does not depend on its affine stage.

    Attributes:
        labels: Label ids scored (the union of both maps' ids), or None without both maps.
        shared: The ids both maps hold, or None.
        dice_before: Mean Dice of the pair as it came (the moving label map on the fixed grid
            through the headers, nearest neighbour), or None.
    """

    labels: list[int] | None = None
    shared: list[int] | None = None
    dice_before: float | None = None


def pair_baseline(
    fixed: Volume, moving_seg: Volume | None, fixed_seg: Volume | None
) -> PairBaseline:
    """The :class:`PairBaseline` of a pair.

    Args:
        fixed: The fixed image; its grid is the pair's.
        moving_seg, fixed_seg: The label maps as read (integer, any grid), or None.

    Returns:
        The :class:`PairBaseline` (all None without both label maps).
    """
    base = PairBaseline()
    if moving_seg is not None and fixed_seg is not None:
        # the fixed map scored on the fixed grid, as the pipeline brings it there (headers)
        if not same_grid(fixed_seg, fixed):
            fixed_seg = resample_to(fixed_seg, fixed, label=True)
        base.labels, base.shared = label_sets(moving_seg.data, fixed_seg.data)
        as_came = moving_seg
        if not same_grid(moving_seg, fixed):
            as_came = resample_to(moving_seg, fixed, label=True)
        base.dice_before = mean_registration_dice(as_came.data, fixed_seg.data, labels=base.labels)
    return base


def beside(main: Callable[[], _A], other: Callable[[], _B]) -> tuple[_A, _B]:
    """``(main(), other())``, with ``other`` on a second thread while ``main`` runs when torch
    has more than one thread (``other`` on one torch thread); one after the other otherwise,
    ``main`` first, so that no extra thread is busy for a one-thread run.

    ``other`` must be thread-safe and its values must not depend on the thread count. An error
    of ``main`` is raised first (after ``other`` finished), then one of ``other``.
    """
    if torch.get_num_threads() < 2:
        first = main()
        return first, other()
    with one_thread_workers(1, caller_too=False) as pool:  # main keeps the caller's threads
        future: Any = pool.submit(other)
        first = main()
        return first, future.result()
