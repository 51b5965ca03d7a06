"""The ``type=`` callables of ``hyperreg``'s options: each turns one command-line string into a
value (a λ, a count, a fraction, …) or raises :class:`argparse.ArgumentTypeError`, which argparse
turns into one line, ``hyperreg <cmd>: error: argument --flag: …``, and exit code 2.

:mod:`hyperreg.cli.args` re-exports every name here, so subcommands take them from there with
the argument groups. Must not import :mod:`hyperreg.cli.args` (which imports this module) nor
the library at module level (``hyperreg --help`` stays fast).
"""

from __future__ import annotations

import argparse
import math

__all__ = [
    "fill_value",
    "finite_number",
    "fraction",
    "lambda_list",
    "lambda_request",
    "lambda_value",
    "non_negative_int",
    "pass_count",
    "percent",
    "positive_int",
    "refine_steps",
]


def lambda_value(text: str) -> float:
    """One λ in [0, 1] (``--lambda``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"λ must be a number in [0, 1], got {text!r}") from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"λ must lie in [0, 1], got {text}")
    return value


def lambda_request(text: str) -> float | str:
    """``--lambda`` of register, sweep and batch: a λ in [0, 1], ``auto``, or a ``.json`` file
    (the ``tune.json`` of ``hyperreg tune``, returned as its path: ``cli.inputs.tuned_lambda``
    reads it)."""
    if text.strip().lower() == "auto":
        return "auto"
    if text.lower().endswith(".json"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"λ must be a number in [0, 1] or 'auto' (or a tune.json file), got {text!r}"
        ) from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"λ must lie in [0, 1] (or be 'auto'), got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (step counts, sizes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def lambda_list(text: str) -> list[float]:
    """A λ grid: ``0:1:11`` (start:stop:count) or ``0.1,0.3,0.5``."""
    from hyperreg._errors import InputError
    from hyperreg.apps.inputs import parse_lambdas

    try:
        return parse_lambdas(text)
    except InputError as err:  # argparse names the option; the detail says what is wrong
        raise argparse.ArgumentTypeError(err.detail) from None


def fill_value(text: str) -> str | float:
    """``--fill``: ``zero``, ``edge``, ``min`` or a finite number."""
    if text in ("zero", "edge", "min"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be zero, edge, min or a number, got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def finite_number(text: str) -> float:
    """A finite number (``--replace-nonfinite``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1] (``--synth``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


def percent(text: str) -> float:
    """A percentage >= 0 (``--max-folding``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a percentage >= 0, got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a percentage >= 0, got {text}")
    return value


def refine_steps(text: str) -> int:
    """A refinement step count in [0, 10000] (``--refine``)."""
    limit = 10000  # hyperreg.registration.refine.MAX_REFINE_STEPS (not imported: --help stays fast)
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of steps in [0, {limit}], got {text!r}"
        ) from None
    if not 0 <= value <= limit:
        raise argparse.ArgumentTypeError(f"must be a number of steps in [0, {limit}], got {text}")
    return value


def pass_count(text: str) -> int:
    """A number of network passes in [1, 4] (``--passes``)."""
    limit = 4  # hyperreg.registration.passes.MAX_PASSES (not imported: --help stays fast)
    if not text.strip().isdigit() or not 1 <= int(text) <= limit:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {limit}, got {text!r}")
    return int(text)
