"""The one registry of image similarities: their names, what each is for, where each applies.

:data:`SIMILARITIES` names every image similarity of the objective
(:class:`hyperreg.method.objective.Objective`, which computes them); the command line's choices
and the checks of refinement (:mod:`hyperreg.registration.refine`) and training
(:mod:`hyperreg.training.train`) all come from here. Imports nothing (the command line reads it
without loading torch).
"""

from __future__ import annotations

__all__ = ["REFINE_SIMILARITIES", "SIMILARITIES", "TRAIN_SIMILARITIES"]

SIMILARITIES: dict[str, str] = {
    "ncc": "local normalised cross-correlation (window of the model, 9 by default)",
    "mse": "mean squared intensity difference, scaled by the model's noise sigma",
    "mi": "global mutual information (pairs of different contrast, e.g. T2 to T1)",
    "ngf": "normalised gradient fields: whether edges lie along each other (judges pairs of "
    "different contrast)",
    "mind": "MIND-SSC: local self-similarity descriptors compared by squared difference "
    "(pairs of different contrast)",
}
"""Every image similarity, name -> one line saying what it is."""

TRAIN_SIMILARITIES: tuple[str, ...] = ("ncc", "mse")
"""The similarities a model can be trained with (``hyperreg train --sim``)."""

REFINE_SIMILARITIES: tuple[str, ...] = ("ncc", "mse", "mi", "mind")
"""The similarities a test-time refinement can minimise (``--refine-sim``); ``"ngf"`` only
judges (the verdict of pairs of different contrast), it is not offered for refinement."""
