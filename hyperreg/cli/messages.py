"""The wording of what a command prints: library errors by option, log lines, results.

Library errors about one argument carry it as data (:class:`hyperreg._errors.InputError`:
``argument``, and the message as a template over the arguments it names). :func:`options_of`
maps each ``dest`` of a subcommand to its option, and :func:`error_text` names the argument by
that option, ``argument --moving: no such file: 'm.nii.gz'``; any other error, warning and log
line is printed as the library wrote it, on one line. Nothing here parses a message. Must not
import the library (the error class comes in lazily, when a command has failed).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

from hyperreg.cli.args import subparser

__all__ = [
    "LogFormatter",
    "affine_text",
    "error_text",
    "folding_text",
    "mi_text",
    "one_line",
    "options_of",
    "refine_text",
    "verdict_last",
]


def options_of(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """``{dest: option}`` of subcommand ``command``: ``{"moving_seg": "--moving-seg"}``.

    An option's ``dest`` is the name of the library argument it feeds (``--warp`` of
    ``register`` has ``dest="warp_out"``), so an error's ``argument`` finds its option here.
    """
    options: dict[str, str] = {}
    for action in subparser(parser, command)._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and action.dest not in ("help", "debug"):
            options.setdefault(action.dest, longs[0])
    return options


def one_line(text: object) -> str:
    """``text`` on one line (runs of whitespace, newlines included, become one space)."""
    return " ".join(str(text).split())


def error_text(err: BaseException, options: dict[str, str]) -> str:
    """The one-line message of a library error.

    An error that names its argument as data (``argument``, :meth:`describe`) whose argument is
    the ``dest`` of an option reads ``argument --moving: <detail>``, every argument the detail
    names given as its option (or quoted, when no option feeds it). Any other error is its
    message unchanged.
    """
    from hyperreg._errors import InputError

    if isinstance(err, InputError) and err.argument in options:
        return f"argument {options[err.argument]}: {one_line(err.describe(options.get))}"
    return one_line(err)


class LogFormatter(logging.Formatter):
    """``hyperreg <cmd>: <message>``: a log line of hyperreg's as the library wrote it, on one
    line; ``hyperreg <cmd>: warning: <message>`` at level WARNING and above, as warnings print.
    Another library's line is under its own logger's name, never the command's:
    ``matplotlib.font_manager: warning: Matplotlib is building the font cache...``. (A failed
    pair of ``batch`` is logged in the command's option names: :func:`hyperreg.cli.run.main`
    runs the command under :func:`hyperreg._errors.named_by`.)"""

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        level = "warning: " if record.levelno >= logging.WARNING else ""
        ours = record.name == "hyperreg" or record.name.startswith("hyperreg.")
        return f"{self.prog if ours else record.name}: {level}{one_line(record.getMessage())}"


def folding_text(percent: float) -> str:
    """``"folding 0.088 % of voxels (J ≤ 0)"``: how every command prints folding."""
    return f"folding {percent:.3f} % of voxels (J ≤ 0)"


def mi_text(before: float, after: float) -> str:
    """``"Mattes MI -0.1316 -> -0.6261 (ITK's sign: lower is better)"``; ``n/a`` where the
    metric is undefined (a constant image has no intensity histogram to match), never ``nan``."""

    def shown(value: float) -> str:
        return f"{value:.4f}" if math.isfinite(value) else "n/a"

    return f"Mattes MI {shown(before)} -> {shown(after)} (ITK's sign: lower is better)"


def affine_text(init: str, stage: Any) -> str:
    """One line on the affine stage (:class:`~hyperreg.registration.pipeline.AffineStage` or an
    ``AffineTransform`` with ``identity_kept``): its time and MI, and why the identity was kept."""
    if stage.identity_kept:
        return (
            f"{init} stage: {stage.seconds:.1f} s, identity kept (no Mattes MI gain, or a motion "
            f"under 3 voxels: the pair is already aligned; MI {_mi(stage.mi_before)})"
        )
    return f"{init} stage: {stage.seconds:.1f} s, {mi_text(stage.mi_before, stage.mi_after)}"


def _mi(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else "n/a"


def refine_text(stats: Any) -> str:
    """``refined 50 steps in 0.84 s: NCC 0.412 -> 0.468 (loss -0.31 -> -0.36)`` from a result's
    :class:`~hyperreg.registration.pipeline.RefineStats`; '' when not refined (None)."""
    if stats is None or not stats.steps:
        return ""
    names = {"mi": "MI (nats)", "mind": "-MIND distance", "mse": "-MSE/σ²"}
    name = names.get(stats.similarity, "NCC")
    return (
        f"refined {stats.steps} steps in {stats.seconds:.2f} s: "
        f"{name} {stats.similarity_before:.4f} -> {stats.similarity_after:.4f} "
        f"(loss {stats.loss_before:.4f} -> {stats.loss_after:.4f})"
    )


@contextlib.contextmanager
def verdict_last(name: str = "hyperreg.registration.prepared") -> Iterator[None]:
    """Hold back the warnings that logger ``name`` (the pair's verdict, ``check: …``) writes
    inside the block and write them when it ends, after the lines the command printed in it:
    the verdict comes last, whatever the order the stages are reported in."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    logger = logging.getLogger(name)
    logger.addFilter(hold)
    try:
        yield
    finally:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)


def one_map_labels_text(dice: dict[int, float] | None, shared: list[int] | None) -> str | None:
    """The line under a mean Dice whose labels are not all in both maps: how many are in one
    map only (each scores 0 in the mean, hyperreg's convention) and the mean over the labels
    of both maps (the other convention, as voxelmorph and Learn2Reg report); None when every
    label is in both maps or nothing says which are."""
    if not dice or shared is None or len(shared) >= len(dice):
        return None
    both = [dice[label] for label in shared if label in dice]
    scored = [value for value in both if value == value]  # NaN: a label scored nowhere
    mean_both = sum(scored) / len(scored) if scored else float("nan")
    return (
        f"{len(dice) - len(both)} of those labels are in one map only and count 0; over the "
        f"{len(both)} labels both maps hold, mean Dice {mean_both:.4f}"
    )
