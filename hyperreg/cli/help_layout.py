"""Short, grouped ``--help`` for every subcommand, and the full option reference of
docs/commands.md.

``hyperreg <cmd> --help`` lists each option once, under a group (inputs, outputs, λ and model,
refinement, affine stage, preprocessing, run and device; anything else under "advanced"), with
the first clause of its help text on one line. The full texts (units, file formats, defaults)
are in docs/commands.md, whose "Every option" section :func:`options_reference` writes from the
same parser, so the two cannot disagree on which options exist. Must not import the library at
module level (``hyperreg --help`` stays fast).

Regenerate the reference after adding an option::

    python scripts/write_options_reference.py
"""

from __future__ import annotations

import argparse
import copy
import textwrap

__all__ = [
    "DOCS",
    "END",
    "GROUPS",
    "START",
    "layout_help",
    "options_reference",
    "short_help",
]

DOCS = "docs/commands.md"
START = "<!-- every-option: written by scripts/write_options_reference.py; do not edit -->"
END = "<!-- every-option: end -->"

# group title -> the options it holds, in the order the groups print (an option of a
# subcommand in none of them prints under "advanced")
GROUPS: dict[str, tuple[str, ...]] = {
    "inputs": (
        "--moving",
        "--fixed",
        "--moving-seg",
        "--fixed-seg",
        "--pairs",
        "--data",
        "--holdout",
        "--atlas",
        "--atlas-seg",
        "--fixed-mask",
        "--moving-mask",
        "--contrast",
    ),
    "outputs": (
        "--out",
        "--moved",
        "--warp",
        "--warp-format",
        "--moved-seg",
        "--field-out",
        "--inverse-warp",
        "--affine-out",
        "--figure",
        "--save-fields",
        "--html",
        "--report",
        "--overwrite",
        "--label-names",
    ),
    "λ and model": (
        "--model",
        "--lambda",
        "--lambdas",
        "--passes",
        "--flip-average",
        "--keep-worse",
        "--max-folding",
        "--bracket-rounds",
        "--bracket-points",
    ),
    "refinement": ("--refine", "--refine-sim", "--refine-lr"),
    "affine stage": ("--init", "--initial-affine"),
    "preprocessing": (
        "--no-resample",
        "--normalization",
        "--bias-correct",
        "--replace-nonfinite",
        "--npz-geometry",
    ),
    "run and device": (
        "--help",
        "--device",
        "--seed",
        "--chunk",
        "--amp",
        "--verbose",
        "--no-progress",
        "--port",
        "--host",
        "--no-browser",
        "--debug",
    ),
}
# per command: options whose group differs from GROUPS (warp's --warp is an input; train's
# --init is the model it starts from)
OVERRIDES: dict[str, dict[str, str]] = {
    "warp": {"--warp": "inputs", "--affine": "inputs", "--moved": "outputs"},
    "jacobian": {"--warp": "inputs"},
    "train": {
        "--init": "λ and model",
        **dict.fromkeys(
            (
                "--steps",
                "--sim",
                "--mse-sigma",
                "--lr",
                "--batch-size",
                "--shape",
                "--spacing",
                "--ndim",
                "--synth",
                "--synth-labels",
                "--crop",
                "--resume",
                "--lam-endpoint-fraction",
                "--parametrization",
                "--int-steps",
            ),
            "training",
        ),
        **dict.fromkeys(
            ("--val-every", "--val-lambdas", "--val-fraction", "--test-fraction"), "validation"
        ),
        **dict.fromkeys(("--checkpoint-every", "--keep-checkpoints"), "outputs"),
    },
    "demo": {"--data": "inputs", "--steps": "run and device"},
}
ADVANCED = "advanced"

