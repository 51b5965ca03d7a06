"""Argument helpers shared by every ``hyperreg`` subcommand: the parser class and value types.

Types raise :class:`argparse.ArgumentTypeError`, which argparse turns into one line,
``hyperreg <cmd>: error: argument --flag: …``, and exit code 2. Must not import the library at
module level (``hyperreg --help`` stays fast).
"""

from __future__ import annotations

import argparse
import math

__all__ = [
    "DEVICE_HELP",
    "PROG",
    "Parser",
    "add_common",
    "lambda_list",
    "lambda_value",
    "percent",
    "positive_int",
]

PROG = "hyperreg"
DEVICE_HELP = "auto (CUDA if available), cpu, cuda or cuda:N (default: auto)"


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line: ``hyperreg <cmd>: error: …``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def lambda_value(text: str) -> float:
    """One λ in [0, 1] (``--lambda``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"λ must be a number in [0, 1], got {text!r}") from None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"λ must lie in [0, 1], got {text}")
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


def add_common(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--debug``, which every subcommand takes."""
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def lambda_list(text: str) -> list[float]:
    """A λ grid: ``0:1:11`` (start:stop:count) or ``0.1,0.3,0.5``."""
    from hyperreg.apps.sweep import parse_lambdas

    try:
        return parse_lambdas(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("parse_lambdas(): ", "")) from None


def percent(text: str) -> float:
    """A percentage >= 0 (``--max-folding``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a percentage >= 0, got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a percentage >= 0, got {text}")
    return value
