"""Command line: ``hyperreg {train, register, warp, jacobian, demo, sweep, tune, batch}``.

:mod:`hyperreg.cli.run` holds the parser and :func:`main`; :mod:`hyperreg.cli.args` the argument
helpers every subcommand shares; :mod:`hyperreg.cli.commands` and
:mod:`hyperreg.cli.lambda_commands` the subcommands.
"""

from __future__ import annotations

from hyperreg.cli.run import build_parser, main

__all__ = ["build_parser", "main"]
