"""Command line for training and the models it makes: ``hyperreg {train, models, demo}``.

:func:`add_parsers` adds the subcommands to ``hyperreg``'s parser (:mod:`hyperreg.cli.run`);
:data:`COMMANDS` maps them to their functions. The ``train`` flags and their mapping to the
run's config are in :mod:`hyperreg.cli.train_args`. torch and the library are imported inside
the command functions, so ``hyperreg --help`` is fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.inputs import check_out_folder
from hyperreg.cli.train_args import add_train_parser, train_settings

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``train``, ``models`` and ``demo`` subparsers to ``sub``."""
    add_train_parser(sub)
    _add_models(sub)
    _add_demo(sub)


def _add_models(sub: Any) -> None:
    models = sub.add_parser(
        "models", help="list the bundled pretrained models (used when --model is not given)"
    )
    opts.add_common(models, device=False)


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="register built-in pairs with the bundled model (or train first), report"
    )
    demo.add_argument(
        "--out", default="hyperreg-demo", help="output folder (default hyperreg-demo)"
    )
    demo.add_argument("--data", help="neurite-oasis folder: use real subject pairs instead")
    demo.add_argument(
        "--steps",
        type=opts.non_negative_int,
        default=0,
        help="0 (default): register with the bundled pretrained 2D model, seconds on a CPU; "
        "N: train a new 2D model for N steps first (600 take a few minutes on a CPU)",
    )
    opts.add_common(demo, seed=True)


def _cmd_train(args: argparse.Namespace) -> int:
    import signal
    import sys

    from hyperreg.apps.training import train_model
    from hyperreg.training.checkpointing import TrainingInterrupted

    if not args.out and not args.resume:
        raise ValueError("--out is required (or --resume DIR, which then is the output folder)")
    if args.out:
        check_out_folder(args.out)
    architecture = dict(ndim=args.ndim, int_steps=args.int_steps)
    architecture["parametrization"] = args.parametrization
    try:
        trained = train_model(
            train_settings(args),
            init=args.init,
            resume=args.resume,
            architecture=architecture,
            passes=args.passes,
            flip_average=args.flip_average,
            default_lambda=args.default_lambda,
            default_refine=args.default_refine,
            progress=args.progress,
        )
    except TrainingInterrupted as stop:
        folder = args.out or args.resume
        print(
            f"{opts.PROG} train: {stop}; continue with: hyperreg train --resume {folder} "
            f"--steps {args.steps} (and the same --data)",
            file=sys.stderr,
        )
        return 128 + int(signal.Signals(stop.signal_number))
    _report_trained(trained)
    return 0


def _report_trained(trained: Any) -> None:
    """The new model as ``hyperreg models`` lists one: steps, what was kept, defaults and
    where they come from, card (its file is named once, by the log line before)."""

    def said(text: str) -> str:  # the file is named once, in the log line
        return text.replace(f"'{trained.path}'", "the model")

    steps = f"{trained.steps} steps"
    if trained.init is not None:
        steps += (
            f" fine-tuning {trained.init.name} ({trained.init.total_steps} steps): "
            f"{trained.total_steps} in all"
        )
    print(f"new model: {trained.config.ndim}D, {steps}")
    if trained.kept:
        kept = ", ".join(f"{key} {_plain(value)}" for key, value in trained.kept.items())
        print(f"    kept from {trained.init.name if trained.init else 'the run'}: {kept}")
    print(_defaults_line(trained.default_lambda.lam, trained.default_refine.steps, trained.config))
    print(f"    λ {trained.default_lambda.lam:g}: {said(trained.default_lambda.source)}")
    best = trained.validation_lambda
    if best is not None and best.lam != trained.default_lambda.lam:
        print(
            f"    validation prefers λ {best.lam:g} ({said(best.source)}); --default-lambda "
            "validation records that one"
        )
    print(f"    {said(trained.default_refine.source)}")
    print(f"    model card: {trained.card}")


def _plain(value: Any) -> str:
    """A setting as a user would type it (a grid as 96x112x96)."""
    if isinstance(value, (tuple, list)):
        return "x".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _defaults_line(lam: float | None, refine: int, config: Any) -> str:
    """``    defaults: λ 0.2, refinement 30 steps, passes 2, flip averaging``."""
    text = "none recorded" if lam is None else f"{lam:g}"
    flips = ", flip averaging" if config.flip_average else ""
    return f"    defaults: λ {text}, refinement {refine} steps, passes {config.passes}{flips}"


def _cmd_demo(args: argparse.Namespace) -> int:
    from hyperreg.apps.demo import run_demo

    check_out_folder(args.out)
    report = run_demo(
        args.out, data=args.data, steps=args.steps, seed=args.seed, device=args.device
    )
    print(report)
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from hyperreg.method.model import load_checkpoint
    from hyperreg.pretrained import PRETRAINED_DIR, bundled_models

    models = bundled_models()
    if not models:
        print(f"no bundled models in {PRETRAINED_DIR}")
        return 0
    for m in models:
        size = m.path.stat().st_size / 1e6
        default = ", default" if m.default else ""
        print(f"{m.name}: {m.ndim}D{default}, {size:.1f} MB, {m.path}")
        print(f"    {m.summary}")
        config = load_checkpoint(m.path)[0].config  # the file's passes and flip averaging
        print(_defaults_line(m.default_lambda, m.default_refine, config))
        print(f"    model card: {m.card}")
    return 0


COMMANDS = {"train": _cmd_train, "models": _cmd_models, "demo": _cmd_demo}
