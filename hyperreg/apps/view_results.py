"""The numbers of the λ explorer: one registration's readout for the page, and λ checks.

:func:`readout` is what the live page (:mod:`hyperreg.apps.view`) and the sweep page
(:mod:`hyperreg.apps.view_page`) show for one :class:`~hyperreg.registration.results.PairResult`;
:func:`network_text` says which network passes and flips made it; :func:`check_view_lam` checks
a λ sent by the page. Must not import the server or cli.
"""

from __future__ import annotations

import math
from typing import Any

from hyperreg._errors import InputError
from hyperreg.registration.results import PairResult

__all__ = ["Superseded", "check_view_lam", "network_text", "readout"]


class Superseded(RuntimeError):
    """A page request for a λ that a newer request replaced before its registration started
    (:meth:`hyperreg.apps.view.ViewSession.page_result`): it was not registered."""


def network_text(passes: int, flips: bool) -> str:
    """Network passes and flip averaging in words, e.g. ``"2 passes, flip averaging"``."""
    words = f"{passes} pass" + ("" if passes == 1 else "es")
    return words + (", flip averaging" if flips else ", no flip averaging")


def readout(
    result: PairResult, seconds: float | None = None, preview: bool = False
) -> dict[str, Any]:
    """The numbers the page shows for one registration, JSON-ready (NaN and missing: None):
    ``lam``, ``mean_dice``, ``dice`` (``{label: Dice}``), ``folding_percent``,
    ``log_jacobian_std``, ``ncc`` (local NCC, the similarity), ``refined``, ``preview``
    (``preview`` as given: a quick result of one network pass without flip averaging),
    ``network`` (:func:`network_text` of the result's settings; empty when it has none) and
    ``seconds`` (time of the registration)."""

    def number(value: float | None) -> float | None:
        return None if value is None or math.isnan(value) else float(value)

    settings = result.settings
    return {
        "lam": float(result.lam),
        "mean_dice": number(result.mean_dice),
        "dice": None
        if result.dice is None
        else {str(k): number(v) for k, v in sorted(result.dice.items())},
        "folding_percent": 100.0 * float(result.folding_fraction),
        "log_jacobian_std": number(result.log_jacobian_std),
        "ncc": number(result.ncc),
        "refined": result.refinement is not None,
        "preview": bool(preview),
        "network": "" if settings is None else network_text(settings.passes, settings.flips),
        "seconds": seconds,
    }


def check_view_lam(lam: Any) -> float:
    """``lam`` as a float in [0, 1] rounded to 6 decimals (the explorer's cache key).

    Raises:
        InputError: If ``lam`` is not a number in [0, 1] (argument ``lam``).
    """
    try:
        value = float(lam)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(lam, bool) or not 0.0 <= value <= 1.0:
        raise InputError("ViewSession", "{0} must be a number in [0, 1], got {lam!r}", "lam",
                         lam=lam)  # fmt: skip
    return round(value, 6)
