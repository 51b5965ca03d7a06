"""The ``hyperreg`` entry point: the parser with every subcommand, and :func:`main`.

Library errors become one line on stderr (``hyperreg <cmd>: error: …``) and exit code 2 (bad
input) or 1 (runtime failure); ``--debug`` re-raises them with the traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from difflib import get_close_matches

from hyperreg.cli import batch_commands, lambda_commands, register_commands, train_commands
from hyperreg.cli import view_commands
from hyperreg.cli.args import PROG, Parser, option_strings, subparser
from hyperreg.cli.help_layout import DOCS, layout_help
from hyperreg._errors import named_by
from hyperreg.cli.messages import LogFormatter, error_text, one_line, options_of

__all__ = ["build_parser", "main"]

# grouped by the user's task: one pair; choosing λ; many pairs; training and models
GROUPS = (register_commands, lambda_commands, view_commands, batch_commands, train_commands)
COMMANDS = {name: command for group in GROUPS for name, command in group.COMMANDS.items()}


def build_parser() -> argparse.ArgumentParser:
    """The ``hyperreg`` argument parser with its subcommands."""
    parser = Parser(
        prog=PROG,
        description="HyperMorph deformable registration of brain MRI at any λ (regularisation "
        "weight) chosen at test time.",
        epilog=f"'hyperreg COMMAND --help' lists a command's options; {DOCS} explains each.",
    )
    from hyperreg import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    for group in GROUPS:  # register, affine, warp, jacobian; sweep, tune; batch, evaluate;
        group.add_parsers(sub)  # train, models, demo
    layout_help(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hyperreg`` command line; returns the exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the subcommand's parser, with the closest options it has
            _unrecognized(subparser(parser, args.command), extra)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    prog = f"{PROG} {args.command}"
    options = options_of(parser, args.command)
    # log lines go to stderr, one line each, while the command runs: hyperreg's from INFO under
    # the command's name, other libraries' (matplotlib's font cache) from WARNING under their
    # logger's name, the root's level left as it is (the handler and level are restored
    # afterwards: main() is also called in-process, from tests and scripts)
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter(prog))
    root, own = logging.getLogger(), logging.getLogger("hyperreg")
    level = own.level
    root.addHandler(handler)
    own.setLevel(logging.INFO)

    def show_warning(message, category, filename, lineno, file=None, line=None):
        print(f"{prog}: warning: {one_line(message)}", file=sys.stderr)

    # warnings print as one line while the command runs; catch_warnings restores the process's
    # own warnings.showwarning afterwards (main() is also called in-process, from tests).
    # what a batch stores for a failed pair names arguments by this command's options
    try:
        with warnings.catch_warnings(), named_by(options.get):
            warnings.showwarning = show_warning
            return _run(args, prog, options)
    finally:
        root.removeHandler(handler)
        own.setLevel(level)


def _unrecognized(command: argparse.ArgumentParser, extra: list[str]) -> None:
    """Exit 2 with ``hyperreg <cmd>: error: unrecognized arguments: …`` and, for an unknown
    option, the options of ``<cmd>`` closest to it."""
    known = option_strings(command)
    close = [m for e in extra if e.startswith("--") for m in get_close_matches(e, known, n=2)]
    hint = f" (did you mean {' or '.join(dict.fromkeys(close))}?)" if close else ""
    command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def _run(args: argparse.Namespace, prog: str, options: dict[str, str]) -> int:
    """Run the command; a library error is one line naming the option that fed its argument
    (:func:`~hyperreg.cli.messages.error_text`)."""
    try:
        return COMMANDS[args.command](args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        if args.debug:
            raise
        print(f"{prog}: error: {error_text(err, options)}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as err:
        if args.debug:
            raise
        print(f"{prog}: error: {error_text(err, options)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's code for SIGINT; files are
        if args.debug:  # written atomically, so none is left half-written
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