# one-line helps written for --help where the first clause of the full text would drop a unit or
# a format (STYLE §7); keyed by option, or by (command, option) where commands differ
SHORT: dict[str | tuple[str, str], str] = {
    "--model": "checkpoint (.pt), run folder or bundled name",
    "--lambda": "λ in [0,1], 'auto' or tune.json (default: model's)",
    "--moved": "moved image, NIfTI, fixed grid, moving's units",
    "--warp": "field, NIfTI (I,J,K,3), voxels, fixed affine",
    ("warp", "--warp"): "field to apply, NIfTI (I,J,K,3), voxels",
    ("jacobian", "--warp"): "field, NIfTI (I,J,K,3), voxels",
    "--warp-format": "voxel (default) or itk (mm, LPS: ANTs/SimpleITK)",
    "--affine-out": "affine as ITK .mat/.tfm, LPS mm, fixed->moving",
    "--field-out": "deformable field alone, NIfTI, voxels",
    "--moved-seg": "moved label map, NIfTI, integer ids",
    "--inverse-warp": "inverse field, NIfTI, voxels, as --warp",
    "--figure": "alignment check figure, before and after",
    "--keep-worse": "keep a result that lowered the similarity",
    "--refine": "refinement steps (0 = off; default: the model's)",
    "--flip-average": "mirrored-pair averaging (default: the model's)",
    "--no-resample": "another grid is an error, not resampled",
    "--normalization": "intensity normalisation (default robust)",
    ("sweep", "--lambda"): "a λ to mark: a number, 'auto' or a tune.json",
    ("view", "--lambda"): "λ the page starts at (default: the model's)",
    ("batch", "--lambda"): "λ for rows without one: [0,1], 'auto', tune.json",
    ("warp", "--moved"): "one NIfTI per --moving, on the field's grid",
    "--lambdas": "λ grid: start:stop:count or a comma list",
    ("tune", "--lambdas"): "coarse λ grid: start:stop:count or a list",
    "--overwrite": "redo the pairs --out holds with other settings",
}
# value names shown by --help and docs for options whose dest reads badly (WARP_OUT)
METAVARS = {
    **dict.fromkeys(
        (
            "--moving",
            "--fixed",
            "--moving-seg",
            "--fixed-seg",
            "--moved",
            "--warp",
            "--moved-seg",
            "--inverse-warp",
            "--pairs",
            "--atlas",
            "--atlas-seg",
            "--html",
            "--affine",
            "--fixed-mask",
            "--moving-mask",
            "--labels",
            "--label-names",
            "--resume",
        ),
        "FILE",
    ),
    **dict.fromkeys(
        (
            "--max-labels",
            "--batch-size",
            "--checkpoint-every",
            "--keep-checkpoints",
            "--val-every",
            "--int-steps",
            "--steps",
            "--seed",
        ),
        "N",
    ),
    **dict.fromkeys(("--val-fraction", "--test-fraction"), "FRACTION"),
    **dict.fromkeys(("--bracket-rounds", "--bracket-points", "--chunk"), "N"),
    "--max-folding": "PERCENT",
    "--lambdas": "GRID",
    "--fill": "VALUE",
    "--label-weight": "WEIGHT",
    "--val-lambdas": "LAMBDA",
    "--out": "DIR",
    "--lambda": "LAMBDA",
}


def short_help(text: str, width: int) -> str:
    """The first clause of ``text`` (up to a top-level ``;``, ``.`` or ``:``), cut at a
    top-level ``,``/`` (`` if still wider than ``width`` characters, else at a word (``…``).

    Args:
        text: A help text, ``%`` formats already expanded.
        width: Characters available (at least 20 are used).
    """
    text = " ".join(text.split())
    width = max(width, 20)
    depth, cuts = 0, []
    for index, char in enumerate(text):
        if char in "([{":
            if depth == 0 and index:
                cuts.append(index)
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif depth == 0 and text[index : index + 2] in ("; ", ". ", ": ") and index > 5:
            text = text[:index]
            break
        elif depth == 0 and text[index : index + 2] == ", ":
            cuts.append(index)
    if len(text) <= width:
        return text
    fitting = [cut for cut in cuts if cut <= width]
    if fitting and fitting[-1] >= width // 2:
        return text[: fitting[-1]].rstrip(" ,")
    return text[: width - 1].rsplit(" ", 1)[0] + "…"


