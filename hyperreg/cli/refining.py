"""Command-line pieces of test-time refinement shared by ``register``, ``sweep`` and ``batch``.

:func:`refinement_from` turns ``--refine``/``--refine-sim``/``--refine-lr``
(:func:`hyperreg.cli.args.add_refine_arguments`) into a
:class:`~hyperreg.registration.refine.Refinement` (or None when off); :func:`refine_text` is
the one line each command prints per refined registration. The library is imported inside the
functions (``hyperreg --help`` stays fast).
"""

from __future__ import annotations

from typing import Any

__all__ = ["refine_text", "refinement_from"]


def refinement_from(args: Any) -> Any:
    """The :class:`~hyperreg.registration.refine.Refinement` of ``args``, or None for 0 steps.

    Raises:
        ValueError: If ``--refine-lr`` is not in (0, 100).
    """
    if not getattr(args, "refine", 0):
        return None
    from hyperreg.registration.refine import Refinement, check_refinement

    refinement = Refinement(steps=args.refine, sim=args.refine_sim, lr=args.refine_lr)
    try:
        check_refinement("refine", refinement)
    except ValueError as err:
        raise ValueError(f"argument --refine-lr: {str(err).split(': ', 1)[1]}") from None
    return refinement


def refine_text(stats: Any) -> str:
    """``refined 50 steps in 0.84 s: NCC 0.412 -> 0.468 (loss -0.31 -> -0.36)`` from a result's
    :class:`~hyperreg.registration.pipeline.RefineStats`; '' when not refined (None)."""
    if stats is None or not stats.steps:
        return ""
    name = "MI (nats)" if stats.similarity == "mi" else "NCC"
    return (
        f"refined {stats.steps} steps in {stats.seconds:.2f} s: "
        f"{name} {stats.similarity_before:.4f} -> {stats.similarity_after:.4f} "
        f"(loss {stats.loss_before:.4f} -> {stats.loss_after:.4f})"
    )
