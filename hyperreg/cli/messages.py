"""Library messages in the user's words: option names instead of function and argument names.

The library writes its messages for Python callers (STYLE.md §5: ``"<function>(): '<arg>' must
be …"``). On the command line, the user typed options, not arguments, so :class:`UserWords`
rewrites each error, warning and log line that reaches the terminal: it drops the
``function(): `` prefixes, turns a quoted argument name into the option that feeds it
(``'warp_out'`` → ``--warp``), names the option a quoted path came from (``'m.nii.gz'`` →
``--moving 'm.nii.gz'``) and joins the message onto one line. Must not import the library.
"""

from __future__ import annotations

import argparse
import math
import logging
import re
from pathlib import Path
from typing import Any

from hyperreg.cli.args import subparser

__all__ = [
    "ALIASES",
    "LogFormatter",
    "UserWords",
    "affine_text",
    "folding_text",
    "mi_text",
    "refine_text",
]

# library argument name -> the ``dest`` of the option that feeds it
ALIASES = {
    "warp_out": "warp",  # register_files
    "inverse_warp_out": "inverse_warp",  # register_files
    "steps": "refine",  # refine_pair, refine_flow
    "warp_field": "warp",  # warp_file, jacobian_file
    "pairs_csv": "pairs",  # run_batch
    "inverse": "inverse_warp",  # PreparedPair.register
}

_FUNCTION = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\(\): ")
_QUOTED = re.compile(r"'([^'\n]+)'")


class UserWords:
    """Rewrites messages for one parsed subcommand.

    Args:
        parser: The ``hyperreg`` parser (:func:`hyperreg.cli.run.build_parser`); the options of
            the subcommand ``args.command`` give the ``dest`` → option mapping.
        args: The parsed arguments (their path values name the option they came from).
    """

    def __init__(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        self.options: dict[str, str] = {}
        for action in subparser(parser, args.command)._actions:
            longs = [s for s in action.option_strings if s.startswith("--")]
            if longs and action.dest not in ("help", "debug"):
                self.options.setdefault(action.dest, longs[0])
        self.paths: dict[str, str | None] = {}  # path text -> option (None: given to several)
        for dest, option in self.options.items():
            value = getattr(args, dest, None)
            if not isinstance(value, str) or not value:
                continue
            for text in {value, str(Path(value))}:
                known = self.paths.get(text, option)
                self.paths[text] = option if known == option else None

    def option_of(self, argument: str) -> str | None:
        """The option that feeds library argument ``argument`` (through its ``dest``), or None."""
        return self.options.get(ALIASES.get(argument, argument))

    def __call__(self, message: str) -> str:
        """``message`` with option names, without function names, on one line."""
        text = _FUNCTION.sub("", str(message))
        quoted = _QUOTED.findall(text)
        named = {self.options.get(ALIASES.get(q, q)) for q in quoted if q not in self.paths}
        named |= {o for o in self.options.values() if o in text}

        def swap(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in self.paths:  # a path the user gave: say which option, unless named
                option = self.paths[name]
                return (
                    match.group(0)
                    if option is None or option in named
                    else f"{option} {match.group(0)}"
                )
            option = self.options.get(ALIASES.get(name, name))
            return option if option is not None else match.group(0)

        text = _QUOTED.sub(swap, text)
        return " ".join(text.split())


class LogFormatter(logging.Formatter):
    """``hyperreg <cmd>: <message>`` with the message rewritten by ``words``."""

    def __init__(self, prog: str, words: UserWords) -> None:
        super().__init__()
        self.prog = prog
        self.words = words

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.prog}: {self.words(record.getMessage())}"


def folding_text(percent: float) -> str:
    """``"folding 0.088 % of voxels (J ≤ 0)"``: how every command prints folding."""
    return f"folding {percent:.3f} % of voxels (J ≤ 0)"


def mi_text(before: float, after: float) -> str:
    """``"Mattes MI -0.1316 -> -0.6261"``; ``n/a`` where the metric is undefined (a constant
    image has no intensity histogram to match), never ``nan``."""

    def shown(value: float) -> str:
        return f"{value:.4f}" if math.isfinite(value) else "n/a"

    return f"Mattes MI {shown(before)} -> {shown(after)}"


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
    name = "MI (nats)" if stats.similarity == "mi" else "NCC"
    return (
        f"refined {stats.steps} steps in {stats.seconds:.2f} s: "
        f"{name} {stats.similarity_before:.4f} -> {stats.similarity_after:.4f} "
        f"(loss {stats.loss_before:.4f} -> {stats.loss_after:.4f})"
    )