class ShortHelpFormatter(argparse.HelpFormatter):
    """Help texts shortened to one line (:func:`short_help`); the help column at 26."""

    def __init__(self, prog: str, **kwargs) -> None:
        kwargs.setdefault("max_help_position", 26)
        super().__init__(prog, **kwargs)

    def _split_lines(self, text: str, width: int) -> list[str]:
        if text in SHORT.values():  # written short: shown whole
            return textwrap.wrap(text, width)
        return [short_help(text, width)]


def _group_of(command: str, action: argparse.Action) -> str:
    override = OVERRIDES.get(command, {})
    for option in action.option_strings:
        if option in override:
            return override[option]
    return next(
        (title for title, opts in GROUPS.items() if set(action.option_strings) & set(opts)),
        ADVANCED,
    )


def _usage(command: str, parser: argparse.ArgumentParser) -> str:
    required = [
        f"{action.option_strings[-1]} {action.metavar or action.dest.upper()}"
        for action in parser._actions
        if action.required and action.option_strings
    ]
    positional = [action.metavar or action.dest for action in parser._positionals._group_actions]
    return " ".join(["%(prog)s", *required, *map(str, positional), "[options]"])


def layout_help(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand of ``parser`` a short usage line, its options in groups
    (:data:`GROUPS`), one-line helps and an epilog naming docs/commands.md. Options already in
    a group of their own stay there; nothing is removed or renamed."""
    for command, sub in _subparsers(parser).items():
        sub.formatter_class = ShortHelpFormatter
        sub.epilog = f"Every option in full (units, formats, defaults, examples): {DOCS}, " + (
            f"section 'hyperreg {command}'."
        )
        moved: dict[str, list[argparse.Action]] = {}
        for action in list(sub._optionals._group_actions):
            if not action.option_strings:
                continue
            moved.setdefault(_group_of(command, action), []).append(action)
            _shorten(command, action)
            sub._optionals._group_actions.remove(action)
        sub.usage = _usage(command, sub)
        order = [*GROUPS, "training", "validation", ADVANCED]
        for title in sorted(moved, key=order.index):
            sub.add_argument_group(title)._group_actions.extend(moved[title])


def _shorten(command: str, action: argparse.Action) -> None:
    """Give ``action`` its :data:`SHORT` help, the full one kept as ``action.full_help``."""
    for option in action.option_strings:
        if (
            option in METAVARS
            and action.metavar is None
            and action.nargs is None
            and (action.choices is None)
        ):
            action.metavar = METAVARS[option]
    for option in action.option_strings:
        short = SHORT.get((command, option), SHORT.get(option))
        if short is not None and action.help:
            action.full_help = action.help  # type: ignore[attr-defined]
            action.help = short
            return


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options_reference(parser: argparse.ArgumentParser) -> str:
    """Markdown: per subcommand, every option with its full help text and default."""
    lines = [
        "## Every option",
        "",
        "Each command's options with their full help text (units, formats, defaults), which "
        "`--help` shortens to one line; the sections above give examples.",
    ]
    full = argparse.HelpFormatter("hyperreg")
    for command, sub in _subparsers(parser).items():
        lines += [
            "",
            f"### hyperreg {command}",
            "",
            f"`{_usage(command, sub) % {'prog': sub.prog}}`",
            "",
        ]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue  # hidden: a former option name that still works
            invocation = full._format_action_invocation(action)
            action = copy.copy(action)
            action.help = getattr(action, "full_help", action.help)
            text = " ".join(full._expand_help(action).split()) if action.help else ""
            lines.append(f"- `{invocation}`: {text}")
    return "\n".join(lines) + "\n"
