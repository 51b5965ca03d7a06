"""Command line: ``hyperreg <command>``, the commands grouped by the user's task.

:mod:`hyperreg.cli.run` holds the parser and :func:`main`; :mod:`hyperreg.cli.args` the argument
helpers every subcommand shares; :mod:`hyperreg.cli.inputs` and :mod:`hyperreg.cli.messages` the
checks and wording of inputs and results. The subcommands: one pair
(:mod:`~hyperreg.cli.register_commands`: register, affine, warp, jacobian), choosing λ
(:mod:`~hyperreg.cli.lambda_commands`: sweep, tune), many pairs
(:mod:`~hyperreg.cli.batch_commands`: batch, evaluate), training and models
(:mod:`~hyperreg.cli.train_commands`: train, models, demo). No module here loads a checkpoint,
resolves a model or does registration work: each command parses, calls one library function and
prints.
"""

from __future__ import annotations

from hyperreg.cli.run import build_parser, main

__all__ = ["build_parser", "main"]
